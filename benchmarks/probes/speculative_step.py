"""What one speculative step costs, piece by piece, on a random-weight model (GPU): the verify pass of M rows as
its CUDA-graph replay, the return to an accepted prefix (``keep_states``, for hybrids), and with ``--mtp`` the
head's catching up (``observe``) and its k drafts; then whole speculative generations, timed twice so the
second shows what a warm start costs. Synchronized wall times, median of the repetitions, in ms.

    PYTHONPATH=src python benchmarks/probes/speculative_step.py --arch qwen3.5-27b --format mixed --mtp --k 3 \\
        --out speculative_step.json

2026-12-02, H200, random Qwen3.5-27B mixed, k = 3 (results/speculative_qwen3_5_27b_mixed_mtp_h200.json, an earlier
form of this probe): verify M = 1 / 2 / 4 8.2 / 9.3 / 9.6, keep_states 1.6 (then one copy launch per state),
observe 1.0, 3 drafts 2.2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from anyfp4.bench.random_model import random_model, random_mtp_head
from anyfp4.runtime.generate import SamplingParams, decode_step
from anyfp4.runtime.speculative import generate_speculative


def median_ms(fn, reps: int, warm: bool = True) -> float:
    """Median ms of ``reps`` synchronized calls of ``fn``, after one untimed call when ``warm``."""
    if warm:
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="qwen3.5-27b")
    ap.add_argument("--format", default="mixed")
    ap.add_argument("--k", type=int, default=3, help="draft tokens")
    ap.add_argument("--mtp", action="store_true", help="draft with a random multi-token-prediction head")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = torch.device("cuda")
    model = random_model(a.arch, a.format, dev, torch.bfloat16, progress=False)
    head = random_mtp_head(a.arch, a.format, dev, torch.bfloat16) if a.mtp else None
    prompt = torch.randint(0, model.args.vocab_size, (a.prompt_len,), generator=torch.Generator().manual_seed(0))
    out: dict = {"arch": a.arch, "format": a.format, "k": a.k, "mtp": a.mtp, "ms": {}}
    ms = out["ms"]
    params = SamplingParams(max_new_tokens=32)
    for run in ("first", "second"):  # the second reuses the first's caches and graphs
        ms[f"generation_32_tokens_{run}"] = median_ms(
            lambda: generate_speculative(model, prompt.tolist(), params, a.k, mtp=head), 1, warm=False)
    n = a.prompt_len
    model.setup_caches(1, n + 64)
    model.setup_snapshots(a.k + 1)
    model(prompt[None].to(dev), torch.arange(n, device=dev))
    step = decode_step(model)
    hybrid = bool(model.mixers_with_state())
    for m in sorted({1, 2, a.k + 1}):
        tokens = torch.randint(0, 1000, (1, m), device=dev)
        pos = torch.arange(n, n + m, device=dev)
        ms[f"verify_M{m}"] = median_ms(lambda: step(tokens, pos, hidden=a.mtp), a.reps)
        if hybrid and m > 1:
            ms[f"keep_states_1_of_{m}"] = median_ms(lambda: model.keep_states(1, m), a.reps)
    if head is not None:
        from anyfp4.runtime.mtp import MTPDrafter

        drafter = MTPDrafter(head, model)
        drafter.start(n + 64)
        hidden = torch.randn(1, 1, model.args.hidden_size, device=dev, dtype=torch.bfloat16)
        ms["observe_1"] = median_ms(lambda: drafter.observe([5], hidden, n + 2), a.reps)
        ms[f"draft_{a.k}"] = median_ms(lambda: drafter.draft(a.k), a.reps)
    for name, v in ms.items():
        print(f"{name:32s} {v:8.3f} ms", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
