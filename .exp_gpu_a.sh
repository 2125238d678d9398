set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tail -1
timeout 200 python3 -m pytest -q -x tests/kernels tests/test_ops.py -k "not aot and not every_variant_compiles" 2>&1 | tail -4 | tee $OUT/pytest.txt
timeout 200 python benchmarks/probes/mma_sweep.py --skip-check --formats fp8 --out $OUT/mma_sweep_fp8.json 2>&1 | tail -62
