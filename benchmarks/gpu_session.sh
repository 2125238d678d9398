#!/usr/bin/env bash
# One device call that checks and measures everything GPU-side; results land in $OUT (JSON + logs).
#   bash benchmarks/gpu_session.sh [quick]
# Each step has its own time limit so one slow step cannot eat the whole lease.
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT="${OUT:-./gpu-results}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv | tee "$OUT/gpu.txt"
timeout 240 python3 -m pytest -q -x tests/kernels tests/test_ops.py tests/runtime -k "not aot and not every_variant_compiles and not parallel" \
    2>&1 | tail -5 | tee "$OUT/pytest.txt"
timeout 100 python3 benchmarks/probes/step_profile.py --out "$OUT/step_profile.json" > "$OUT/step_profile.log" 2>&1
grep -A6 "==" "$OUT/step_profile.log"
timeout 240 python3 benchmarks/e2e_runner.py --out "$OUT/e2e_runner.json" > "$OUT/e2e_runner.log" 2>&1
tail -8 "$OUT/e2e_runner.log"
[ "${1:-}" = quick ] && exit 0
timeout 150 python3 benchmarks/nvfp4_linear.py --skip-correctness --ms 1 2 4 8 16 32 64 256 1024 4096 \
    --out "$OUT/nvfp4_linear.json" > "$OUT/nvfp4_linear.log" 2>&1; tail -3 "$OUT/nvfp4_linear.log"
timeout 120 python3 benchmarks/fp8_linear.py --ms 1 2 4 8 16 32 1024 4096 --out "$OUT/fp8_linear.json" \
    > "$OUT/fp8_linear.log" 2>&1; tail -3 "$OUT/fp8_linear.log"
timeout 200 python3 -m anyfp4 bench --random-weights llama-3.1-8b --format nvfp4 --compare bf16 --compile \
    --prompt-len 128 --gen-len 64 --json > "$OUT/bench_llama8b_nvfp4_compile.json" 2> "$OUT/bench_compile.err"
tail -2 "$OUT/bench_compile.err"
timeout 120 python3 benchmarks/speculative_runner.py --out "$OUT/speculative.json" > "$OUT/speculative.log" 2>&1
tail -4 "$OUT/speculative.log"
if [ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
    timeout 60 torchrun --nproc-per-node 2 benchmarks/probes/allreduce_probe.py --out "$OUT/allreduce.json" \
        > "$OUT/allreduce.log" 2>&1
    timeout 120 python3 -m anyfp4 bench --random-weights llama-3.1-8b --format nvfp4 --tp 2 --json \
        > "$OUT/bench_tp2.json" 2> "$OUT/bench_tp2.err"
    ANYFP4_PREFILL=chunked timeout 200 python3 benchmarks/tp_runner.py --out "$OUT/tp_agreement.json" \
        > "$OUT/tp_runner.log" 2>&1  # chunked prefill: two GPUs should give one GPU's SHA-256
    tail -3 "$OUT/tp_runner.log"
fi
