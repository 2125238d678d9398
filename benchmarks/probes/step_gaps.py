"""Where a decode step's time goes beside the GPU's own work: the same CUDA-graph step timed back to back (the
GPU's time), with the host waiting for each step before it launches the next (a copy of the position from the
host, or reading the token, as generate and bench did), with the position kept on the device and nothing read,
and generate() itself with each step launched before or after the previous step's tokens are read.

    PYTHONPATH=src python benchmarks/probes/step_gaps.py --models llama-3.1-8b:nvfp4 qwen3.5-27b:mixed \
        --out step_gaps.json

2026-12-05, H100 (results/step_gaps_h100.json): launching a step's graph costs the host 0.1-0.3 ms, which a wait
for the device before each launch left the GPU idle for; with generate launching ahead (tokens read through pinned
memory) a step through generate took as long as the graph back to back (benchmarks/NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import anyfp4.runtime.generate as generation
from anyfp4.bench.random_model import random_model
from anyfp4.runtime.generate import SamplingParams, cache_slots, decode_step, generate


def per_step_ms(loop, steps: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loop(steps)
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / steps


@torch.no_grad()
def measure(arch: str, fmt: str, prompt_len: int, steps: int) -> dict:
    dev = torch.device("cuda")
    model = random_model(arch, fmt, dev, torch.bfloat16, progress=False)
    step = decode_step(model)
    model.setup_caches(1, cache_slots(model, prompt_len, 2 * steps + 8))
    tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
    for i in range(3):
        step(tok, torch.tensor([prompt_len + i], device=dev))

    def back_to_back(n):  # the GPU's time: nothing waits
        pos = torch.tensor([prompt_len], device=dev)
        for _ in range(n):
            step(tok, pos)

    def host_position(n):  # the old bench loop: the position copied from the host (a wait for the device)
        nxt = tok[:, 0]
        for i in range(n):
            nxt = step(nxt[:, None], torch.tensor([prompt_len + i], device=dev))[:, -1].argmax(-1)

    def device_position(n):  # the bench loop now: the position kept on the device
        nxt, pos = tok[:, 0], torch.tensor([prompt_len], device=dev)
        for _ in range(n):
            nxt = step(nxt[:, None], pos)[:, -1].argmax(-1)
            pos = pos + 1

    def host_launch_us(n):  # what launching one graph replay costs the host
        pos = torch.tensor([prompt_len], device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            step(tok, pos)
        t = time.perf_counter() - t0
        torch.cuda.synchronize()
        return 1e6 * t / n

    row = {"model": f"random:{arch}:{fmt}", "steps": steps,
           "back_to_back_ms": per_step_ms(back_to_back, steps),
           "host_position_ms": per_step_ms(host_position, steps),
           "device_position_ms": per_step_ms(device_position, steps),
           "host_launch_us": host_launch_us(8)}
    prompt = torch.randint(0, model.args.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    texts = {}
    for ahead in (False, True):
        generation.launches_ahead = lambda device, ahead=ahead: ahead
        generate(model, [prompt], SamplingParams(max_new_tokens=4))  # warm-up of this order
        heard = []  # when each step's tokens reached the caller: the steps' pace, the prefill left out
        texts[ahead] = generate(model, [prompt], SamplingParams(max_new_tokens=steps + 1),
                                on_tokens=lambda t: heard.append(time.perf_counter()))[0]
        row["generate_ahead_ms" if ahead else "generate_in_order_ms"] = 1e3 * (heard[-1] - heard[0]) / steps
    row["generate_same_tokens"] = texts[False] == texts[True]
    del model, step
    torch.cuda.empty_cache()
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=["llama-3.1-8b:nvfp4", "qwen3.5-27b:mixed"])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--out", default="step_gaps.json")
    a = p.parse_args()
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for spec in a.models:
        arch, fmt = spec.split(":")
        row = measure(arch, fmt, a.prompt_len, a.steps)
        report["rows"].append(row)
        print(f"{row['model']}: ms per step back to back {row['back_to_back_ms']:.3f}, host position "
              f"{row['host_position_ms']:.3f}, device position {row['device_position_ms']:.3f}; generate in order "
              f"{row['generate_in_order_ms']:.3f}, ahead {row['generate_ahead_ms']:.3f} (same tokens: "
              f"{row['generate_same_tokens']}); host launch {row['host_launch_us']:.0f} us", flush=True)
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
