#!/usr/bin/env bash
# A/B of the launch table's register budgets (MMAConfig.min_blocks) on the H200: anyfp4 bench with the table, and
# with an ANYFP4_MMA_TABLE giving the same entries without a budget (same K slices: the greedy SHA-256 must match);
# then the scoreboard's NVFP4 and bf16 rows of the two budgeted shapes. Results under $OUT.
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT="${OUT:-./gpu-results}"; mkdir -p "$OUT"
python3 -c "import json; json.dump({'sm': 90, 'sweep': [{'format': 'nvfp4', 'k': 4096, 'n': n, 'm': 1, 'best_cfg':
    {'mt': 1, 'warps': 8, 'split_k': 8, 'depth': 2, 'kw': 1}} for n in (4096, 6144)]}, open('$OUT/no_budget.json', 'w'))"
for arm in table no_budget table_again; do
    table=""; [ "$arm" = no_budget ] && table="$OUT/no_budget.json"
    ANYFP4_MMA_TABLE="$table" timeout 100 python3 -m anyfp4 bench --random-weights llama-3.1-8b --format nvfp4 --json \
        > "$OUT/bench_$arm.json" 2> "$OUT/bench_$arm.err"
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); r=r[0] if isinstance(r, list) else r
print(sys.argv[2], round(r['decode_tok_s'], 1), 'tok/s, sha', r['sha256'][:16])" "$OUT/bench_$arm.json" "$arm" \
        || tail -3 "$OUT/bench_$arm.err"
done
timeout 120 python3 benchmarks/kernels/scoreboard.py --out "$OUT/decode_budget.json" --shapes 4096x4096 6144x4096 \
    --ms 1 8 --arms bf16 anyfp4-nvfp4 --skip-e2e --budget-s 90 2>&1 | tail -8
