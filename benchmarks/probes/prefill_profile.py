"""Where a short prompt's prefill time goes: wall time (median of repeats) against the GPU's kernel time and the
host's own, per format and prompt length, for a random-weight model. Prints the kernels by GPU time and the host's
functions by their own time (cProfile) so a host-bound prefill shows what the host does.

    PYTHONPATH=src python benchmarks/probes/prefill_profile.py --arch llama-3.1-8b --formats nvfp4 bf16 \
        --prompts 48 128 --out prefill_profile.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

from anyfp4.bench.random_model import random_model
from anyfp4.runtime.generate import cache_slots

sys.path.insert(0, str(Path(__file__).resolve().parent))  # step_profile.py beside this script
from step_profile import kernel_table  # noqa: E402  (kernel time by name)


def prefill(model, prompt):
    return model(prompt, torch.arange(prompt.shape[1], device=prompt.device), last=True)


def wall_ms(model, prompt, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prefill(model, prompt)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def host_functions(model, prompt, top: int) -> str:
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    prefill(model, prompt)
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="llama-3.1-8b")
    p.add_argument("--formats", nargs="+", default=["nvfp4", "bf16"])
    p.add_argument("--prompts", nargs="+", type=int, default=[48, 128])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--top", type=int, default=22)
    p.add_argument("--out", default="prefill_profile.json")
    a = p.parse_args()
    dev = torch.device("cuda")
    report = {"gpu": torch.cuda.get_device_name(), "arch": a.arch, "runs": []}
    for fmt in a.formats:
        model = random_model(a.arch, fmt, dev, torch.bfloat16, progress=False)
        for n in a.prompts:
            model.setup_caches(1, cache_slots(model, n, 16))
            prompt = torch.randint(0, model.args.vocab_size, (1, n), device=dev)
            for _ in range(2):
                prefill(model, prompt)
            times = wall_ms(model, prompt, a.reps)
            rows = kernel_table(lambda: prefill(model, prompt), reps=1)
            gpu_ms = sum(r["us_per_step"] for r in rows) / 1e3
            launches = round(sum(r["launches_per_step"] for r in rows))
            host = host_functions(model, prompt, a.top)
            run = {"format": fmt, "prompt": n, "wall_ms": times, "wall_ms_median": statistics.median(times),
                   "kernel_ms": gpu_ms, "launches": launches, "kernels": rows[:25], "host_top": host}
            report["runs"].append(run)
            print(f"== {fmt} prompt {n}: wall {run['wall_ms_median']:.2f} ms (min {min(times):.2f}), kernels "
                  f"{gpu_ms:.2f} ms in {launches} launches")
            for r in rows[:8]:
                print(f"   {r['us_per_step']:9.1f} us x{r['launches_per_step']:4.0f} {r['kernel'][:80]}")
            if fmt == a.formats[0] and n == a.prompts[0]:
                print("\n".join(line[:150] for line in host.splitlines()[:40]))
        del model
        torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
