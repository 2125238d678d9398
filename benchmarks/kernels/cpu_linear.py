"""The CPU kernels against bf16 ``F.linear`` (oneDNN) on one thread, weights from DRAM and from cache, one run.

    PYTHONPATH=src python benchmarks/kernels/cpu_linear.py --out benchmarks/results/cpu_linear.json
        [--shapes 576x576 3072x576 ...] [--ms 1 6 32] [--threads 1]

Per N x K and M: anyfp4's NVFP4 and FP8 ops (``torch.ops.anyfp4.*``, bf16 activations, so NVFP4 takes the bf16 dot
products where the CPU has them) and bf16 ``F.linear``, each timed twice — ``cold``: a call per weight copy over
copies of ``--rotate-mib`` in all (several times the last-level cache, as a model's layers are read in a decode
step), ``hot``: one weight called over and over (in L2) — best of ``--trials`` passes. Reports us per call, the
weight bytes' rate and x bf16 (cold). Random weights of real shapes (``bench.random_weights``); the C kernels'
paths (``kernels.cpu.linear.features``) and the commit are recorded.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

import anyfp4.ops  # noqa: F401  (registers the ops)
from anyfp4.bench.random_weights import random_bf16, random_fp8, random_nvfp4
from anyfp4.kernels.cpu.linear import features, library
from anyfp4.packing.fp8 import prepack_fp8
from anyfp4.packing.nvfp4 import prepack_nvfp4

SHAPES = ["576x576", "960x576", "3072x576", "576x1536", "4096x4096", "6144x4096", "4096x14336"]


def weight_bytes(arm: str, n: int, k: int) -> int:
    return {"nvfp4": n * k // 2 + n * k // 16, "fp8": n * k, "bf16": 2 * n * k}[arm]


def copies_of(arm: str, n: int, k: int, rotate_bytes: int, gen: torch.Generator) -> list:
    count = max(2, rotate_bytes // weight_bytes(arm, n, k))
    if arm == "nvfp4":
        return [prepack_nvfp4(random_nvfp4(n, k, "cpu", gen)) for _ in range(count)]
    if arm == "fp8":
        return [prepack_fp8(random_fp8(n, k, "cpu", gen, per_channel=True)) for _ in range(count)]
    return [random_bf16(n, k, "cpu", gen) for _ in range(count)]


def call(arm: str, x: torch.Tensor, w) -> torch.Tensor:
    if arm == "nvfp4":
        return torch.ops.anyfp4.nvfp4_linear(x, w.codes, w.scales, w.global_scale, None, w.out_features,
                                             w.in_features)
    if arm == "fp8":
        return torch.ops.anyfp4.fp8_linear(x, w.codes, w.scales, None, w.out_features, w.in_features)
    return torch.nn.functional.linear(x, w)


def best_us(arm: str, x: torch.Tensor, weights: list, trials: int) -> float:
    call(arm, x, weights[0])
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for w in weights:
            call(arm, x, w)
        best = min(best, (time.perf_counter() - t0) / len(weights))
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="cpu_linear.json")
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--ms", nargs="+", type=int, default=[1, 6, 32])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rotate-mib", type=int, default=256)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lib = library()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    report = {"cpu": platform.processor() or platform.machine(), "cores": torch.get_num_threads(), "commit": commit,
              "date": time.strftime("%Y-%m-%d"), "c_kernels": features(lib) if lib is not None else None,
              "rotate_bytes": args.rotate_mib * 1024**2, "rows": []}
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for shape in args.shapes:
            n, k = map(int, shape.split("x"))
            weights = {arm: copies_of(arm, n, k, args.rotate_mib * 1024**2, gen) for arm in ("nvfp4", "fp8", "bf16")}
            for m in args.ms:
                x = torch.randn(m, k, generator=gen).bfloat16()
                row = {}
                for arm, ws in weights.items():
                    cold = best_us(arm, x, ws, args.trials)
                    hot = best_us(arm, x, ws[:1] * min(len(ws), 64), args.trials)
                    row[arm] = cold
                    report["rows"].append({"arm": arm, "n": n, "k": k, "m": m, "cold_us": cold, "hot_us": hot,
                                           "cold_GBps": weight_bytes(arm, n, k) / cold / 1e3})
                print(f"{n}x{k} M={m}: cold us nvfp4 {row['nvfp4']:.1f} ({row['bf16'] / row['nvfp4']:.2f}x bf16), "
                      f"fp8 {row['fp8']:.1f} ({row['bf16'] / row['fp8']:.2f}x), bf16 {row['bf16']:.1f}", flush=True)
            del weights
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
