"""Decode and verify steps of a model, and the steps of its multi-token-prediction head, captured in CUDA graphs
(explicit ``torch.cuda.CUDAGraph``, no torch.compile): a step is then one graph replay instead of hundreds of
kernel launches from Python.

``GraphedDecodeStep(model)`` is called like the model for steps of a few tokens, ``(tokens (b, t),
input_pos (t,), rope_pos (b, t) | None, key_valid (b, S) | None, hidden=False, last=False) -> logits`` (with
``hidden``, also the final norm's output; with ``last``, the last position's logits only; as the model returns
them), t <= 32 (t = 1: decode; t = k + 1: a speculative verify pass; a prompt's steps, ``prompt.run_prompt``).
``GraphedHeadStep(head, model)`` is called like the head, ``(tokens (1, t), hidden (1, t, H), input_pos (t,)) ->
(logits, output)``; more than 32 tokens (the prompt) run eagerly.

The first call for a shape / padding mode captures a graph (after two warm-up runs on a side stream, which
write the same cache slots the real step writes; recurrent states, which a run advances, are put back as they
were before the warm-ups); later calls copy their inputs into the graph's static buffers and replay. The graphs of
one step share one memory pool. The returned tensors live in the graph's output buffers: they are valid until
the next call of the same shape.

Graphs are valid for the cache and state tensors they were captured with (held here, compared by identity: a
new ``setup_caches`` drops them all). Kernel choices read inside the ops (``ANYFP4_KERNELS``,
``ANYFP4_ACT_PACK``) are fixed at capture; ``generate.forget_decode_graphs(model)`` drops the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..dispatch.limits import DECODE_ROWS
from .model import Transformer


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor | None]
    outputs: object


class _Graphs:
    """Captured graphs of one step function by input key, over the tensors ``held`` returns."""

    def __init__(self):
        self._graphs: dict[tuple, _Captured] = {}
        self._pool = None
        self._held: list[torch.Tensor] | None = None

    def replay(self, key: tuple, inputs: list, run: Callable, held: list[torch.Tensor],
               advancing: list[torch.Tensor]):
        """``run(*static inputs)`` replayed for ``inputs`` (tensors or None); ``advancing``: the held tensors a run
        advances (restored after the warm-ups of a capture)."""
        if self._held is None or len(held) != len(self._held) or any(a is not b for a, b in zip(held, self._held)):
            self._graphs, self._pool = {}, None  # release old graphs (and their tensor references) first
            self._held = held
        c = self._graphs.get(key)
        if c is None:
            c = self._graphs[key] = self._capture(inputs, run, advancing)
        for static, x in zip(c.inputs, inputs):
            if x is not None:
                static.copy_(x)
        c.graph.replay()
        return c.outputs

    def _capture(self, inputs: list, run: Callable, advancing: list[torch.Tensor]) -> _Captured:
        static = [t.clone() if t is not None else None for t in inputs]
        before = [t.clone() for t in advancing]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                run(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # Nothing in flight, and only this thread's calls checked during capture: with tensor parallelism
        # NCCL's watchdog thread polls events of earlier collectives, which a "global" capture forbids.
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            outputs = run(*static)
        for t, saved in zip(advancing, before):
            t.copy_(saved)
        return _Captured(graph, static, outputs)


class GraphedDecodeStep:
    def __init__(self, model: Transformer):
        if model.device.type != "cuda":
            raise ValueError("CUDA graphs need a model on a CUDA device")
        self.model = model
        self._graphs = _Graphs()

    def _caches(self) -> list[torch.Tensor]:
        return [t for blk in self.model.blocks for t in blk.attn.state_tensors()]

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, input_pos: torch.Tensor, rope_pos: torch.Tensor | None = None,
                 key_valid: torch.Tensor | None = None, hidden: bool = False, last: bool = False):
        if tokens.shape[1] > DECODE_ROWS:
            raise ValueError(f"a graphed step takes at most {DECODE_ROWS} tokens per row, got {tokens.shape[1]}")
        key = (tuple(tokens.shape), rope_pos is not None, key_valid is not None,
               None if key_valid is None else tuple(key_valid.shape), hidden, last)
        return self._graphs.replay(key, [tokens, input_pos, rope_pos, key_valid],
                                   lambda *s: self.model(*s, hidden=hidden, last=last), self._caches(),
                                   self.model.advancing_states())


class GraphedHeadStep:
    """A multi-token-prediction head's steps of up to DECODE_ROWS tokens, one graph per token count (valid for
    the head's KV cache); longer calls run eagerly."""

    def __init__(self, head, model: Transformer):
        if model.device.type != "cuda":
            raise ValueError("CUDA graphs need a model on a CUDA device")
        self.head, self.model = head, model
        self._graphs = _Graphs()

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, hidden: torch.Tensor, input_pos: torch.Tensor):
        if tokens.shape[1] > DECODE_ROWS:
            return self.head(self.model, tokens, hidden, input_pos)
        return self._graphs.replay((tuple(tokens.shape), tuple(hidden.shape)), [tokens, hidden, input_pos],
                                   lambda *s: self.head(self.model, *s), self.head.layer.attn.state_tensors(), [])
