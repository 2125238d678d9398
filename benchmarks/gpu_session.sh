#!/usr/bin/env bash
# GPU-side checks and measurements in stages, each fitting one device call (<= 10 minutes); results land in
# $OUT (JSON + logs), key lines on stdout.
#   bash benchmarks/gpu_session.sh check     # the GPU-side tests of the CUDA kernel, W8A8, kernels/ and ops/
#   bash benchmarks/gpu_session.sh older     # the CUDA kernel's sm_70 / sm_75 variants run on this GPU, speculation
#                                            # on every decode-kernel path
#   bash benchmarks/gpu_session.sh check2    # the GPU-side tests of runtime/, dispatch/, parallel/, packing/, bench/
#   bash benchmarks/gpu_session.sh kernels   # nvfp4_linear / fp8_linear tables (incl. fused / W8A8 prefill columns)
#   bash benchmarks/gpu_session.sh bench     # anyfp4 bench: NVFP4 and FP8 vs bf16, random Llama-3.1-8B
#   bash benchmarks/gpu_session.sh sweep     # launch-config sweeps of the CUDA kernel (the launch table's source)
#   bash benchmarks/gpu_session.sh runner    # e2e_runner, step profile, speculative decoding
#   bash benchmarks/gpu_session.sh tp        # two GPUs: all-reduce probe, bench --tp 2, TP1/TP2 agreement
#   bash benchmarks/gpu_session.sh moe       # mixtures of experts: GPU tests, random Qwen3-30B-A3B NVFP4 vs bf16,
#                                            # the grouped expert launches alone (kernels/experts.py; SWEEP=1:
#                                            # launch configs), step profile, batch 16, FP8
#   bash benchmarks/gpu_session.sh hybrid    # Qwen3.5-27B hybrid: GPU tests, bench vs bf16, MTP, rejected drafts,
#                                            # step profile, Gated DeltaNet prefill: torch, recurrent, chunked
#   TOKENIZER=DIR bash benchmarks/gpu_session.sh serve  # anyfp4 serve --max-batch 16: 16 clients vs the runner's
#                                            # batch and `bench --batch 16` (needs the serve extra's wheels)
#   TOKENIZER=DIR bash benchmarks/gpu_session.sh h200  # on an H200: serve (512 tokens), then the hybrid mixed vs bf16
#   bash benchmarks/gpu_session.sh early     # every kernel of a step launched early: its GPU tests, then bench with
#                                            # ANYFP4_EARLY_LAUNCH=1 / 0 (and BEFORE=DIR: a src/ tree to compare)
#   bash benchmarks/gpu_session.sh batch     # a left-padded batch's rows against each prompt alone (probes/batch_rows.py),
#                                            # its GPU tests, and with TOKENIZER=DIR the serve stage (chunked prefill)
#   bash benchmarks/gpu_session.sh prefill   # prefill kernels by rows and shape (probes/prefill_modes.py), then bench
#                                            # prompts of 48-2048 tokens with ANYFP4_PREFILL=auto (default) and cublas
#   bash benchmarks/gpu_session.sh fused     # the fused Triton prefill GEMM's tile configs (probes/fused_configs.py),
#                                            # then a short prompt's prefill profiled (probes/prefill_profile.py)
#   bash benchmarks/gpu_session.sh chain     # a dependent kernel chain's floor, and the decode kernel's chain with
#                                            # parts of its source cut out (probes/chain_floor.py, chain_anatomy.py)
#   bash benchmarks/gpu_session.sh counters  # Nsight Compute on the decode kernel at M = 1 (probes/kernel_counters.py):
#                                            # NVFP4 and FP8 of large shapes, pipes, stalls, occupancy, DRAM
#   bash benchmarks/gpu_session.sh ring      # the shared-memory ring (MMAConfig.shared_ring): its GPU tests, the
#                                            # table's configs against shared rings (probes/shared_ring.py)
#   bash benchmarks/gpu_session.sh wgmma     # the decode kernel's warpgroup mmas: GPU tests, against mma.sync and bf16
#   bash benchmarks/gpu_session.sh wgmmabench # the table's wgmma entries end to end: bench --batch 8 / 16, 7 drafts,
#                                            # against the entries before them (same sha256 expected)
#   bash benchmarks/gpu_session.sh fusedswap # the fused prefill GEMM, decoded tile as wgmma's register operand
#   BEFORE=DIR bash benchmarks/gpu_session.sh gemvab # GEMV chunks, glue kernels' loads first: against a tree before
#   bash benchmarks/gpu_session.sh ringsweep # a sweep with shared rings (SHAPES, GATED, MS), then bench (ARCH, FORMAT)
#                                            # with it as ANYFP4_MMA_TABLE and with the built-in table
# Each step has its own time limit so one slow step cannot eat the whole lease.
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT="${OUT:-./gpu-results}"; mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
stage="${1:-check}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader | tee "$OUT/gpu-$stage.txt"
bench() {  # name, then anyfp4 bench arguments
    local name="$1"; shift
    timeout 200 python3 -m anyfp4 bench --random-weights llama-3.1-8b --json "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); rs=r if isinstance(r, list) else [r]
[print(x['model'], 'decode', round(x['decode_tok_s'], 1), 'tok/s', round(x['pct_of_copy'] or 0), '% of copy, prefill',
       round(x['prefill_tok_s']), 'tok/s, sha', x['sha256'][:16]) for x in rs]" "$OUT/$name.json" 2>/dev/null \
        || tail -3 "$OUT/$name.err"
}
q35() {  # name, then anyfp4 bench arguments
    local name="$1"; shift
    timeout 200 python3 -m anyfp4 bench --random-weights qwen3.5-27b --json "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); rs=r if isinstance(r, list) else [r]
[print(x['model'], 'decode', round(x['decode_tok_s'], 1), 'tok/s, prefill', round(x['prefill_tok_s']), 'tok/s, sha',
   x['sha256'][:16], x.get('speculative', '')) for x in rs]" "$OUT/$name.json" 2>/dev/null || tail -3 "$OUT/$name.err"
}
case "$stage" in
check)
    # the CUDA kernel and the W8A8 prefill first (the newest GPU code), then kernels/ and ops/; -rfE names each
    # failure in the tail (H200, 2026-12-02: ~260 s for the first, the rest ~300 s over both stages)
    timeout 280 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/cuda/test_weight_mma.py \
        tests/kernels/test_fp8_w8a8.py -k "not every_variant_compiles and not older_architectures" 2>&1 | tail -12 \
        | tee "$OUT/pytest_cuda.txt"
    timeout 280 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels tests/ops -k "not aot and not \
        every_variant_compiles and not test_weight_mma and not w8a8" 2>&1 | tail -12 | tee "$OUT/pytest.txt"
    ;;
