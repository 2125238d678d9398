"""Do consecutive CUDA decode kernels overlap under programmatic dependent launch, and by how much? A chain of calls
(each on its own rotated weight copy, M = 1) captured in a CUDA graph and replayed, profiled (torch.profiler, CUPTI
kernel records),
with ``ANYFP4_EARLY_LAUNCH`` on and off: per call its kernel's duration and the gap from the previous kernel's end to
its start (negative: the two ran at the same time).

    PYTHONPATH=src python benchmarks/probes/launch_overlap.py --out launch_overlap.json [--shapes 4096x4096 ...]
        [--calls 20]

2026-12-02, H200 (results/launch_overlap_h200.json, graph replays): with early launch every kernel starts ~10-43 us
before the previous one ends (each waits at griddepcontrol.wait), yet the chain's time per call barely moves
(4096x4096 7.72 vs 7.95 us, 28672x8192 40.9 vs 40.3): the kernels overlap, the time after the wait does not shrink.
The analysis (``chain_summary``) is a pure function of (start, end) intervals, tested on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

KERNEL_PREFIX = "anyfp4_weight_mma"
ROTATE_BYTES = 256 * 1024**2


def chain_summary(intervals: list[tuple[float, float]]) -> dict:
    """(start, end) of consecutive kernels (us, any origin) -> median duration, median gap (next start - previous
    end; negative when they overlap), the share of calls that overlapped the previous one, and the chain's time
    per call (first start to last end over the count)."""
    if len(intervals) < 2:
        raise ValueError("a chain needs at least two kernels")
    ordered = sorted(intervals)
    durations = [e - s for s, e in ordered]
    gaps = [b[0] - a[1] for a, b in zip(ordered, ordered[1:])]
    return {"calls": len(ordered), "median_duration_us": statistics.median(durations),
            "median_gap_us": statistics.median(gaps), "overlapping": sum(g < 0 for g in gaps) / len(gaps),
            "per_call_us": (ordered[-1][1] - ordered[0][0]) / len(ordered)}


def profiled_chain(n: int, k: int, calls: int, device) -> list[tuple[float, float]]:
    """Kernel intervals (us) of ``calls`` back-to-back M = 1 NVFP4 calls over rotated weight copies."""
    from torch.profiler import ProfilerActivity, profile

    from anyfp4.bench.random_weights import random_nvfp4
    from anyfp4.packing.nvfp4 import prepack_nvfp4

    copies = max(2, min(calls, ROTATE_BYTES // (n * k * 9 // 16)))
    ps = [prepack_nvfp4(random_nvfp4(n, k, device)) for _ in range(copies)]
    x = torch.randn(1, k, device=device, dtype=torch.bfloat16)

    def chain():
        for i in range(calls):
            p = ps[i % copies]
            torch.ops.anyfp4.nvfp4_linear(x, p.codes, p.scales, p.global_scale, None, p.out_features, p.in_features)

    chain()  # compiled and loaded
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()  # replayed as a decode step is: launched eagerly, the host sets the pace
    with torch.cuda.graph(graph):
        chain()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CUDA" and e.name.startswith(KERNEL_PREFIX)]
    return [(e.time_range.start, e.time_range.end) for e in events]


def main() -> None:
    import anyfp4.ops  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="launch_overlap.json")
    ap.add_argument("--shapes", nargs="+", default=["4096x4096", "14336x4096", "4096x14336", "28672x8192"])
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    device = torch.device("cuda")
    rows = []
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        for early in ("1", "0"):
            os.environ["ANYFP4_EARLY_LAUNCH"] = early
            intervals = profiled_chain(n, k, args.calls, device)
            row = {"n": n, "k": k, "early_launch": early == "1", **chain_summary(intervals)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
