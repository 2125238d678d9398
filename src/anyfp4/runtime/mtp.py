"""A Qwen3.5 checkpoint's own multi-token-prediction head (``mtp.*``) as the draft for speculative decoding.

The head reads, at position p, the model's final-norm output h_p and the embedding of the token at p + 1, each
through its own (1 + w) RMSNorm; ``fc`` maps their concatenation [embedding, hidden] back to the model width; one
full-attention decoder layer (its own KV cache, the model's rotary tables) and a final norm follow, and the model's
``lm_head`` gives logits for the token at p + 2. The embeddings and the head are the model's. Further drafts feed
the head its own output and the token it drafted, one position on. On a GPU the head's steps replay CUDA graphs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from torch import nn

from .model import Block, RMSNorm, Transformer


class MTPHead(nn.Module):
    def __init__(self, fc: nn.Module, norm_embedding: RMSNorm, norm_hidden: RMSNorm, layer: Block, norm: RMSNorm):
        super().__init__()
        self.fc, self.norm_embedding, self.norm_hidden = fc, norm_embedding, norm_hidden
        self.layer, self.norm = layer, norm
        self.max_seq = 0

    def setup_caches(self, batch: int, max_seq: int, model: Transformer) -> None:
        self.layer.attn.setup_cache(batch, max_seq, model.dtype, model.device)
        self.max_seq = max_seq

    def forward(self, model: Transformer, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor):
        """tokens (b, t): the tokens after the positions ``input_pos`` (t,) whose model outputs are ``hidden``
        (b, t, hidden_size) -> (logits (b, t, vocab) float32 for the tokens two on, the head's own output)."""
        e = self.norm_embedding(torch.nn.functional.embedding(tokens, model.embed))
        x = self.fc(torch.cat([e, self.norm_hidden(hidden)], dim=-1))
        cos, sin, mask, _ = model.positions(input_pos, None, None, self.max_seq)
        x, delta = self.layer(x, None, cos, sin, mask, input_pos)
        out = self.norm.add_and_norm(x, delta)[1]
        return model.lm_head(out).float(), out


_GRAPHED: "weakref.WeakKeyDictionary[MTPHead, Callable]" = weakref.WeakKeyDictionary()


def graphed_head(head: MTPHead, model: Transformer) -> Callable:
    """What runs the head's steps: on CUDA its steps captured in CUDA graphs (``cuda_graph.GraphedHeadStep``),
    cached per head; on the CPU the head itself."""
    if model.device.type != "cuda":
        return lambda tokens, hidden, input_pos: head(model, tokens, hidden, input_pos)
    if head not in _GRAPHED:
        from .cuda_graph import GraphedHeadStep

        _GRAPHED[head] = GraphedHeadStep(head, model)
    return _GRAPHED[head]


class MTPDrafter:
    """Drafts from the head, its KV cache kept in step with the accepted tokens: each verify step's model outputs
    (every position up to the accepted ones) re-run through the head, whose last output starts the next drafts."""

    def __init__(self, head: MTPHead, model: Transformer):
        self.head, self.model = head, model
        self.step = graphed_head(head, model)
        self.next_logits: torch.Tensor | None = None  # (vocab,): the head's guess for the token after the next
        self.next_hidden: torch.Tensor | None = None
        self.next_pos = 0

    def start(self, total: int) -> None:
        self.head.setup_caches(1, total, self.model)

    def observe(self, tokens: Sequence[int], hidden: torch.Tensor, start: int) -> None:
        """The model's outputs ``hidden`` (1, n, hidden_size) at positions start .. start + n - 1, and the tokens
        that follow each (``tokens``, n of them: the last one the token just sampled)."""
        dev = self.model.device
        pos = torch.arange(start, start + len(tokens), device=dev)
        logits, out = self.step(torch.tensor([list(tokens)], device=dev), hidden, pos)
        self.next_logits, self.next_hidden, self.next_pos = logits[0, -1], out[:, -1:], start + len(tokens)

    def draft(self, k: int) -> list[int]:
        """k greedy drafts after the last observed token."""
        dev = self.model.device
        out = [int(self.next_logits.argmax())]
        hidden, pos = self.next_hidden, self.next_pos
        for _ in range(k - 1):
            logits, hidden = self.step(torch.tensor([[out[-1]]], device=dev), hidden, torch.tensor([pos], device=dev))
            out.append(int(logits[0, -1].argmax()))
            pos += 1
        return out
