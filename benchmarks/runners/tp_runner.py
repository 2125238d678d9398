"""Tensor parallelism against one GPU on the same random weights: the greedy text of TP1 and TP N
(SHA-256), and, teacher-forced on TP1's tokens, how far TP N's logits are from TP1's (max |diff|,
top-1 agreement). With two ranks the decode steps compute one GPU's bits; with ``ANYFP4_PREFILL=chunked``
the prompt too (cuBLAS picks its prefill kernels by shape), so the texts are equal. Speed comes from
``anyfp4 bench --tp N``.

    PYTHONPATH=src python benchmarks/runners/tp_runner.py --out tp.json [--tp 2] [--formats nvfp4 fp8 mixed]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch

from anyfp4.bench.random_model import random_model
from anyfp4.parallel.ranks import rank_device, run_on_ranks
from anyfp4.runtime.generate import SamplingParams, decode_step, generate


@torch.no_grad()
def teacher_forced_logits(model, ids: list[int], prefix: int) -> torch.Tensor:
    """Logits (float32, CPU) for positions prefix-1 .. len(ids)-2: prefill ``ids[:prefix]``, then one
    decode step (the graphed step generation uses) per later token."""
    dev = model.device
    model.setup_caches(1, len(ids))
    step = decode_step(model)
    out = [model(torch.tensor([ids[:prefix]], device=dev), torch.arange(prefix, device=dev))[0, -1].float().cpu()]
    for pos in range(prefix, len(ids) - 1):
        out.append(step(torch.tensor([[ids[pos]]], device=dev), torch.tensor([pos], device=dev))[0, -1].float().cpu())
    return torch.stack(out)


def run(model, prompt: list[int], gen_len: int, forced: list[int] | None):
    new = generate(model, [prompt], SamplingParams(max_new_tokens=gen_len))[0]
    ids = prompt + (forced if forced is not None else new)
    return new, teacher_forced_logits(model, ids, len(prompt))


def tp_rank(rank, tp, device, arch, fmt, prompt, gen_len, forced):
    """One rank of TP N: its shard of the same random weights, generation, and logits teacher-forced on TP1's
    tokens."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model(arch, fmt, device, dtype, progress=False, rank=rank, tp=tp)
    new, logits = run(model, prompt, gen_len, forced)
    return model, {"tokens": new, "logits": logits}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tp.json")
    ap.add_argument("--arch", default="llama-3.1-8b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--formats", nargs="+", default=["nvfp4", "fp8", "mixed"])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: gloo ranks (a check, not a speed)")
    args = ap.parse_args()
    kind = args.device
    dtype = torch.bfloat16 if kind == "cuda" else torch.float32
    report = {"device": torch.cuda.get_device_name() if kind == "cuda" else "cpu",
              "gpus": torch.cuda.device_count(), "arch": args.arch, "tp": args.tp, "dtype": str(dtype), "runs": []}
    sha = lambda t: hashlib.sha256(repr([t]).encode()).hexdigest()  # noqa: E731  (bench's convention)
    for fmt in args.formats:
        prompt = torch.randint(0, 49152, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
        model = random_model(args.arch, fmt, rank_device(kind, 0), dtype, progress=False)
        one_tokens, one_logits = run(model, prompt, args.gen_len, None)
        del model
        if kind == "cuda":
            torch.cuda.empty_cache()
        tp = run_on_ranks(tp_rank, (args.arch, fmt, prompt, args.gen_len, one_tokens), args.tp, kind, args.port)
        diff = (tp["logits"] - one_logits).abs()
        r = {"format": fmt, "tp1_sha256": sha(one_tokens), "tpN_sha256": sha(tp["tokens"]),
             "same_text": tp["tokens"] == one_tokens,
             "first_differing_token": next((i for i, (a, b) in enumerate(zip(one_tokens, tp["tokens"])) if a != b),
                                           None),
             "teacher_forced_positions": one_logits.shape[0],
             "top1_agreement": (tp["logits"].argmax(-1) == one_logits.argmax(-1)).float().mean().item(),
             "max_abs_logit_diff": diff.max().item(), "mean_abs_logit_diff": diff.mean().item(),
             "logit_scale": one_logits.abs().max().item()}
        report["runs"].append(r)
        print(json.dumps(r), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        args.port += 1


if __name__ == "__main__":
    main()