older)
    # sm_70's and sm_75's variants of the CUDA kernel compiled for this GPU, against the reference (H100,
    # 2026-12-05: 219 s), through the ops with this GPU dispatched as a V100 / T4 (37 s), and speculation refusing
    # the Triton kernels; then the speculative runner over every decode-kernel path (~90 s)
    timeout 400 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/cuda/test_weight_mma.py \
        tests/ops/test_older_variants_on_the_gpu.py tests/runtime/test_cuda_graph.py \
        -k "older_architectures or older_variants or refuses" 2>&1 | tail -12 | tee "$OUT/pytest_older.txt"
    timeout 180 python3 benchmarks/runners/speculative_runner.py --gen-len 64 --out "$OUT/speculative_paths.json" \
        2>&1 | grep -v "^ *verify" | tail -20
    ;;
check2)
    # CPU-only tests run here too (the device's torch is another version than CI's), the hybrid ones in `hybrid`
    timeout 560 python3 -m pytest -q -rfE -p no:cacheprovider tests/runtime tests/dispatch tests/parallel \
        tests/packing tests/bench -k "not aot and not test_hybrid_on_the_gpu" 2>&1 | tail -15 | tee "$OUT/pytest2.txt"
    ;;
kernels)
    timeout 300 python3 benchmarks/kernels/nvfp4_linear.py --skip-correctness --ms 1 2 4 8 16 32 64 256 1024 4096 \
        --out "$OUT/nvfp4_linear.json" > "$OUT/nvfp4_linear.log" 2>&1
    grep -E "M=(1|8|16|32|1024) |gated|correct" "$OUT/nvfp4_linear.log" | head -70
    timeout 240 python3 benchmarks/kernels/fp8_linear.py --ms 1 2 4 8 16 32 1024 4096 --out "$OUT/fp8_linear.json" \
        > "$OUT/fp8_linear.log" 2>&1; grep -E "M=(1|8|16|32|1024) |check" "$OUT/fp8_linear.log" | head -50
    ;;
