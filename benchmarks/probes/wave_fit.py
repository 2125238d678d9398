"""Whether the CUDA decode kernel's time at M = 1 follows how its blocks fill the GPU's waves: for a few layers, the
launch table's config (mt, warps, depth, K warps) at many split-K counts, each with its grid, the blocks a
multiprocessor holds (the driver's occupancy calculator), the waves that makes (grid / (SMs x blocks per SM)) and
the time per call (CUDA-graph replays of rotated weight copies). If a launch's last, partly filled wave is what keeps
a layer from the bandwidth, times drop where the waves come out just under a whole number.

    PYTHONPATH=src python benchmarks/probes/wave_fit.py --out wave_fit.json \\
        [--layers nvfp4:5120x17408 nvfp4:gated:17408x5120] [--splits 1 2 3 4 6 8 12 16]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from anyfp4.bench.timing import copy_bandwidth, graph_seconds
from anyfp4.dispatch.tuning import mma_config
from anyfp4.kernels.cuda.weight_mma import fp8_mma_gemm, nvfp4_mma_gemm, planned
from kernel_counters import layer

LAYERS = ("nvfp4:5120x17408", "nvfp4:gated:17408x5120", "fp8:12288x5120", "fp8:5120x4096", "nvfp4:28672x8192",
          "nvfp4:4096x4096")
SPLITS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 13, 16, 20, 24, 32)


def occupancy(fmt: str, x: torch.Tensor, w, cfg) -> tuple[int, int]:
    """(blocks of the grid, blocks a multiprocessor holds) of ``cfg``'s launch over x and the prepack w."""
    nv = fmt == "nvfp4"
    plan, kernel, _ = planned(fmt, x, w.codes, w.scales if nv else None, w.global_scale if nv else w.scales, None,
                              w.out_features, w.up_offset, cfg, None, None)
    return plan.grid[0] * plan.grid[1] * plan.grid[2], kernel.blocks_per_sm(plan.threads, plan.shared_bytes)


def main() -> None:
    import anyfp4.ops  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), help="format[:gated]:NxK")
    ap.add_argument("--splits", nargs="+", type=int, default=list(SPLITS))
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="wave_fit.json")
    args = ap.parse_args()
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    sm, sms = props.major * 10 + props.minor, props.multi_processor_count
    gen = torch.Generator(device=device).manual_seed(0)
    report = {"gpu": torch.cuda.get_device_name(), "commit": args.commit, "sms": sms,
              "copy_tbps": copy_bandwidth(device) / 1e12, "layers": []}
    for spec in args.layers:
        fmt, gated, n, k, copies, nbytes, k_pad = layer(spec, device, gen)
        x = torch.randn(1, k, dtype=torch.bfloat16, device=device)
        kernel = nvfp4_mma_gemm if fmt == "nvfp4" else fp8_mma_gemm
        base = mma_config(sm, sms, fmt, gated, n, k, k_pad, 1)
        rows = []
        for split in [0, *args.splits]:  # 0: the table's config as it is
            # every count as split-K alone (K warps need powers of two)
            cfg = base if split == 0 else replace(base, split_k=split, kw=1)
            try:
                grid, per_sm = occupancy(fmt, x, copies[0], cfg)
                us = graph_seconds(lambda i: kernel(x, copies[i % len(copies)], None, cfg), reps=len(copies)) * 1e6
            except ValueError as e:
                print(f"{spec} {cfg}: {e}")
                continue
            waves = grid / (sms * per_sm)
            rows.append({"cfg": cfg.__dict__, "grid": grid, "blocks_per_sm": per_sm, "waves": waves, "us": us,
                         "tbps": nbytes / us / 1e6})
            print(f"{spec} slices {split or 'table':>5} {cfg}: grid {grid:5d}, {per_sm}/SM, {waves:5.2f} waves: {us:7.2f} us "
                  f"{nbytes / us / 1e6:.2f} TB/s", flush=True)
        report["layers"].append({"layer": spec, "bytes": nbytes, "table_cfg": base.__dict__, "rows": rows})
        Path(args.out).write_text(json.dumps(report, indent=1))
        copies = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
