"""Speculative decoding, one sequence. Drafts come from prompt lookup (n-gram) or from a small draft
model sharing the tokenizer.

Prompt lookup drafts up to k tokens by finding the latest earlier occurrence of the sequence's last
n tokens (longest n first) and copying what followed it; a draft model proposes its own k greedy
tokens (its static cache catches up on the accepted tokens first). One forward pass of M = 1 + drafts rows
verifies them. Greedy: drafted tokens are kept while they equal the model's own greedy choice, and the
first disagreement is replaced by that choice. Sampling: both drafters propose a token that is a
deterministic function of the context, so the rejection rule keeps the target distribution p exactly:
keep draft x with probability p(x); on rejection sample from p with x removed (renormalized); after
the last kept draft sample the bonus token from p (``accept_or_resample``). The static KV cache needs
no explicit rollback: rejected entries sit at positions the causal mask hides until real tokens
overwrite them. On a GPU each verify pass of M rows replays a CUDA graph captured for that M.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

import torch

from .generate import MAX_DRAFT_TOKENS, SamplingParams, cache_slots, check_context, decode_step, probabilities, sample
from .config import LINEAR_ATTENTION
from .model import Transformer
from .mtp import MTPDrafter, MTPHead
from .prompt import prompt_step_tokens, run_prompt


def accept_or_resample(p: torch.Tensor, draft: int, generator: torch.Generator | None) -> tuple[bool, int]:
    """One step of the rejection rule for a deterministic draft ``draft`` under target distribution p
    (vocab,): (accepted, token). The token is distributed exactly as p."""
    u = torch.rand((), generator=generator, device=p.device)
    if bool(u < p[draft]):
        return True, draft
    rest = p.clone()
    rest[draft] = 0
    if float(rest.sum()) <= 0:  # p is all on the draft; u < 1 = p[draft] cannot fail, but stay safe
        return True, draft
    return False, int(torch.multinomial(rest / rest.sum(), 1, generator=generator))


def ngram_draft(seq: Sequence[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest suffix n-gram."""
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        suffix = list(seq[-n:])
        for start in range(len(seq) - n - 1, -1, -1):
            if list(seq[start:start + n]) == suffix:
                follow = list(seq[start + n:start + n + k])
                if follow:
                    return follow
    return []


@dataclass
class SpecStats:
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_per_step: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        """Mean drafted tokens accepted per verify step."""
        return self.accepted / self.verify_steps if self.verify_steps else 0.0


class DraftModel:
    """Greedy drafts from a smaller model; its KV cache is kept in step with the accepted tokens."""

    def __init__(self, model: Transformer, target: Transformer):
        if model.args.vocab_size != target.args.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({model.args.vocab_size}) differs from the target's "
                             f"({target.args.vocab_size}); it must share the tokenizer")
        self.model = model
        self.valid = 0  # cache positions holding the right tokens

    def start(self, total: int) -> None:
        self.model.setup_caches(1, total)
        self.valid = 0

    def _feed(self, tokens: Sequence[int], start: int) -> torch.Tensor:
        dev = self.model.device
        return self.model(torch.tensor([list(tokens)], device=dev), torch.arange(start, start + len(tokens), device=dev))

    def draft(self, seq: Sequence[int], k: int) -> list[int]:
        """k tokens after ``seq``; on return the cache holds seq plus the first k - 1 drafts."""
        if self.valid < len(seq) - 1:  # catch up on accepted tokens the draft has not seen
            self._feed(seq[self.valid:len(seq) - 1], self.valid)
        logits = self._feed([seq[-1]], len(seq) - 1)
        out = [int(logits[0, -1].argmax())]
        for i in range(k - 1):
            logits = self._feed([out[-1]], len(seq) + i)
            out.append(int(logits[0, -1].argmax()))
        self.valid = len(seq) + k - 1
        return out

    def accepted(self, seq_len_before: int, accepted: int, k: int) -> None:
        """``accepted`` of the k drafts after a sequence of ``seq_len_before`` tokens were kept."""
        self.valid = seq_len_before + min(accepted, k - 1)


def check_exact_verify(model: Transformer) -> None:
    """Refuse speculation where a verify pass's rows would not get the bits of one-token steps: quantized layers
    on a GPU whose decode calls the CUDA decode kernel does not take (``dispatch.policy.decode_rows_invariant``)."""
    from ..nn.linear import FP8Linear, NVFP4Linear

    if model.device.type != "cuda" or not any(isinstance(m, (NVFP4Linear, FP8Linear)) for m in model.modules()):
        return
    from ..dispatch.policy import decode_rows_invariant
    from ..kernels.cuda import weight_mma
    from ..kernels.device import device_arch

    sm = device_arch(model.device.index if model.device.index is not None else torch.cuda.current_device())[0]
    if not decode_rows_invariant(sm, weight_mma.enabled(sm, model.dtype)):
        raise NotImplementedError(
            f"speculative decoding of quantized layers on sm_{sm} with {str(model.dtype).replace('torch.', '')} "
            f"activations: the Triton decode kernels give a verify pass's rows other bits than one-token steps, so "
            f"its greedy text would not be plain decoding's; it needs the CUDA decode kernels (sm_80+, or sm_75 with "
            f"--dtype fp16, NVRTC, ANYFP4_KERNELS not triton)")