bench)
    bench bench_llama8b_nvfp4 --format nvfp4 --compare bf16
    bench bench_llama8b_fp8 --format fp8
    bench bench_llama8b_nvfp4_quantized_head --format nvfp4 --quantized-lm-head
    ;;
sweep)
    timeout 560 python3 benchmarks/probes/mma_sweep.py --skip-check --formats ${FORMATS:-nvfp4 fp8} \
        --shapes ${SHAPES:-14336x4096 4096x14336 28672x8192 6144x4096 4096x4096} --gated ${GATED-14336x4096} \
        --ms ${MS:-1 8 16 32} --out "$OUT/mma_sweep.json" 2>&1 | grep -v "^  " | tail -60
    ;;
runner)
    timeout 100 python3 benchmarks/probes/step_profile.py --out "$OUT/step_profile.json" > "$OUT/step_profile.log" 2>&1
    grep -A6 "==" "$OUT/step_profile.log"
    timeout 300 python3 benchmarks/runners/e2e_runner.py --out "$OUT/e2e_runner.json" > "$OUT/e2e_runner.log" 2>&1
    tail -8 "$OUT/e2e_runner.log"
    timeout 150 python3 benchmarks/runners/speculative_runner.py --out "$OUT/speculative.json" > "$OUT/speculative.log" 2>&1
    tail -4 "$OUT/speculative.log"
    ;;
tp)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
    timeout 60 torchrun --nproc-per-node 2 benchmarks/probes/allreduce_probe.py --out "$OUT/allreduce.json" \
        > "$OUT/allreduce.log" 2>&1
    bench bench_llama8b_nvfp4_tp1 --format nvfp4
    bench bench_llama8b_nvfp4_tp2 --format nvfp4 --tp 2
    ANYFP4_TP_LM_HEAD=vocab bench bench_llama8b_nvfp4_tp2_vocab_head --format nvfp4 --tp 2
    ANYFP4_PREFILL=chunked timeout 240 python3 benchmarks/runners/tp_runner.py --out "$OUT/tp_agreement.json" \
        > "$OUT/tp_runner.log" 2>&1  # chunked prefill: two GPUs should give one GPU's SHA-256
    tail -3 "$OUT/tp_runner.log"
    ;;
hybrid)
    timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/runtime/test_hybrid_on_the_gpu.py tests/kernels/gdn \
        tests/kernels/glue/test_small_attention.py tests/kernels/triton/test_dense_gemv.py tests/ops/test_gdn_ops.py \
        tests/runtime/test_cuda_graph.py 2>&1 | tail -12 | tee "$OUT/pytest_hybrid.txt"
    q35 bench_q35_mixed_vs_bf16 --format mixed --compare bf16
    q35 bench_q35_mixed_mtp --format mixed --speculate mtp --draft-tokens 3
    timeout 150 python3 benchmarks/probes/rejected_rows.py --arch qwen3.5-27b --format mixed --mtp --out "$OUT/rejected_rows.json"
    timeout 150 python3 benchmarks/probes/speculative_step.py --arch qwen3.5-27b --format mixed --mtp --k 3 \
        --out "$OUT/speculative_step.json"
    timeout 100 python3 benchmarks/probes/step_profile.py --arch qwen3.5-27b --formats mixed --out "$OUT/step_profile_q35.json" \
        > "$OUT/step_profile_q35.log" 2>&1; grep -A12 "==" "$OUT/step_profile_q35.log" | cut -c1-120
    timeout 150 python3 benchmarks/kernels/gdn_prefill.py ${COMMIT:+--commit $COMMIT} --out "$OUT/gdn_prefill.json" 2>&1 \
        | tail -6
    for mode in torch recurrent chunked; do
        ANYFP4_GDN_PREFILL=$mode q35 bench_q35_prefill_$mode --format mixed --prompt-len 2048 --gen-len 16
    done
    ;;
