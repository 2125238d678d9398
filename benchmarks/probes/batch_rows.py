"""Is a prompt's row in a left-padded batch computed as the prompt alone? For prompts of different lengths, the
prefill (eager, forward hooks on every module) alone and inside one batch, each row's valid positions compared
module by module: the first module (in forward order) whose output differs is named per row, with the largest
difference; the same for the first eager decode steps after it. Then ``generate`` alone and batched: the first new
token where each row's text departs.
A batch of equal lengths (no padding) separates the row count from the padding.

    PYTHONPATH=src ANYFP4_PREFILL=chunked python benchmarks/probes/batch_rows.py --arch llama-3.1-8b \\
        --format nvfp4 --out batch_rows.json
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager

import torch

from anyfp4.bench.random_model import random_model
import anyfp4.runtime.generate as generation
from anyfp4.runtime.generate import SamplingParams, decode_step, generate, left_padded


@contextmanager
def recorded(model):
    """name -> each module's output (the first of a tuple), filled by the forwards run inside."""
    seen, handles = {}, []
    for name, module in model.named_modules():
        if name:
            def hook(_m, _i, out, name=name):
                out = out[0] if isinstance(out, tuple) else out
                if isinstance(out, torch.Tensor) and out.dim() >= 2:
                    seen[name] = out.detach().clone()
            handles.append(module.register_forward_hook(hook))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def prefill_outputs(model, prompts):
    """Each module's output of a left-padded prefill of ``prompts``, as ``generate`` lays it out: name -> (b, t, ...)."""
    dev, longest = model.device, max(len(p) for p in prompts)
    slots = generation.cache_slots(model, longest, 8)
    model.setup_caches(len(prompts), slots)
    tokens, valid, rope, padded = left_padded(prompts, slots, dev)
    with torch.no_grad(), recorded(model) as seen:
        seen["logits"] = model(tokens, torch.arange(longest, device=dev), rope if padded else None,
                               valid if padded else None)
    return seen


def step_logits(model, prompts, steps, step_fn):
    """Logits of ``steps`` greedy decode steps after a left-padded prefill (cache slots as ``generate`` allocates
    them), each step run by ``step_fn`` (the model: eager; ``decode_step(model)``: a CUDA graph)."""
    dev, longest = model.device, max(len(p) for p in prompts)
    slots = generation.cache_slots(model, longest, steps)
    model.setup_caches(len(prompts), slots)
    tokens, valid, rope, padded = left_padded(prompts, slots, dev)
    out = []
    with torch.no_grad():
        logits = model(tokens, torch.arange(longest, device=dev), rope if padded else None,
                       valid if padded else None, last=True)
        for step in range(steps):
            valid[:, longest + step] = True
            logits = step_fn(logits[:, -1].argmax(-1)[:, None], torch.tensor([longest + step], device=dev),
                             rope[:, -1:] + 1 + step if padded else None, valid if padded else None).clone()
            out.append(logits)
    return out


def step_outputs(model, prompts, steps):
    """Each module's output at each of ``steps`` eager greedy decode steps after a left-padded prefill laid out as
    ``generate`` lays it out: list (per step) of name -> (b, 1, ...)."""
    out = []

    def recorded_step(*inputs):
        with recorded(model) as seen:
            seen["logits"] = model(*inputs)
        out.append(seen)
        return seen["logits"]

    step_logits(model, prompts, steps, recorded_step)
    return out


def first_step_differing(a_steps, a_row, b_steps, b_row):
    for k, (a, b) in enumerate(zip(a_steps, b_steps)):
        if not torch.equal(a[a_row], b[b_row]):
            return {"step": k, "max_abs": float((a[a_row] - b[b_row]).abs().max())}
    return None


def graphed_against_eager(model, prompts, steps):
    """Per row: the first decode step whose logits differ between graphed batch / eager batch / graphed alone /
    eager alone (the eager pair is what ``step_outputs`` compares module by module)."""
    graphed = decode_step(model)
    batch = {"graphed": step_logits(model, prompts, steps, graphed),
             "eager": step_logits(model, prompts, steps, model)}
    rows = []
    for i, p in enumerate(prompts):
        alone = {"graphed": step_logits(model, [p], steps, graphed), "eager": step_logits(model, [p], steps, model)}
        rows.append({"batch_graphed_vs_eager": first_step_differing(batch["graphed"], i, batch["eager"], i),
                     "alone_graphed_vs_eager": first_step_differing(alone["graphed"], 0, alone["eager"], 0),
                     "graphed_batch_vs_alone": first_step_differing(batch["graphed"], i, alone["graphed"], 0),
                     "eager_batch_vs_alone": first_step_differing(batch["eager"], i, alone["eager"], 0)})
    return rows


def first_difference(batch, alone, row, length):
    for name, out in alone.items():
        got = batch.get(name)
        if got is None or got.shape[0] <= row or got.dim() < 2:
            continue
        a = out[0, -length:] if out.shape[1] >= length else out[0]
        g = got[row, -length:] if got.shape[1] >= length else got[row]
        if a.shape != g.shape:
            continue
        if not torch.equal(a, g):
            return {"module": name, "max_abs": float((a.float() - g.float()).abs().max())}
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="llama-3.1-8b")
    ap.add_argument("--format", default="nvfp4")
    ap.add_argument("--lengths", type=int, nargs="+", default=[45, 38, 52, 20, 66, 45, 9, 59])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (float32) for a quick check of the script")
    ap.add_argument("--out", default="batch_rows.json")
    ap.add_argument("--graphs-only", action="store_true",
                    help="only the mixed lengths' decode-step logits, CUDA graph against eager")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model(args.arch, args.format, device, dtype, progress=False)
    gen = torch.Generator().manual_seed(7)
    vocab = model.args.vocab_size
    report = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "arch": args.arch,
              "format": args.format, "cases": {}}
    cases = {"mixed_lengths": [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in args.lengths],
             "equal_lengths": [torch.randint(0, vocab, (48,), generator=gen).tolist() for _ in range(6)],
             "equal_lengths_16": [torch.randint(0, vocab, (48,), generator=gen).tolist() for _ in range(16)]}
    params = SamplingParams(max_new_tokens=args.new_tokens)
    if device.type == "cuda":
        rows = graphed_against_eager(model, cases["mixed_lengths"], 8)
        report["graphed_against_eager"] = rows
        print("graphed_against_eager", json.dumps(rows))
    if args.graphs_only:
        cases = {"mixed_lengths": cases["mixed_lengths"]}
    for case, prompts in cases.items():
        batch = prefill_outputs(model, prompts)
        rows = []
        for i, p in enumerate(prompts):
            alone = prefill_outputs(model, [p])
            rows.append({"length": len(p), "prefill": first_difference(batch, alone, i, len(p))})
        del batch, alone
        batch_steps = step_outputs(model, prompts, 4)
        for i, p in enumerate(prompts):
            alone_steps = step_outputs(model, [p], 4)
            rows[i]["decode"] = next(({"step": k, **d} for k, (bs, al) in enumerate(zip(batch_steps, alone_steps))
                                      if (d := first_difference(bs, al, i, 1))), None)
        del batch_steps, alone_steps
        together = generate(model, prompts, params)
        for i, p in enumerate(prompts):
            single = generate(model, [p], params)[0]
            rows[i]["first_new_token_differing"] = next(
                (j for j, (x, y) in enumerate(zip(single, together[i])) if x != y), None)
        report["cases"][case] = rows
        print(case, json.dumps(rows))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
