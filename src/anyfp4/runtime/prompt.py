"""A prompt's forward pass: one forward over all its tokens, or — with ``ANYFP4_PREFILL=chunked`` on a GPU — a
run of steps of a few tokens per row through the captured decode step (``generate.decode_step``).

``ANYFP4_PREFILL=chunked`` promises rows whose bits depend neither on the prompt's length nor on the other prompts
of a batch. Every kernel of a step of at most DECODE_ROWS rows gives that: the decode kernels' rows, the decode
attention's rows (``small_attention``: a row's bits do not depend on the call's positions, and a padding position,
which sees no key, gets zeros), the norms and the Gated DeltaNet step kernels (token by token, padding tokens
masked). So a prompt run as such steps is a prompt alone or in a batch alike, and each step is one graph replay
instead of a few thousand kernel launches from Python: a left-padded batch of 16 chat prompts is ~25 replays.
The steps take DECODE_ROWS // rows tokens per row (at least one); the first takes the remainder, so a prompt
runs in the same few step shapes whatever its length (each captured once per cache, ``cuda_graph``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..dispatch.limits import DECODE_ROWS
from .model import Transformer


def prompt_step_tokens(model: Transformer, rows: int) -> int | None:
    """Tokens per row of each step a prompt of ``rows`` rows runs in, or None: the whole prompt in one forward.
    Steps where the model is on a GPU and ``ANYFP4_PREFILL=chunked`` asks for rows independent of the prompt."""
    from ..env import prefill_mode

    if model.device.type != "cuda" or prefill_mode() != "chunked":
        return None
    return max(1, DECODE_ROWS // rows)


def step_bounds(total: int, step_tokens: int) -> list[tuple[int, int]]:
    """The [start, end) token ranges of a ``total``-token prompt in steps of ``step_tokens``: the remainder first,
    then whole steps."""
    if total < 1 or step_tokens < 1:
        raise ValueError(f"a prompt of {total} tokens cannot run in steps of {step_tokens}")
    first = total % step_tokens or step_tokens
    return [(0, first)] + [(s, s + step_tokens) for s in range(first, total, step_tokens)]


@torch.no_grad()
def run_prompt(model: Transformer, tokens: torch.Tensor, step: Callable, step_tokens: int | None,
               rope_pos: torch.Tensor | None = None, key_valid: torch.Tensor | None = None, hidden: bool = False):
    """tokens (b, T) into cache slots 0..T-1 -> the last position's logits (b, 1, vocab) float32; with ``hidden``,
    (logits, the final norm's output at every position (b, T, hidden_size)). ``rope_pos`` / ``key_valid``: a
    left-padded batch's, as ``Transformer.forward`` takes them. ``step_tokens`` None: one forward of the model;
    else steps of that many tokens per row through ``step`` (called like the model, ``hidden`` and ``last`` by
    keyword; the head runs on each step's last position only: its rows' bits do not depend on their count)."""
    total = tokens.shape[1]
    device = tokens.device
    if step_tokens is None:
        return model(tokens, torch.arange(total, device=device), rope_pos, key_valid, hidden=hidden, last=True)
    finals = []
    for start, end in step_bounds(total, step_tokens):
        out = step(tokens[:, start:end], torch.arange(start, end, device=device),
                   None if rope_pos is None else rope_pos[:, start:end], key_valid, hidden=hidden, last=True)
        logits, final = out if hidden else (out, None)
        if hidden:  # a captured step's outputs are overwritten by its next replay
            finals.append(final.clone())
    logits = logits.clone()
    return (logits, torch.cat(finals, dim=1)) if hidden else logits