h200)
    # the must-shows that ask for an H200, in one call: anyfp4 serve's 16 clients (TOKENIZER, MAX_TOKENS as the serve
    # stage), then the Qwen3.5-27B hybrid mixed against bf16 at batch 1
    MAX_TOKENS=${MAX_TOKENS:-512} bash "$0" serve
    q35 bench_q35_mixed_vs_bf16 --format mixed --compare bf16
    ;;
serve)
    # a machine without a registry: the serve extra's wheels carried in .whl/ (pip download --no-deps for its Python:
    # fastapi, starlette, uvicorn, pydantic, pydantic-core, annotated-types, typing-inspection, and opentelemetry-api
    # for fastapi 0.165), installed beside the image's packages; MAX_TOKENS: each reply's length (default 128)
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/serve-site .whl/*.whl 2>&1 | tail -2
        export PYTHONPATH="/tmp/serve-site:$PYTHONPATH"
    fi
    tokenizer="$(realpath "${TOKENIZER:?a tokenizer directory}")"
    # a row's bits independent of the batch's other prompts need ANYFP4_PREFILL=chunked (README); the texts are
    # compared with each request served alone
    (cd benchmarks/runners && ANYFP4_PREFILL=${ANYFP4_PREFILL:-chunked} timeout 300 python3 serve_gpu.py \
        --tokenizer "$tokenizer" --max-tokens "${MAX_TOKENS:-128}" --bench ${COMMIT:+--commit $COMMIT} \
        --out "$OUT/serve_gpu.json" 2>&1 | tail -16)
    ;;
early)
    timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider tests/runtime/test_cuda_graph.py \
        tests/runtime/test_hybrid_on_the_gpu.py tests/kernels/glue tests/kernels/gdn -k "not aot" 2>&1 | tail -12 \
        | tee "$OUT/pytest_early.txt"
    bench bench_llama8b_nvfp4_early --format nvfp4 --compare bf16
    ANYFP4_EARLY_LAUNCH=0 bench bench_llama8b_nvfp4_early_off --format nvfp4
    if [ -n "${BEFORE:-}" ]; then PYTHONPATH="$BEFORE" bench bench_llama8b_nvfp4_before --format nvfp4; fi
    bench bench_llama8b_nvfp4_early_again --format nvfp4
    ;;
gemvab)
    # the float GEMV's four chunks a pass (kernels/triton/dense_gemv.py; the Qwen3.5 b / a projections in the
    # convolution's launch) and the glue kernels' loads issued before their sums (norms, delta rule,
    # merge), against the tree before them: their GPU tests, then BEFORE=DIR, its src/ (e.g. `mkdir -p before &&
    # git archive 122f2a6 src | tar -x -C before`, then BEFORE=before/src), alternated twice, the same sha256
    # expected; then the step profile (at 122f2a6 on an H200: convolution 5.8 us a launch, add_rms_norm 2.5, delta
    # rule 3.5, gated norm 1.2)
    timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/glue tests/kernels/gdn \
        tests/kernels/triton/test_dense_gemv.py -k "not aot" 2>&1 | tail -4 | tee "$OUT/pytest_gemvab.txt"
    for round in 1 2; do
        q35 bench_q35_mixed_gemv4_$round --format mixed
        PYTHONPATH="$(realpath "${BEFORE:?a src/ tree of the commit before}")" q35 bench_q35_mixed_before_$round \
            --format mixed
    done
    timeout 100 python3 benchmarks/probes/step_profile.py --arch qwen3.5-27b --formats mixed \
        --out "$OUT/step_profile_q35.json" > "$OUT/step_profile_q35.log" 2>&1
    grep -A8 "==" "$OUT/step_profile_q35.log" | cut -c1-120
    ;;
batch)
    # a left-padded batch's rows against each prompt alone: module by module (prefill and eager decode steps), the
    # texts, the GPU tests that ask it, then anyfp4 serve --max-batch 16 (needs TOKENIZER and the serve wheels)
    timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/runtime/test_cuda_graph.py \
        tests/kernels/glue/test_small_attention.py -k "left_padded or key_start" 2>&1 | tail -4 | tee "$OUT/pytest_batch.txt"
    ANYFP4_PREFILL=chunked timeout 200 python3 benchmarks/probes/batch_rows.py --out "$OUT/batch_rows_chunked.json" \
        2>&1 | grep -v Warn | tail -3 | cut -c1-2000
    if [ -n "${TOKENIZER:-}" ]; then ANYFP4_PREFILL=chunked bash "$0" serve; fi
    ;;
moe)
    # mixtures of experts: the grouped expert launches (CUDA and Triton), routing and weighted sum, graph == eager;
    # random Qwen3-30B-A3B NVFP4 against bf16 at batch 1, the grouped launches alone (every arm; SWEEP=1: launch
    # configs too), the step profile, then batch 16 and FP8
    timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/runtime/test_experts.py \
        tests/kernels/cuda/test_grouped_experts.py tests/kernels/triton/test_route_topk.py \
        tests/kernels/triton/test_weighted_slots.py tests/kernels/triton/test_nvfp4_experts.py \
        tests/kernels/triton/test_fp8_experts.py tests/kernels/triton/test_dense_experts.py 2>&1 | tail -6 \
        | tee "$OUT/pytest_moe.txt"
    moe_bench() {  # batch, then anyfp4 bench arguments
        local batch="$1"; shift
        timeout 200 python3 -m anyfp4 bench --random-weights qwen3-30b-a3b --batch $batch --json "$@" \
            > "$OUT/bench_moe_b$batch$SUFFIX.json" 2> "$OUT/bench_moe_b$batch$SUFFIX.err"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); rs=r if isinstance(r, list) else [r]
[print(x['model'], 'batch', x['batch'], 'decode', round(x['decode_tok_s'], 1), 'tok/s', round(x['pct_of_copy'] or 0),
       '% of copy, sha', x['sha256'][:16]) for x in rs]" "$OUT/bench_moe_b$batch$SUFFIX.json" 2>/dev/null \
            || tail -3 "$OUT/bench_moe_b$batch$SUFFIX.err"
    }
    SUFFIX= moe_bench 1 --format nvfp4 --compare bf16
    ANYFP4_EXPERTS_EARLY=1 SUFFIX=_early moe_bench 1 --format nvfp4  # the grouped launches early (same sha256)
    timeout 200 python3 benchmarks/kernels/experts.py --batch 1 16 --formats nvfp4 nvfp4-triton fp8 fp8-triton bf16 \
        ${SWEEP:+--sweep} ${COMMIT:+--commit $COMMIT} --out "$OUT/experts.json" 2>&1 | grep -v "^\[" | tail -50
    timeout 100 python3 benchmarks/probes/step_profile.py --arch qwen3-30b-a3b --formats nvfp4 \
        --out "$OUT/step_profile_moe.json" > "$OUT/step_profile_moe.log" 2>&1
    grep -A16 "==" "$OUT/step_profile_moe.log" | cut -c1-120
    SUFFIX= moe_bench 16 --format nvfp4 --compare bf16
    SUFFIX=_fp8 moe_bench 1 --format fp8
    ;;
counters)
    # one profiled launch per shape (ncu replays it per section: caches flushed, clocks left alone), then its
    # time over graph replays of rotated copies; the full reports in $OUT/ncu_*.txt
    # SPECS: "format NxK [probe arguments: --gated, --m M]" entries separated by ';'
    IFS=';' read -ra specs <<< "${SPECS:-nvfp4 28672x8192;fp8 28672x8192;nvfp4 28672x8192 --m 32;nvfp4 17408x5120 --gated}"
    for spec in "${specs[@]}"; do
        set -- $spec; name="ncu_$(echo "$spec" | tr -c 'a-z0-9x\n' '_' | tr -s '_')"
        # the sections first; the stall and pipe metrics by name in a second pass (a name this ncu lacks then costs
        # only that pass)
        profile() { timeout 120 ncu --clock-control none --kernel-name anyfp4_weight_mma --launch-skip 2 \
            --launch-count 1 "$@" python3 benchmarks/probes/kernel_counters.py --format $fmt --shape $shape $extra; }
        fmt=$1 shape=$2 extra="${*:3}"
        profile --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
            --section Occupancy --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
            > "$OUT/$name.txt" 2>&1
        profile --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,\
regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active" >> "$OUT/$name.txt" 2>&1
        echo "== $spec"; grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Executed Ipc A|Issue Slots Busy|\
Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit Reg|Grid Size|Block Size|Waves Per SM|\
One or More Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued)" "$OUT/$name.txt" | sed 's/  */ /g'
        grep -E "stalled_.*ratio|pipe_.*pct" "$OUT/$name.txt" | awk '$NF+0 > 0.05' | sed 's/  */ /g' | sort -k3 -n -r | head -14
        timeout 60 python3 benchmarks/probes/kernel_counters.py --format $1 --shape $2 "${@:3}" --time 2>&1 | tail -1
    done
    ;;
