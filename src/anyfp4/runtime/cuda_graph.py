"""Decode and verify steps of a model captured in CUDA graphs (explicit ``torch.cuda.CUDAGraph``, no
torch.compile): a step is then one graph replay instead of hundreds of kernel launches from Python.

``GraphedDecodeStep(model)`` is called like the model for steps of a few tokens, ``(tokens (b, t),
input_pos (t,), rope_pos (b, t) | None, key_valid (b, S) | None, hidden=False) -> logits`` (with ``hidden``,
also the final norm's output, as the model returns them), t <= 32 (t = 1: decode; t = k + 1: a speculative
verify pass). The first call for a shape / padding mode captures a graph
(after two warm-up runs on a side stream, which write the same cache slots the real step writes; recurrent
states, which a run advances, are put back as they were before the warm-ups);
later calls copy their inputs into the graph's static buffers and replay. All graphs of one model
share one memory pool. The returned tensors live in the graph's output buffers: they are valid until
the next call.

Graphs are valid for the KV cache tensors they were captured with (held here, compared by identity: a
new ``setup_caches`` drops them all). Kernel choices read inside the ops (``ANYFP4_KERNELS``,
``ANYFP4_ACT_PACK``) are fixed at capture; ``generate.forget_decode_graphs(model)`` drops the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dispatch.limits import DECODE_ROWS
from .model import Transformer


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor
    input_pos: torch.Tensor
    rope_pos: torch.Tensor | None
    key_valid: torch.Tensor | None
    logits: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    caches: list[torch.Tensor]


class GraphedDecodeStep:
    def __init__(self, model: Transformer):
        if model.device.type != "cuda":
            raise ValueError("CUDA graphs need a model on a CUDA device")
        self.model = model
        self._graphs: dict[tuple, _Captured] = {}
        self._pool = None

    def _capture(self, tokens, input_pos, rope_pos, key_valid, hidden: bool) -> _Captured:
        static = [t.clone() if t is not None else None for t in (tokens, input_pos, rope_pos, key_valid)]
        advanced = self.model.advancing_states()
        before = [t.clone() for t in advanced]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.model(*static, hidden=hidden)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # Nothing in flight, and only this thread's calls checked during capture: with tensor parallelism
        # NCCL's watchdog thread polls events of earlier collectives, which a "global" capture forbids.
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = self.model(*static, hidden=hidden)
        for t, saved in zip(advanced, before):
            t.copy_(saved)
        return _Captured(graph, *static, logits, self._caches())

    def _caches(self) -> list[torch.Tensor]:
        return [t for blk in self.model.blocks for t in blk.attn.state_tensors()]

    def _same_caches(self) -> bool:
        c = next(iter(self._graphs.values()), None)
        return c is not None and all(a is b for a, b in zip(c.caches, self._caches(), strict=True))

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, input_pos: torch.Tensor, rope_pos: torch.Tensor | None = None,
                 key_valid: torch.Tensor | None = None, hidden: bool = False):
        if tokens.shape[1] > DECODE_ROWS:
            raise ValueError(f"a graphed step takes at most {DECODE_ROWS} tokens per row, got {tokens.shape[1]}")
        key = (tuple(tokens.shape), rope_pos is not None, key_valid is not None,
               None if key_valid is None else tuple(key_valid.shape), hidden)
        if not self._same_caches():
            self._graphs, self._pool = {}, None  # release old graphs (and their cache references) first
        c = self._graphs.get(key)
        if c is None:
            c = self._graphs[key] = self._capture(tokens, input_pos, rope_pos, key_valid, hidden)
        c.tokens.copy_(tokens)
        c.input_pos.copy_(input_pos)
        if rope_pos is not None:
            c.rope_pos.copy_(rope_pos)
        if key_valid is not None:
            c.key_valid.copy_(key_valid)
        c.graph.replay()
        return c.logits
