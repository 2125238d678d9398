"""The one-token decode step of a model captured in a CUDA graph (explicit ``torch.cuda.CUDAGraph``, no
torch.compile): a step is then one graph replay instead of hundreds of kernel launches from Python.

``GraphedDecodeStep(model)`` is called like the model for decode steps, ``(tokens (b, 1), input_pos (1,),
rope_pos (b, 1) | None, key_valid (b, S) | None) -> logits``. The first call for a batch size / padding
mode / KV cache captures a graph (after two warm-up runs on a side stream, which write the same cache slot
the real step writes); later calls copy their inputs into the graph's static buffers and replay. The
returned logits live in the graph's output buffer: they are valid until the next call.

A graph is valid for the KV cache tensors it was captured with (held here, compared by identity: a new
``setup_caches`` means a new capture). Kernel choices read inside the ops (``ANYFP4_KERNELS``,
``ANYFP4_ACT_PACK``) are fixed at capture; ``generate.forget_decode_graphs(model)`` drops the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import Transformer


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor
    input_pos: torch.Tensor
    rope_pos: torch.Tensor | None
    key_valid: torch.Tensor | None
    logits: torch.Tensor
    caches: list[torch.Tensor]


class GraphedDecodeStep:
    def __init__(self, model: Transformer):
        if model.device.type != "cuda":
            raise ValueError("CUDA graphs need a model on a CUDA device")
        self.model = model
        self._key = None
        self._captured: _Captured | None = None

    def _capture(self, tokens, input_pos, rope_pos, key_valid) -> _Captured:
        static = [t.clone() if t is not None else None for t in (tokens, input_pos, rope_pos, key_valid)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.model(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.model(*static)
        return _Captured(graph, *static, logits, self._caches())

    def _caches(self) -> list[torch.Tensor]:
        return [t for blk in self.model.blocks for t in (blk.attn.k_cache, blk.attn.v_cache)]

    def _valid_for(self, key) -> bool:
        c = self._captured
        return (c is not None and key == self._key
                and all(a is b for a, b in zip(c.caches, self._caches(), strict=True)))

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, input_pos: torch.Tensor, rope_pos: torch.Tensor | None = None,
                 key_valid: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.shape[1] != 1:
            raise ValueError(f"a graphed decode step takes one token per row, got {tokens.shape[1]}")
        key = (tuple(tokens.shape), rope_pos is not None, key_valid is not None,
               None if key_valid is None else tuple(key_valid.shape))
        if not self._valid_for(key):
            self._captured, self._key = None, None  # release the old graph (and its cache references) first
            self._captured, self._key = self._capture(tokens, input_pos, rope_pos, key_valid), key
        c = self._captured
        c.tokens.copy_(tokens)
        c.input_pos.copy_(input_pos)
        if rope_pos is not None:
            c.rope_pos.copy_(rope_pos)
        if key_valid is not None:
            c.key_valid.copy_(key_valid)
        c.graph.replay()
        return c.logits