ring)
    timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/cuda/test_weight_mma.py -k "shared_ring" \
        2>&1 | tail -3 | tee "$OUT/pytest_ring.txt"
    (cd benchmarks/probes && timeout 240 python3 shared_ring.py ${COMMIT:+--commit $COMMIT} --out "$OUT/shared_ring.json" \
        2>&1 | grep -v Warn)
    ;;
ringsweep)
    # a sweep with shared rings (SHAPES / GATED: NxK lists, default Qwen3.5-27B's NVFP4 layers; MS: the M buckets),
    # then bench with it as ANYFP4_MMA_TABLE against the built-in table (ARCH: bench's --random-weights, FORMAT)
    timeout ${SWEEP_S:-300} python3 benchmarks/probes/mma_sweep.py --skip-check --shared-ring --ms ${MS:-1 4} --formats nvfp4 \
        --shapes ${SHAPES-5120x17408} --gated ${GATED-17408x5120} --out "$OUT/sweep_ring.json" 2>&1 \
        | grep -E "m=|copy"
    for table in "$OUT/sweep_ring.json" ""; do
        ANYFP4_MMA_TABLE="$table" timeout 200 python3 -m anyfp4 bench --random-weights ${ARCH:-qwen3.5-27b} --json \
            --format ${FORMAT:-mixed} > "$OUT/bench_ring${table:+_swept}.json" 2> "$OUT/bench_ring${table:+_swept}.err"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1])); r=r if isinstance(r, list) else [r]
