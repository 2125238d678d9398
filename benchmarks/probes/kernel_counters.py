"""The CUDA decode kernel's hardware counters on a few shapes at M = 1, for Nsight Compute: which pipe, stall or
memory limit binds NVFP4 where FP8 of the same bytes streams faster (H200 scoreboard: 28672x8192 NVFP4 ~3.1 TB/s,
FP8 62080x5120 ~4.1 TB/s).

    ncu --clock-control none --kernel-name anyfp4_weight_mma --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        --section SchedulerStats --section LaunchStats --section InstructionStats \\
        python benchmarks/probes/kernel_counters.py --format nvfp4 --shape 28672x8192

Runs the op three times on one random weight (the third launch is the one to profile: the first two compile and
warm up), then prints its time per call over CUDA-graph replays of rotated copies, for the report beside the
counters.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import torch

from anyfp4.bench.random_weights import random_fp8, random_nvfp4
from anyfp4.bench.timing import graph_seconds
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated

ROTATE_BYTES = 512 * 1024**2


def make(fmt: str, n: int, k: int, gated: bool, device, gen):
    if fmt == "nvfp4":
        w = lambda: random_nvfp4(n, k, device, generator=gen)  # noqa: E731
        return prepack_nvfp4_gated(w(), w()) if gated else prepack_nvfp4(w())
    w = lambda: random_fp8(n, k, device, generator=gen, per_channel=True)  # noqa: E731
    return prepack_fp8_gated(w(), w()) if gated else prepack_fp8(w())


class Layer(NamedTuple):
    """A probe's layer from ``format[:gated]:NxK``: rotated prepack copies of random weights (together over
    ROTATE_BYTES, so graph replays read them from DRAM), their bytes each, and K padded to the prepack."""
    fmt: str
    gated: bool
    n: int
    k: int
    copies: list
    nbytes: int
    k_pad: int


def layer(spec: str, device, gen) -> Layer:
    fmt, *rest = spec.split(":")
    gated = rest[0] == "gated"
    n, k = (int(v) for v in rest[-1].split("x"))
    copies = [make(fmt, n, k, gated, device, gen)]
    nbytes = sum(t.numel() * t.element_size() for t in (copies[0].codes, copies[0].scales))
    copies += [make(fmt, n, k, gated, device, gen) for _ in range(max(1, ROTATE_BYTES // nbytes) - 1)]
    return Layer(fmt, gated, n, k, copies, nbytes, copies[0].codes.shape[1] * (8 if fmt == "nvfp4" else 4))


class Probe(NamedTuple):
    """A layer probe's GPU: its sm and multiprocessors, a seeded generator, and the report it starts (GPU, commit, copy
    bandwidth in TB/s, printed), its rows under ``layers``."""
    device: torch.device
    sm: int
    sms: int
    gen: torch.Generator
    report: dict


def probe(commit: str) -> Probe:
    from anyfp4.bench.timing import copy_bandwidth

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    report = {"gpu": torch.cuda.get_device_name(), "commit": commit, "copy_tbps": copy_bandwidth(device) / 1e12,
              "layers": []}
    print(f"copy {report['copy_tbps']:.2f} TB/s", flush=True)
    return Probe(device, props.major * 10 + props.minor, props.multi_processor_count,
                 torch.Generator(device=device).manual_seed(0), report)


def call(fmt: str, x, p, gated: bool):
    ops = torch.ops.anyfp4
    if fmt == "nvfp4":
        if gated:
            return ops.nvfp4_gated(x, p.codes, p.scales, p.global_scale, p.up_offset, p.out_features, p.in_features)
        return ops.nvfp4_linear(x, p.codes, p.scales, p.global_scale, None, p.out_features, p.in_features)
    if gated:
        return ops.fp8_gated(x, p.codes, p.scales, p.up_offset, p.out_features, p.in_features)
    return ops.fp8_linear(x, p.codes, p.scales, None, p.out_features, p.in_features)


def main() -> None:
    import anyfp4.ops  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=("nvfp4", "fp8"), default="nvfp4")
    ap.add_argument("--shape", default="28672x8192", help="N x K (gated: each half's N)")
    ap.add_argument("--gated", action="store_true")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--time", action="store_true", help="also time graph replays over rotated copies")
    args = ap.parse_args()
    n, k = (int(v) for v in args.shape.split("x"))
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    p = make(args.format, n, k, args.gated, device, gen)
    x = torch.randn(args.m, k, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        call(args.format, x, p, args.gated)
    torch.cuda.synchronize()
    if args.time:
        nbytes = sum(t.numel() * t.element_size() for t in (p.codes, p.scales))
        copies = [p] + [make(args.format, n, k, args.gated, device, gen)
                        for _ in range(max(1, ROTATE_BYTES // nbytes) - 1)]
        us = graph_seconds(lambda i: call(args.format, x, copies[i % len(copies)], args.gated), reps=len(copies)) * 1e6
        print(f"{args.format} {'gated ' if args.gated else ''}{n}x{k} M={args.m}: {us:.2f} us, "
              f"{nbytes / us / 1e6:.2f} TB/s")


if __name__ == "__main__":
    main()
