"""Do rejected draft rows leave any trace? Greedy decoding one token per step against verify passes of the same
tokens each followed by k rejected draft rows (random tokens, or the MTP head's drafts with ``--mtp``) and a
return to the accepted prefix (``keep_states``): the logits of every step's first row must equal the plain step's
bit for bit. At the first step where they do not, both runs are repeated with forward hooks and the first module
(in forward order) whose first-row output differs is named. Eager (no CUDA graphs), so hooks see every module.

    PYTHONPATH=src python benchmarks/probes/rejected_rows.py --arch qwen3.5-27b --format mixed --steps 24 --k 3 \\
        [--mtp] --out rejected_rows.json
"""

from __future__ import annotations

import argparse
import json

import torch

from anyfp4.bench.random_model import random_model, random_mtp_head


def run(model, prompt, steps, k, gen, head=None, hooks=None, stop_at=None):
    """First-row logits of each step (plain when k = 0); ``hooks``: module name -> list, filled at ``stop_at``."""
    dev = prompt.device
    n = prompt.shape[1]
    model.setup_caches(1, n + steps + k + 2)
    model.setup_snapshots(k + 1 if k else 0)
    logits, hidden = model(prompt, torch.arange(n, device=dev), hidden=True)
    tok = int(logits[0, -1].argmax())
    drafter = None
    if head is not None:
        from anyfp4.runtime.mtp import MTPDrafter

        drafter = MTPDrafter(head, model)
        drafter.start(n + steps + k + 2)
        drafter.observe(prompt[0, 1:].tolist() + [tok], hidden, 0)
    rows, handles = [], []
    for step in range(steps):
        if step == stop_at and hooks is not None:
            def keep(name):
                def hook(_module, _inputs, out):  # returns None: the output stays as it is
                    first = out[0] if isinstance(out, tuple) else out
                    if isinstance(first, torch.Tensor) and first.dim() >= 2 and name not in hooks:
                        hooks[name] = first[:, :1].detach().clone()
                return hook

            handles = [m.register_forward_hook(keep(name)) for name, m in model.named_modules() if name]
        pos = n + step
        drafts = (drafter.draft(k) if drafter is not None else
                  torch.randint(0, model.args.vocab_size, (k,), generator=gen).tolist()) if k else []
        inp = torch.tensor([[tok] + drafts], device=dev)
        logits, hidden = model(inp, torch.arange(pos, pos + inp.shape[1], device=dev), hidden=True)
        for h in handles:
            h.remove()
        if step == stop_at:
            return rows
        rows.append(logits[0, 0].clone())
        nxt = int(logits[0, 0].argmax())
        if k:
            model.keep_states(1, inp.shape[1])
        if drafter is not None:
            drafter.observe([nxt], hidden[:, :1], pos)
        tok = nxt
    return rows


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3.5-27b")
    ap.add_argument("--format", default="mixed")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--mtp", action="store_true", help="drafts from a random MTP head (observed every step)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="rejected_rows.json")
    a = ap.parse_args()
    dev = torch.device(a.device)
    model = random_model(a.arch, a.format, dev, torch.bfloat16, progress=False)
    head = random_mtp_head(a.arch, a.format, dev, torch.bfloat16) if a.mtp else None
    prompt = torch.randint(0, model.args.vocab_size, (1, a.prompt_len), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(dev)
    plain = run(model, prompt, a.steps, 0, None)
    spec = run(model, prompt, a.steps, a.k, torch.Generator().manual_seed(1), head)
    same = [bool(torch.equal(x, y)) for x, y in zip(plain, spec)]
    first = same.index(False) if False in same else None
    result = {"arch": a.arch, "format": a.format, "k": a.k, "mtp": a.mtp, "steps_equal": same, "first_differing": first}
    if first is not None:
        seen_plain, seen_spec = {}, {}
        run(model, prompt, a.steps, 0, None, hooks=seen_plain, stop_at=first)
        run(model, prompt, a.steps, a.k, torch.Generator().manual_seed(1), head, hooks=seen_spec, stop_at=first)
        result["first_module"] = next((name for name in seen_spec if name in seen_plain and
                                       seen_spec[name].shape == seen_plain[name].shape and
                                       not torch.equal(seen_spec[name], seen_plain[name])), None)
        result["max_logit_diff"] = float((plain[first] - spec[first]).abs().max())
    print(json.dumps(result))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