[print(x['model'], 'decode', round(x['decode_tok_s'], 1), 'sha', x['sha256'][:16]) for x in r]" \
            "$OUT/bench_ring${table:+_swept}.json" || tail -3 "$OUT/bench_ring${table:+_swept}.err"
    done
    ;;
wgmma)
    # the decode kernel's warpgroup mmas (MMAConfig.wgmma): their GPU tests (bits against mma.sync), then each layer
    # and M against the table's mma.sync config and bf16 (probes/wgmma.py; LAYERS, MS)
    timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/cuda/test_weight_mma_wgmma.py 2>&1 \
        | tail -4 | tee "$OUT/pytest_wgmma.txt"
    (cd benchmarks/probes && timeout ${SWEEP_S:-300} python3 wgmma.py ${COMMIT:+--commit $COMMIT} \
        ${LAYERS:+--layers $LAYERS} ${MS:+--ms $MS} --out "$OUT/wgmma.json" 2>&1 | grep -v Warn)
    timeout 150 python3 benchmarks/probes/wgmma_bits.py --out "$OUT/wgmma_bits.json" 2>&1 | grep -v Warn | tail -12
    ;;
wgmmabench)
    # the launch table's warpgroup-mma entries end to end: random Llama-3.1-8B NVFP4 at batch 8 and 16 and with 7
    # n-gram drafts (verify M = 8), the built-in table against its entries before them (ANYFP4_MMA_TABLE, results/
    # cuda_mma_sm90_before_wgmma.json), alternated; each pair's sha256 must match (wgmma 1 adds as mma.sync does)
    before="$PWD/benchmarks/results/cuda_mma_sm90_before_wgmma.json"
    for round in 1 2; do
        for b in 8 16; do
            bench bench_llama8b_nvfp4_b${b}_wgmma_$round --format nvfp4 --batch $b
            ANYFP4_MMA_TABLE="$before" bench bench_llama8b_nvfp4_b${b}_before_$round --format nvfp4 --batch $b
        done
    done
    bench bench_llama8b_nvfp4_ngram7_wgmma --format nvfp4 --speculate ngram --draft-tokens 7
    ANYFP4_MMA_TABLE="$before" bench bench_llama8b_nvfp4_ngram7_before --format nvfp4 --speculate ngram --draft-tokens 7
    ;;
