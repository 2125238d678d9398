"""A Gated DeltaNet layer's prompt (``torch.ops.anyfp4.gated_delta_step``: gates, delta rule, gated norm) under each
``ANYFP4_GDN_PREFILL`` mode, timed in one run, with each mode's distance from the pure-torch form.

    PYTHONPATH=src python benchmarks/kernels/gdn_prefill.py --out benchmarks/results/gdn_prefill_h200.json
        [--tokens 128 512 2048 8192] [--batch 1] [--trials 5]

Qwen3.5-27B's head sizes (16 key heads, 32 value heads of 128, transformers' defaults), random bf16 inputs of the
convolution's output; eager calls (a prefill is not graphed), the median of ``--trials`` after a warm-up, timed with
CUDA events. Prints us per call and tokens per second per layer, and x the ``torch`` mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

import anyfp4.ops  # noqa: F401  (registers the ops)
from anyfp4.env import GDN_PREFILL_MODES

K_HEADS, V_HEADS, K_DIM, V_DIM = 16, 32, 128, 128


def inputs(batch: int, t: int, gen: torch.Generator) -> dict:
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    return dict(mixed=rnd(batch, t, 2 * K_HEADS * K_DIM + V_HEADS * V_DIM).bfloat16(),
                a=rnd(batch, t, V_HEADS).bfloat16(), b=rnd(batch, t, V_HEADS).bfloat16(),
                z=rnd(batch, t, V_HEADS * V_DIM).bfloat16(), neg_a=-rnd(V_HEADS).abs() - 0.1, dt_bias=rnd(V_HEADS),
                norm_weight=(1 + 0.1 * rnd(V_DIM)).bfloat16(), state=rnd(batch, V_HEADS, K_DIM, V_DIM) * 0.1)


def run(args: dict, state: torch.Tensor) -> torch.Tensor:
    return torch.ops.anyfp4.gated_delta_step(args["mixed"], args["a"], args["b"], args["z"], args["neg_a"],
                                             args["dt_bias"], args["norm_weight"], state, 1e-6, K_HEADS, None, None)


def time_mode(mode: str, args: dict, trials: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    os.environ["ANYFP4_GDN_PREFILL"] = mode
    state = args["state"].clone()
    out = run(args, state)  # warm-up (compiles), and the result compared
    times = []
    for _ in range(trials):
        s = args["state"].clone()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(args, s)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times), out.float(), state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 2048, 8192])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=list(GDN_PREFILL_MODES), choices=GDN_PREFILL_MODES)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--commit", help="the commit measured (default: this tree's HEAD)")
    opts = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{'tokens':>7} " + " ".join(f"{m + ' us':>14}" for m in opts.modes) + "  x torch   rel. diff")
    for t in opts.tokens:
        args = inputs(opts.batch, t, gen)
        res = {m: time_mode(m, args, opts.trials) for m in opts.modes}
        base = res.get("torch")
        row = {"tokens": t, "batch": opts.batch}
        for m, (us, out, state) in res.items():
            row[m] = {"us": us, "layer_tok_s": opts.batch * t / us * 1e6}
            if base is not None and m != "torch":
                row[m]["x_torch"] = base[0] / us
                row[m]["out_rel_diff"] = ((out - base[1]).norm() / base[1].norm()).item()
                row[m]["state_rel_diff"] = ((state - base[2]).norm() / base[2].norm()).item()
        rows.append(row)
        speedups = " ".join(f"{row[m].get('x_torch', 1.0):.2f}" for m in opts.modes)
        diffs = " ".join(f"{row[m].get('out_rel_diff', 0.0):.1e}" for m in opts.modes)
        print(f"{t:>7} " + " ".join(f"{row[m]['us']:>14.0f}" for m in opts.modes) + f"  {speedups}  {diffs}")
    if opts.out:
        commit = opts.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                               text=True).stdout.strip()
        opts.out.write_text(json.dumps({
            "gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "torch": torch.__version__, "command": "python benchmarks/kernels/gdn_prefill.py",
            "shape": {"k_heads": K_HEADS, "v_heads": V_HEADS, "k_dim": K_DIM, "v_dim": V_DIM}, "rows": rows},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
