"""The served decode kernel against variants of its source (extra #defines, e.g. ``ACC2=1``: two sets of sums, so two
chains of dependent mmas), the launch table's config for each layer, in one run: time per call over CUDA-graph
replays of rotated weight copies (early launch as served), and how far each variant's output is from the served
kernel's.

    PYTHONPATH=src python benchmarks/probes/source_variants.py --variants ACC2=1 --out source_variants.json \\
        [--layers nvfp4:28672x8192 nvfp4:gated:17408x5120] [--ms 1 4]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from anyfp4.bench.timing import graph_seconds
from anyfp4.dispatch.tuning import mma_config
from anyfp4.kernels.cuda import nvrtc
from anyfp4.kernels.cuda.weight_mma import KERNEL, STAGE_BYTES, planned, source_text
from kernel_counters import layer

LAYERS = ("nvfp4:28672x8192", "nvfp4:gated:17408x5120", "nvfp4:5120x17408", "fp8:12288x5120", "nvfp4:4096x4096")


def main() -> None:
    import anyfp4.ops  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="+", default=list(LAYERS), help="format[:gated]:NxK")
    ap.add_argument("--variants", nargs="+", default=["ACC2=1"], help="NAME=VALUE[,NAME=VALUE...]")
    ap.add_argument("--ms", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="source_variants.json")
    args = ap.parse_args()
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    sm, sms, dev = props.major * 10 + props.minor, props.multi_processor_count, torch.cuda.current_device()
    variants = {"served": {}, **{v: {n: int(x) for n, x in (kv.split("=") for kv in v.split(","))}
                                  for v in args.variants}}
    gen = torch.Generator(device=device).manual_seed(0)
    report = {"gpu": torch.cuda.get_device_name(), "commit": args.commit, "rows": []}
    for spec in args.layers:
        fmt, gated, n, k, copies, nbytes, k_pad = layer(spec, device, gen)
        nv = fmt == "nvfp4"
        for m in args.ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            cfg = mma_config(sm, sms, fmt, gated, n, k, k_pad, m)
            plans = [planned(fmt, x, w.codes, w.scales if nv else None, w.global_scale if nv else w.scales, None,
                             w.out_features, w.up_offset, cfg, None, None) for w in copies]
            outs, smem = {}, min(STAGE_BYTES, nvrtc.max_shared_memory(dev) - 1024)
            for name, extra in variants.items():
                kernels = [nvrtc.load(source_text(), KERNEL, {**p.defines, **extra}, dev, shared_memory=smem)
                           for p, _, _ in plans]

                def call(i, kernels=kernels):
                    plan, _, early = plans[i % len(plans)]
                    kernels[i % len(plans)].launch(plan.grid, plan.threads, plan.shared_bytes, plan.args, early=early)

                us = graph_seconds(call, reps=len(plans)) * 1e6
                call(0)
                outs[name] = plans[0][0].out.float().clone()
                diff = (outs[name] - outs["served"]).abs().max().item()
                row = {"layer": spec, "m": m, "cfg": cfg.__dict__, "variant": name, "us": us,
                       "tbps": nbytes / us / 1e6, "max_abs_diff_vs_served": diff}
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
        copies = plans = None
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