@torch.no_grad()
def generate_speculative(model: Transformer, prompt: Sequence[int], params: SamplingParams, draft_tokens: int,
                         draft_model: Transformer | None = None,
                         on_tokens: Callable[[list[int]], None] | None = None,
                         mtp: MTPHead | None = None) -> tuple[list[int], SpecStats]:
    """Generation with speculation: greedy gives the same tokens as ``generate`` (on a GPU bit for bit: a
    row of a verify pass is computed as a one-token step computes it); sampling keeps the target
    distribution. ``on_tokens`` receives each step's new tokens as they are accepted. Drafts come from
    ``draft_model``, from the checkpoint's own multi-token-prediction head ``mtp``, or else from n-grams."""
    if not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
        raise ValueError(f"draft_tokens must be between 1 and {MAX_DRAFT_TOKENS}")
    if draft_model is not None and LINEAR_ATTENTION in draft_model.args.layer_types:
        raise NotImplementedError(f"a draft model with Gated DeltaNet layers ({draft_model.args.architecture}) is not "
                                  "supported: n-gram drafts, or a draft model without them")
    device = model.device
    check_exact_verify(model)
    check_context(len(prompt), params.max_new_tokens, model.args.max_position_embeddings, draft_tokens)
    total = len(prompt) + params.max_new_tokens + draft_tokens + 1
    slots = cache_slots(model, len(prompt), params.max_new_tokens)
    model.setup_caches(1, slots)
    model.setup_snapshots(draft_tokens + 1)  # Gated DeltaNet layers: back to a verify step's accepted prefix
    if draft_model is not None and mtp is not None:
        raise ValueError("draft from a draft model or from the MTP head, not both")
    drafter = DraftModel(draft_model, model) if draft_model is not None else None
    if drafter is not None:
        drafter.start(total)
    heads = MTPDrafter(mtp, model) if mtp is not None else None
    if heads is not None:
        heads.start(slots)  # the model's length: later generations of about this one's reuse the head's graphs
    stats = SpecStats()
    greedy = params.temperature == 0
    generator = None
    if not greedy and params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    # the MTP head reads the model's final-norm outputs too
    verify = partial(decode_step(model), hidden=heads is not None)
    logits = run_prompt(model, torch.tensor([list(prompt)], device=device), decode_step(model),
                        prompt_step_tokens(model, 1), hidden=heads is not None)
    if heads is not None:
        logits, hidden = logits
    out = [int(sample(logits[:, -1], params, generator))]
    if heads is not None:
        heads.observe(list(prompt[1:]) + out, hidden, 0)
    if on_tokens is not None:
        on_tokens(out[:])
    pos = len(prompt)  # cache slot of out[-1], not yet written
    stops = set(params.stop_token_ids)
    while len(out) < params.max_new_tokens and out[-1] not in stops:
        room = params.max_new_tokens - len(out)
        seq = list(prompt) + out
        k = min(draft_tokens, room)
        if heads is not None:
            draft = heads.draft(k)
        else:
            draft = drafter.draft(seq, k) if drafter is not None else ngram_draft(seq, k)
        inp = torch.tensor([[out[-1]] + draft], device=device)
        logits = verify(inp, torch.arange(pos, pos + inp.shape[1], device=device))
        if heads is not None:
            logits, hidden = logits
        accepted = 0
        if greedy:
            preds = logits[0].argmax(-1).tolist()
            while accepted < len(draft) and draft[accepted] == preds[accepted]:
                accepted += 1
            new = draft[:accepted] + [preds[accepted]]
        else:
            probs = probabilities(logits[0], params)
            new = []
            for i, x in enumerate(draft):
                ok, tok = accept_or_resample(probs[i], x, generator)
                new.append(tok)
                if not ok:
                    break
                accepted += 1
            if accepted == len(draft):
                new.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
        model.keep_states(accepted + 1, inp.shape[1])  # the verified token and the accepted drafts
        if heads is not None:  # the head sees the model's outputs up to the accepted drafts, and the new token
            heads.observe(draft[:accepted] + [new[accepted]], hidden[:, :accepted + 1], pos)
        if drafter is not None:
            drafter.accepted(len(seq), accepted, len(draft))
        stats.verify_steps += 1
        stats.drafted += len(draft)
        stats.accepted += accepted
        stats.accepted_per_step.append(accepted)
        kept = []
        for t in new:
            kept.append(t)
            if t in stops or len(out) + len(kept) == params.max_new_tokens:
                break
        out.extend(kept)
        if on_tokens is not None:
            on_tokens(kept)
        pos += accepted + 1
    return out, stats
