"""A mixture's experts for one decode step, alone: the two grouped launches (gated gate / up, then down) of
``runtime.experts`` over random NVFP4, FP8 and bf16 experts of a real shape, timed in one run, with the bytes the
step's distinct experts hold against the copy bandwidth.

    PYTHONPATH=src python benchmarks/kernels/experts.py --out benchmarks/results/experts_h200.json \
        [--shape qwen3-30b-a3b] [--batch 1 4 16] [--formats nvfp4 nvfp4-triton fp8 fp8-triton bf16] [--sweep]
        [--commit C]

``nvfp4`` / ``fp8`` run what the ops choose (on sm_80+ the CUDA decode kernel's grouped launch), ``-triton`` the
Triton expert kernels (``ANYFP4_KERNELS=triton``). ``--sweep``: the CUDA grouped launch also under other launch
configs (K warps, ring depth, warps per block) than ``dispatch.tuning.experts_mma_config``'s, rows tagged ``config``
(a launch whose steps its K warps do not divide keeps the chosen config).

Each timed call routes its tokens to experts drawn at random (top-k distinct per token, a fixed seed), over enough
copies of the stacked experts that a call's experts are not in the L2 cache from the call before; calls are CUDA-graph
replays (``bench.timing.graph_seconds``), as a decode step runs them. ``pct_of_copy``: the step's distinct experts'
bytes (gate, up and down, scales included) per second against a device-to-device copy.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
import math
import os
import subprocess
import time
from pathlib import Path

import torch

import anyfp4.ops  # noqa: F401  (registers the ops)
from anyfp4.dispatch import tuning
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.kernels.cuda.weight_mma import STEP_K, k_warps_refusal
from anyfp4.bench.random_weights import random_bf16, random_fp8, random_nvfp4
from anyfp4.bench.timing import ROTATE_BYTES, copy_bandwidth, graph_seconds
from anyfp4.nn.linear import GatedMLP
from anyfp4.runtime.experts import stacked_experts

SHAPES = {"qwen3-30b-a3b": dict(hidden=2048, intermediate=768, experts=128, top_k=8)}


def expert_weights(fmt: str, hidden: int, inter: int, gen: torch.Generator):
    """One expert's gate, up and down (NVFP4: gate and up share a global scale, as ModelOpt exports them)."""
    if fmt == "nvfp4":
        return [random_nvfp4(n, k, "cuda", gen) for n, k in ((inter, hidden), (inter, hidden), (hidden, inter))]
    if fmt == "fp8":
        return [random_fp8(n, k, "cuda", gen) for n, k in ((inter, hidden), (inter, hidden), (hidden, inter))]
    return [random_bf16(n, k, "cuda", gen) for n, k in ((inter, hidden), (inter, hidden), (hidden, inter))]


def expert_bytes(weights) -> int:
    total = 0
    for w in weights:
        tensors = [w] if isinstance(w, torch.Tensor) else [t for t in vars(w).values() if isinstance(t, torch.Tensor)]
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total


def build(fmt: str, shape: dict, gen: torch.Generator):
    """The stacked experts of one layer, and one expert's bytes."""
    experts, one = [], 0
    for _ in range(shape["experts"]):
        w = expert_weights(fmt, shape["hidden"], shape["intermediate"], gen)
        one = expert_bytes(w)
        experts.append(GatedMLP(*w, device="cuda", dtype=torch.bfloat16))
    stacked = stacked_experts(experts)
    if stacked is None:
        raise SystemExit(f"{fmt}: the experts did not stack (a GPU is needed)")
    return stacked, one


def routings(count: int, rows: int, shape: dict, gen: torch.Generator) -> list[torch.Tensor]:
    """``count`` routings of ``rows`` tokens: each token's top_k distinct experts, (rows, top_k) int64."""
    return [torch.rand(rows, shape["experts"], generator=gen, device="cuda").topk(shape["top_k"]).indices
            for _ in range(count)]


SWEEP = [MMAConfig(mt=mt, warps=w, split_k=1, kw=kw, depth=d) for mt, w, kw, d in
         ((1, 4, 1, 8), (1, 8, 1, 4), (1, 2, 1, 4), (1, 4, 1, 2), (1, 2, 1, 8), (2, 4, 1, 4), (2, 2, 1, 4),
          (1, 4, 2, 4))]


def timed(fmt, shape, layers, one, batch, reps, gen, copy) -> dict:
    x = torch.randn(batch, shape["hidden"], generator=gen, device="cuda").bfloat16()
    ids = routings(reps, batch, shape, gen)
    seconds = graph_seconds(lambda i: layers[i % len(layers)](x, ids[i]), reps=reps)
    distinct = sum(len(torch.unique(r)) for r in ids) / len(ids)
    moved = distinct * one
    return {"format": fmt, "batch": batch, "us": seconds * 1e6, "distinct_experts": distinct, "bytes": moved,
            "GBps": moved / seconds / 1e9, "pct_of_copy": 100 * moved / seconds / copy if copy else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--formats", nargs="+", default=["nvfp4", "fp8", "bf16"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", type=Path, default=Path("experts.json"))
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    copy = copy_bandwidth(torch.device("cuda"))
    rows_out, gen = [], torch.Generator(device="cuda").manual_seed(0)
    chosen = tuning.experts_mma_config
    for arm in args.formats:
        fmt, triton_arm = arm.removesuffix("-triton"), arm.endswith("-triton")
        if triton_arm:
            os.environ["ANYFP4_KERNELS"] = "triton"
        first, one = build(fmt, shape, gen)
        layers = [first] + [build(fmt, shape, gen)[0] for _ in range(math.ceil(ROTATE_BYTES / (one * shape["experts"])))]
        configs = [None] + (SWEEP if args.sweep and fmt != "bf16" and not triton_arm else [])
        for config in configs:
            if config is not None:
                tuning.experts_mma_config = lambda k_pad, f, c=config: (
                    c if k_warps_refusal(c, k_pad // STEP_K[f]) is None else chosen(k_pad, f))
            for batch in args.batch:
                r = timed(arm, shape, layers, one, batch, args.reps, gen, copy)
                if config is not None:
                    r["config"] = asdict(config)  # where its K warps divide a launch's steps, else the chosen
                rows_out.append(r)
                print(f"{arm:12s} batch {batch:3d}: {r['us']:8.1f} us, {r['distinct_experts']:5.1f} experts, "
                      f"{r['GBps']:7.1f} GB/s, {r['pct_of_copy']:5.1f}% of copy {r.get('config', '')}", flush=True)
            tuning.experts_mma_config = chosen
        os.environ.pop("ANYFP4_KERNELS", None)
        del layers, first
        torch.cuda.empty_cache()
    for r in rows_out:
        base = next((b for b in rows_out if b["format"] == "bf16" and b["batch"] == r["batch"]), None)
        r["x_bf16"] = base["us"] / r["us"] if base else None
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    report = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "commit": commit,
              "shape": dict(shape, name=args.shape), "copy_bandwidth_Bps": copy, "rows": rows_out}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps([{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for r in rows_out]))


if __name__ == "__main__":
    main()