fusedswap)
    # the fused prefill GEMM with the decoded tile as wgmma's register operand (FusedConfig.swap_ab): its GPU tests,
    # then the swapped tiles against the unswapped and bf16 (SHAPES, MS)
    timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/triton/test_nvfp4_kernels.py \
        -k "fused or every_code" 2>&1 | tail -3 | tee "$OUT/pytest_fusedswap.txt"
    timeout ${SWEEP_S:-200} python3 benchmarks/probes/fused_configs.py --budget-s $(( ${SWEEP_S:-200} - 40 )) \
        ${COMMIT:+--commit $COMMIT} --shapes ${SHAPES:-14336x4096 4096x14336 28672x4096:gated} --ms ${MS:-128 256 1024} \
        --configs 128x128x128/w8/s3/k1 64x64x128/w4/s3/k1 128x128x128/w8/s3/k1/swap 128x128x128/w4/s3/k1/swap \
        64x128x128/w4/s3/k1/swap 256x128x128/w8/s2/k1/swap --out "$OUT/fused_swap.json" 2>&1 | grep "M="
    ;;
prefill)
    # each prefill mode against bf16 per shape and M (H100, 2026-12-06: ~100 s), then whole prompts (bench times each
    # prefill five times, the median)
    timeout 300 python3 benchmarks/probes/prefill_modes.py --budget-s 240 ${COMMIT:+--commit $COMMIT} \
        --out "$OUT/prefill_modes.json" 2>&1 | grep -v Warn | tail -60
    for p in 48 128 512 2048; do
        bench bench_prefill_${p}_auto --format nvfp4 --compare bf16 --prompt-len $p --gen-len 16
        ANYFP4_PREFILL=cublas bench bench_prefill_${p}_cublas --format nvfp4 --prompt-len $p --gen-len 16
    done
    ;;
fused)
    # NVFP4's fused Triton prefill GEMM: its tile configs by shape and M against bf16, then where a short prompt's
    # prefill time goes (wall against kernel time, the host's functions)
    timeout 300 python3 benchmarks/probes/fused_configs.py --budget-s 240 ${COMMIT:+--commit $COMMIT} \
        --out "$OUT/fused_configs.json" 2>&1 | grep -v Warn | tail -40
    timeout 200 python3 benchmarks/probes/prefill_profile.py --formats nvfp4 bf16 --prompts 48 128 \
        --out "$OUT/prefill_profile.json" 2>&1 | grep -v Warn | head -80
    ;;
chain)
    timeout 120 python3 benchmarks/probes/chain_floor.py --out "$OUT/chain_floor.json" 2>&1 | tail -20
    timeout 420 python3 benchmarks/probes/chain_anatomy.py --out "$OUT/chain_anatomy.json" 2>&1 | grep -v Warn \
        | cut -c1-160 | tail -60
    ;;
*)
    echo "unknown stage $stage (check, older, check2, kernels, bench, sweep, runner, tp, hybrid, serve, early, batch, moe,"\
        "prefill, fused, chain)"; exit 2
    ;;
esac
