"""The decode kernel with its ring of code words in shared memory (``MMAConfig.shared_ring``: cp.async, no registers
held by the bytes in flight) against the launch table's register-ring config, per layer at M = 1 and 4: each config's
time per call (CUDA-graph replays of rotated weight copies, early launch as served), blocks a multiprocessor holds,
and whether its output equals the register ring's with the same K slices (it must: the same sums in the same order).

    PYTHONPATH=src python benchmarks/probes/shared_ring.py --out shared_ring.json [--layers nvfp4:28672x8192 ...]
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
from kernel_counters import layer, probe
from wave_fit import occupancy

LAYERS = ("nvfp4:28672x8192", "nvfp4:gated:17408x5120", "nvfp4:5120x17408", "fp8:12288x5120", "nvfp4:4096x4096",
          "nvfp4:6144x4096")


def main() -> None:
    import anyfp4.ops  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), help="format[:gated]:NxK")
    ap.add_argument("--ms", nargs="+", type=int, default=[1])
    ap.add_argument("--warps", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--depths", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--splits", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="shared_ring.json")
    args = ap.parse_args()
    device, sm, sms, gen, report = probe(args.commit)
    for spec in args.layers:
        fmt, gated, n, k, copies, nbytes, k_pad = layer(spec, device, gen)
        kernel = nvfp4_mma_gemm if fmt == "nvfp4" else fp8_mma_gemm
        for m in args.ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            table = mma_config(sm, sms, fmt, gated, n, k, k_pad, m)
            rows = []

            def timed(cfg):
                try:
                    grid, per_sm = occupancy(fmt, x, copies[0], cfg)
                    us = graph_seconds(lambda i: kernel(x, copies[i % len(copies)], None, cfg), reps=len(copies))
                except ValueError as e:  # a launch the kernel refuses (shared memory, K warps)
                    return None, str(e)
                return {"cfg": cfg.__dict__, "grid": grid, "blocks_per_sm": per_sm, "us": us * 1e6,
                        "tbps": nbytes / us / 1e12}, None

            base, _ = timed(table)
            base["what"] = "table"
            rows.append(base)
            as_ring, _ = timed(replace(table, shared_ring=1))  # the table's config, its ring moved to shared memory
            if as_ring is not None:
                as_ring["what"] = "table as shared ring"
                rows.append(as_ring)
            for w, d, sl in itertools.product(args.warps, args.depths, args.splits):
                row, _ = timed(replace(table, mt=1, warps=w, depth=d, split_k=sl, kw=1, shared_ring=1))
                if row is not None:
                    rows.append(row)
            if len(rows) == 1:
                print(f"{spec} m={m}: no shared ring fits", flush=True)
                continue
            best = min(rows[1:], key=lambda r: r["us"])
            od = None if gated else torch.float32  # the float32 sums where the kernel gives them
            for row in {id(r): r for r in (as_ring, best) if r is not None}.values():
                cfg = replace(table, **row["cfg"])
                row["same_as_register_ring"] = torch.equal(
                    kernel(x, copies[0], None, cfg, out_dtype=od),
                    kernel(x, copies[0], None, replace(cfg, shared_ring=0), out_dtype=od))
            print(f"{spec} m={m}: table {table} {base['us']:.2f} us ({base['tbps']:.2f} TB/s, {base['blocks_per_sm']}/SM)"
                  f" | shared ring best {best['cfg']} {best['us']:.2f} us ({best['tbps']:.2f} TB/s, "
                  f"{best['blocks_per_sm']}/SM) | table as shared ring "
                  f"{as_ring['us'] if as_ring else float('nan'):.2f} | same sums as the register ring "
                  f"{all(r.get('same_as_register_ring', True) for r in rows)}", flush=True)
            report["layers"].append({"layer": spec, "m": m, "bytes": nbytes, "rows": rows})
        copies = None
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
