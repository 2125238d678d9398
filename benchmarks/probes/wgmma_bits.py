"""Where the decode kernel's warpgroup mmas give other sums than mma.sync on a GPU: every launch of a grid of K, M,
K slices, row tiles, ring depths and ``wgmma`` modes run twice and against the mma.sync launch of the same config
(float32 sums), and its first and last rows against the same row alone. Prints and records only the launches that
differ (NaN, run to run, from mma.sync or from the row alone) and the configs the launcher refuses.

    PYTHONPATH=src python benchmarks/probes/wgmma_bits.py --out wgmma_bits.json [--ks 896 1024 14336] [--ms 8 32]

On an H100 (2026-12-07) ``wgmma = 2`` with 16 K slices of seven steps (K = 14336) gave NaN sums that changed from
run to run; the launcher now refuses ``wgmma = 2`` with split-K, so the grid here asks whether a single slice of an
odd step count (K = 896, 1152) fails too.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

import torch

from anyfp4.bench.random_weights import random_nvfp4
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.kernels.cuda.weight_mma import nvfp4_mma_gemm
from anyfp4.packing.nvfp4 import prepack_nvfp4


def main() -> None:
    import anyfp4.ops  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--ks", nargs="+", type=int, default=[896, 1152, 14336])
    ap.add_argument("--ms", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--splits", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--depths", nargs="+", type=int, default=[2])
    ap.add_argument("--out", default="wgmma_bits.json")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(7)
    report = {"gpu": torch.cuda.get_device_name(), "launches": 0, "differ": [], "refused": []}
    for k in args.ks:
        w = prepack_nvfp4(random_nvfp4(args.n, k, "cpu", gen), "cuda")
        for m in args.ms:
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
            for split, mt, depth, wg in itertools.product(args.splits, (1, 2), args.depths, (1, 2)):
                cfg = MMAConfig(mt=mt, warps=8, split_k=split, depth=depth, wgmma=wg)
                case = {"k": k, "m": m, **cfg.__dict__}
                try:
                    a = nvfp4_mma_gemm(x, w, None, cfg, out_dtype=torch.float32)
                except ValueError as e:
                    report["refused"].append({**case, "why": str(e)[:160]})
                    continue
                b = nvfp4_mma_gemm(x, w, None, cfg, out_dtype=torch.float32)
                sync = nvfp4_mma_gemm(x, w, None, replace(cfg, wgmma=0), out_dtype=torch.float32)
                rows = [torch.equal(nvfp4_mma_gemm(x[i:i + 1], w, None, replace(cfg, wgmma=0),
                                                   out_dtype=torch.float32)[0], a[i]) for i in {0, m - 1}]
                report["launches"] += 1
                checks = {"nan": bool(a.isnan().any()), "repeats": torch.equal(a, b),
                          "as_mma_sync": torch.equal(a, sync), "rows_as_alone": all(rows)}
                if checks["nan"] or not all(v for key, v in checks.items() if key != "nan"):
                    report["differ"].append({**case, **checks})
                    print("differs:", {**case, **checks}, flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{report['launches']} launches, {len(report['differ'])} differ, {len(report['refused'])} refused")


if __name__ == "__main__":
    main()
