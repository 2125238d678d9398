"""The decode kernel with warpgroup mmas (``MMAConfig.wgmma``, sm_90: the activations read by the tensor cores from
shared memory, no B fragment loads) against the launch table's mma.sync config, per layer and M, with bf16
``F.linear`` in the same run: each config's time per call (CUDA-graph replays of rotated weight copies, early launch
as served) and whether its float32 sums equal the mma.sync launch's with the same K slices.

    PYTHONPATH=src python benchmarks/probes/wgmma.py --out wgmma.json [--layers nvfp4:14336x4096 ...] [--ms 1 8 32]
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import replace
from pathlib import Path

import torch

from anyfp4.bench.timing import graph_seconds
from anyfp4.dispatch.tuning import mma_config
from anyfp4.kernels.cuda.weight_mma import fp8_mma_gemm, nvfp4_mma_gemm
from anyfp4.kernels.cuda.weight_mma_geometry import k_slices
from kernel_counters import layer, probe

LAYERS = ("nvfp4:14336x4096", "nvfp4:4096x14336", "nvfp4:28672x8192", "nvfp4:gated:14336x4096", "nvfp4:4096x4096",
          "fp8:14336x4096")


def main() -> None:
    import anyfp4.ops  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), help="format[:gated]:NxK")
    ap.add_argument("--ms", nargs="+", type=int, default=[1, 8, 16, 32, 64])
    ap.add_argument("--warps", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--depths", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--mts", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="wgmma.json")
    args = ap.parse_args()
    device, sm, sms, gen, report = probe(args.commit)
    for spec in args.layers:
        fmt, gated, n, k, copies, nbytes, k_pad = layer(spec, device, gen)
        kernel = nvfp4_mma_gemm if fmt == "nvfp4" else fp8_mma_gemm
        dense = [torch.randn(n * (2 if gated else 1), k, dtype=torch.bfloat16, device=device)
                 for _ in range(max(2, len(copies) // 4))]
        for m in args.ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            bf16_us = graph_seconds(lambda i: torch.nn.functional.linear(x, dense[i % len(dense)]),
                                    reps=len(dense)) * 1e6
            table = mma_config(sm, sms, fmt, gated, n, k, k_pad, m)
            slices = k_slices(table)

            def timed(cfg):
                try:
                    us = graph_seconds(lambda i: kernel(x, copies[i % len(copies)], None, cfg),
                                       reps=len(copies))
                except ValueError as e:  # a launch the kernel refuses (shared memory, row tiles)
                    return {"cfg": cfg.__dict__, "refused": str(e)}
                return {"cfg": cfg.__dict__, "us": us * 1e6, "tbps": nbytes / us / 1e12}

            base = timed(table)
            rows = []
            # the table's K slices as split-K blocks (one K warp), every warpgroup shape
            for w, d, mt, wg in itertools.product(args.warps, args.depths, args.mts, (1, 2)):
                rows.append(timed(replace(table, mt=mt, warps=w, depth=d, kw=1, split_k=slices, shared_ring=0,
                                          wgmma=wg)))
            ran = [r for r in rows if "us" in r]
            if not ran:
                print(f"{spec} m={m}: no warpgroup launch ran ({rows[0].get('refused')})", flush=True)
                continue
            best = min(ran, key=lambda r: r["us"])
            cfg = replace(table, **best["cfg"])
            od = None if gated else torch.float32  # the float32 sums where the kernel gives them
            best["same_as_mma_sync"] = torch.equal(kernel(x, copies[0], None, cfg, out_dtype=od),
                                                   kernel(x, copies[0], None, replace(cfg, wgmma=0), out_dtype=od))
            print(f"{spec} m={m}: bf16 {bf16_us:.2f} us | table {table} {base.get('us', float('nan')):.2f} us "
                  f"({bf16_us / base.get('us', float('nan')):.2f}x bf16) | wgmma best {best['cfg']} {best['us']:.2f}"
                  f" us ({bf16_us / best['us']:.2f}x bf16, {best['tbps']:.2f} TB/s) | same sums as mma.sync "
                  f"{best['same_as_mma_sync']}", flush=True)
            report["layers"].append({"layer": spec, "m": m, "bytes": nbytes, "bf16_us": bf16_us, "table": base,
                                     "rows": rows})
        copies = dense = None
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
