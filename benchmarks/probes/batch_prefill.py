"""Where a left-padded batch's prefill spends its time (what a batched server waits for before its first token):
the prefill of ``--lengths`` prompts as one batch (``generate``'s layout and cache slots) and of each prompt alone,
one after another, in each prefill mode (``ANYFP4_PREFILL``: chunked — graphed steps, as ``generate`` runs it —
chunked in one forward, cublas, fused), wall time median of three
after a warm-up; then a torch.profiler run of the batch in the first mode: CUDA time by kernel, and the share of the
wall time the GPU was busy.

    PYTHONPATH=src python benchmarks/probes/batch_prefill.py --arch llama-3.1-8b --format nvfp4 \\
        --out batch_prefill.json

The default lengths are those of benchmarks/runners/serve_gpu.py's 16 chat prompts with SmolLM2's template.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict

import torch

from anyfp4.bench.random_model import random_model
from anyfp4.runtime.generate import cache_slots, decode_step, left_padded
from anyfp4.runtime.prompt import prompt_step_tokens, run_prompt

SERVE_LENGTHS = [35, 39, 42, 47, 50, 37, 39, 42, 47, 51, 35, 38, 43, 47, 50, 35]


AT_ONCE = "-at-once"  # a mode's name with this suffix: the prompt in one forward even where generate takes steps
at_once = False  # the mode being timed has the suffix


def prefill(model, prompts) -> None:
    """One left-padded prefill of ``prompts`` (the head on the last position), as ``generate`` runs it (in the
    mode ``ANYFP4_PREFILL`` says; ``at_once``: one forward)."""
    dev, longest = model.device, max(len(p) for p in prompts)
    slots = cache_slots(model, longest, 128)
    model.setup_caches(len(prompts), slots)
    tokens, valid, rope, padded = left_padded(prompts, slots, dev)
    steps = None if at_once else prompt_step_tokens(model, len(prompts))
    run_prompt(model, tokens, decode_step(model), steps, rope if padded else None, valid if padded else None)


def use_mode(mode: str) -> None:
    global at_once
    os.environ["ANYFP4_PREFILL"] = mode.removesuffix(AT_ONCE)
    at_once = mode.endswith(AT_ONCE)


def timed(fn, reps: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profiled(model, prompts) -> dict:
    from torch.profiler import ProfilerActivity, profile

    prefill(model, prompts)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        prefill(model, prompts)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    by_kernel: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = by_kernel[e.name[:90]]
            k[0] += e.device_time_total / 1e3  # ms
            k[1] += 1
    busy = sum(v[0] for v in by_kernel.values())
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:15]
    return {"wall_ms": wall * 1e3, "gpu_busy_ms": busy,
            "kernels": [{"name": n, "ms": round(v[0], 3), "calls": v[1]} for n, v in top]}


def host_profile(model, prompts, mode: str) -> None:
    import cProfile
    import pstats

    use_mode(mode)
    with torch.no_grad():
        prefill(model, prompts)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        prefill(model, prompts)
        torch.cuda.synchronize()
        prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="llama-3.1-8b")
    ap.add_argument("--format", default="nvfp4")
    ap.add_argument("--lengths", type=int, nargs="+", default=SERVE_LENGTHS)
    ap.add_argument("--modes", nargs="+", default=["chunked", "chunked" + AT_ONCE, "cublas", "fused"],
                    help=f"ANYFP4_PREFILL values; with {AT_ONCE!r}, the prompt in one forward where generate "
                         "would run it in steps")
    ap.add_argument("--out", default="batch_prefill.json")
    ap.add_argument("--host-profile", action="store_true",
                    help="only cProfile one prompt's prefill in the first mode (the host's share): top functions")
    args = ap.parse_args()
    model = random_model(args.arch, args.format, torch.device("cuda"), torch.bfloat16, progress=False)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.args.vocab_size, (n,), generator=gen).tolist() for n in args.lengths]
    report = {"arch": args.arch, "format": args.format, "lengths": args.lengths, "device": torch.cuda.get_device_name(),
              "modes": {}}
    if args.host_profile:
        host_profile(model, prompts[-1:], args.modes[0])
        return
    with torch.no_grad():
        for mode in args.modes:
            use_mode(mode)
            batch = timed(lambda: prefill(model, prompts))
            alone = timed(lambda: [prefill(model, [p]) for p in prompts])
            report["modes"][mode] = {"batch_ms": batch * 1e3, "each_alone_ms": alone * 1e3}
            print(mode, json.dumps(report["modes"][mode]), flush=True)
        use_mode(args.modes[0])
        report["profile_batch"] = profiled(model, prompts)
        report["profile_one"] = profiled(model, prompts[-1:])
    for name in ("profile_batch", "profile_one"):
        p = report[name]
        print(name, f"wall {p['wall_ms']:.1f} ms, GPU busy {p['gpu_busy_ms']:.1f} ms")
        for k in p["kernels"][:10]:
            print(f"  {k['ms']:8.2f} ms {k['calls']:6d}  {k['name']}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
