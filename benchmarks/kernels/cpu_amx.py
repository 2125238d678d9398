"""The CPU kernels' bf16 rows on AMX tiles against the same kernels built without them (the bf16 dot products), one
run, one thread, weights from DRAM (copies rotated over more than the last-level cache), best of ``--trials``.

    PYTHONPATH=src python benchmarks/kernels/cpu_amx.py --out benchmarks/results/cpu_amx.json
        [--shapes 576x576 3072x576 ...] [--ms 1 4 16 64]

Needs a CPU with AMX tiles (else both builds run the dot products and the run says so). Each (shape, M, format)
row: us per call of each build and their ratio; the commit and the builds' ``features`` are recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import anyfp4.ops  # noqa: F401  (registers the ops)
from anyfp4.bench.random_weights import random_fp8, random_nvfp4
from anyfp4.kernels.cpu import linear as cpu_linear
from anyfp4.packing.fp8 import prepack_fp8
from anyfp4.packing.nvfp4 import prepack_nvfp4

SHAPES = ["576x576", "3072x576", "576x1536", "4096x4096"]
ROTATE_BYTES = 256 << 20


def builds(tmp: Path) -> dict:
    cc = cpu_linear._compiler()
    if cc is None or cpu_linear.library() is None:
        raise SystemExit("cpu_amx: no C compiler builds the CPU kernels")
    no_amx = cpu_linear._build(cc, tmp, ("-DWEIGHT_CPU_NO_AMX",))
    return {"amx": cpu_linear.library(), "dot_products": cpu_linear.open_library(no_amx)}


def best_us(lib, fmt: str, x: torch.Tensor, weights: list, trials: int) -> float:
    run = (lambda w: cpu_linear.nvfp4_rows(lib, x, w, (0,), 1.0)) if fmt == "nvfp4" else \
        (lambda w: cpu_linear.fp8_rows(lib, x, w, (0,), True))
    run(weights[0])
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for w in weights:
            run(w)
        best = min(best, (time.perf_counter() - t0) / len(weights) * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="cpu_amx.json")
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        libs = builds(Path(tmp))
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        result = {"cpu": cpu_linear.cpu_model(), "commit": commit,
                  "date": time.strftime("%Y-%m-%d"), "features": {k: cpu_linear.features(v) for k, v in libs.items()},
                  "threads": 1, "rows": []}
        for shape in args.shapes:
            n, k = map(int, shape.split("x"))
            weights = {"nvfp4": [prepack_nvfp4(random_nvfp4(n, k, "cpu", gen))
                                 for _ in range(max(2, min(64, ROTATE_BYTES // (n * k // 2))))],
                       "fp8": [prepack_fp8(random_fp8(n, k, "cpu", gen, per_channel=True))
                               for _ in range(max(2, min(32, ROTATE_BYTES // (n * k))))]}
            for m in args.ms:
                x = torch.randn(m, k, generator=gen).bfloat16()
                for fmt, copies in weights.items():
                    us = {name: best_us(lib, fmt, x, copies, args.trials) for name, lib in libs.items()}
                    row = {"format": fmt, "n": n, "k": k, "m": m, **{f"{b}_us": v for b, v in us.items()},
                           "dot_products_over_amx": us["dot_products"] / us["amx"]}
                    result["rows"].append(row)
                    print(f"{shape} M={m} {fmt}: amx {us['amx']:.0f} us, dot products {us['dot_products']:.0f} us "
                          f"({row['dot_products_over_amx']:.2f}x)", flush=True)
                Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
