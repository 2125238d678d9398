"""What the per-call fixed cost of the NVFP4 decode kernel (M = 1) is made of. (2026-12-01, H200: ~5 us of latency,
not launch; a block streams ~0.45 us per 128-k step at split 1 -> results/fixed_cost_h200.json, NOTES.md.)

    PYTHONPATH=src python benchmarks/probes/fixed_cost.py --out fixed_cost.json

Times the op (``torch.ops.anyfp4.nvfp4_linear``, the CUDA decode kernel at M = 1) over a grid of N x K, by CUDA-graph
replays over rotated weight copies (DRAM-bound) and over one copy (L2-resident where it fits), for the launch
table's split-K and forced splits, with programmatic dependent launch on and off; and the floor of a graphed launch
(a one-element add). A least-squares fit per variant gives ``us = fixed + bytes / bandwidth``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from anyfp4.bench.random_weights import random_nvfp4
from anyfp4.bench.timing import copy_bandwidth, graph_seconds
from anyfp4.packing.nvfp4 import prepack_nvfp4

NS = (1024, 2048, 4096, 8192, 14336, 28672)
KS = (1024, 4096, 8192)
SPLITS = (0, 1, 2, 4, 8, 16)  # 0: the launch table's / heuristic's
ROTATE_BYTES = 256 * 1024**2


def op(x, p, split_k):
    return torch.ops.anyfp4.nvfp4_linear(x, p.codes, p.scales, p.global_scale, None, p.out_features, p.in_features,
                                         split_k)


def weight_bytes(p) -> int:
    return p.codes.numel() * p.codes.element_size() + p.scales.numel() * p.scales.element_size()


def fit(points: list[tuple[float, float]]) -> dict:
    """Least squares of us = a + b * bytes over (bytes, us) points: a (us) and the streaming rate (bytes/s)."""
    n = len(points)
    sx = sum(b for b, _ in points)
    sy = sum(t for _, t in points)
    sxx = sum(b * b for b, _ in points)
    sxy = sum(b * t for b, t in points)
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return {"fixed_us": (sy - slope * sx) / n, "stream_Bps": 1e6 / slope if slope > 0 else None, "points": n}


def launch_floor_us(device) -> float:
    a = torch.zeros(1, device=device)
    b = torch.zeros(1, device=device)
    return graph_seconds(lambda i: torch.add(a, 1, out=b), reps=100) * 1e6


def main() -> None:
    import anyfp4.ops  # noqa: F401

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="fixed_cost.json")
    ap.add_argument("--ns", type=int, nargs="+", default=list(NS))
    ap.add_argument("--ks", type=int, nargs="+", default=list(KS), help="K; 128 is one main-loop step")
    ap.add_argument("--no-pdl-off", action="store_true", help="skip the PDL-off variant")
    args = ap.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    report = {"gpu": torch.cuda.get_device_name(device), "copy_bandwidth_Bps": copy_bandwidth(device),
              "launch_floor_us": launch_floor_us(device), "rows": []}
    print(f"copy {report['copy_bandwidth_Bps'] / 1e12:.2f} TB/s, graphed one-element add {report['launch_floor_us']:.2f} us")
    x = torch.randn(1, max(args.ks), dtype=torch.bfloat16, device=device)
    for k in args.ks:
        for n in args.ns:
            one = prepack_nvfp4(random_nvfp4(n, k, device, generator=gen))
            nbytes = weight_bytes(one)
            copies = [one] + [prepack_nvfp4(random_nvfp4(n, k, device, generator=gen))
                              for _ in range(max(1, ROTATE_BYTES // nbytes) - 1)]
            xk = x[:, :k]
            line = []
            for split in SPLITS:
                if split and split > k // 128:
                    continue
                for early in ("1", "0"):
                    if (split or args.no_pdl_off) and early == "0":
                        continue
                    os.environ["ANYFP4_EARLY_LAUNCH"] = early
                    reps = max(20, len(copies))
                    dram = graph_seconds(lambda i: op(xk, copies[i % len(copies)], split), reps=reps) * 1e6
                    l2 = graph_seconds(lambda i: op(xk, one, split), reps=reps) * 1e6
                    report["rows"].append({"n": n, "k": k, "split_k": split, "early_launch": early == "1",
                                           "weight_bytes": nbytes, "dram_us": dram, "l2_us": l2})
                    line.append(f"s{split or 'T'}{'' if early == '1' else '/noPDL'} {dram:.1f}/{l2:.1f}")
            os.environ.pop("ANYFP4_EARLY_LAUNCH", None)
            print(f"{n}x{k} ({nbytes / 1e6:.1f} MB, floor {nbytes / report['copy_bandwidth_Bps'] * 1e6:.1f} us): "
                  + "  ".join(line), flush=True)
            del copies, one
            torch.cuda.empty_cache()
    fits = {}
    for split in SPLITS:
        for early in (True, False):
            pts = [(r["weight_bytes"], r["dram_us"]) for r in report["rows"]
                   if r["split_k"] == split and r["early_launch"] == early]
            if len(pts) >= 3:
                fits[f"split={split or 'table'} early_launch={early}"] = fit(pts)
    report["fits"] = fits
    for name, f in fits.items():
        rate = f"{f['stream_Bps'] / 1e12:.2f} TB/s" if f["stream_Bps"] else "-"
        print(f"{name}: fixed {f['fixed_us']:.2f} us + stream {rate} ({f['points']} shapes)")
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
