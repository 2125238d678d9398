"""A mixture-of-experts MLP (Qwen3-MoE, Mixtral): a float router scores the experts of each token, the token's
``top_k`` highest (softmax probabilities, renormalized over the k when the config says so) each run a SwiGLU expert
(``nn.linear.GatedMLP``, any weight format), and their outputs are summed with those weights.

How the experts run:

- on a GPU, up to DECODE_ROWS tokens (decode and verify steps) with NVFP4 experts whose gate and up share a global
  scale, FP8 experts or float experts: ``StackedQuantizedExperts`` / ``StackedDenseExperts``, two launches of
  ``torch.ops.anyfp4.nvfp4_experts`` / ``fp8_experts`` / ``dense_experts`` for every (token, expert) pair (gated
  gate / up, then down), the routing read on the GPU — the same launches eagerly and in a CUDA graph;
- otherwise eagerly, each expert that some token picked over just its rows (the CPU path: a step reads the weights
  of the experts picked);
- otherwise while a CUDA graph is captured or torch.compile traces, every expert over every row with the unpicked
  ones weighted by zero, which needs no host value (slower by experts / top_k; the same row-independent ops as the
  eager path, so the same bits).

A token's k outputs are added in float32 in the order of their rank (``torch.ops.anyfp4.weighted_slots``: one launch
on a GPU), so a row's sum does not depend on which other rows share the call.
"""

from __future__ import annotations

import torch
from torch import nn

from ..dispatch.limits import DECODE_ROWS
from ..nn.linear import DenseLinear, FP8Linear, NVFP4Linear
from .config import MoEShape


class StackedQuantizedExperts(nn.Module):
    """A mixture's NVFP4 or FP8 experts (gate and up in one gated prepack, a plain down, no biases) as prepacks
    stacked along a leading expert dimension for the grouped op; each expert's own buffers become views of the
    stacks (no second copy)."""

    # per format: the prepack buffers the op takes (in its argument order) and the op
    BUFFERS = {NVFP4Linear: ("codes", "scales", "global_scale"), FP8Linear: ("codes", "scales")}
    OPS = {NVFP4Linear: "nvfp4_experts", FP8Linear: "fp8_experts"}

    def __init__(self, experts: list[nn.Module]):
        super().__init__()
        first = experts[0]
        self.kind = type(first.down)
        self.intermediate, self.up_offset = first.gated.out_features, first.gated.up_offset
        self.hidden = first.gated.in_features
        for part, layers in (("gate_up", [e.gated for e in experts]), ("down", [e.down for e in experts])):
            for name in self.BUFFERS[self.kind]:
                stack = torch.stack([getattr(m, name) for m in layers])
                for e, m in enumerate(layers):
                    setattr(m, name, stack[e])
                self.register_buffer(f"{part}_{name}", stack)

    @classmethod
    def fit(cls, experts: list[nn.Module]) -> bool:
        """Whether every expert is NVFP4 (or every one FP8) with gate and up in one gated prepack."""
        kind = type(experts[0].down)
        return kind in cls.BUFFERS and all(
            isinstance(e.gated, kind) and e.gated.up_offset and isinstance(e.down, kind) and e.down.bias is None
            for e in experts)

    def _stacks(self, part: str) -> list[torch.Tensor]:
        # a global scale per expert: (E, 1) stacked, (E,) for the op
        return [getattr(self, f"{part}_{n}").view(-1) if n == "global_scale" else getattr(self, f"{part}_{n}")
                for n in self.BUFFERS[self.kind]]

    def forward(self, flat: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """flat (n, hidden), ids (n, k) -> (n, k, hidden): expert ids[r, j]'s output for row r in slot j."""
        pairs = ids.reshape(-1).to(torch.int32)
        op = getattr(torch.ops.anyfp4, self.OPS[self.kind])
        h = op(flat, pairs, *self._stacks("gate_up"), self.up_offset, self.intermediate, self.hidden)
        y = op(h, pairs, *self._stacks("down"), 0, self.hidden, self.intermediate)
        return y.view(*ids.shape, self.hidden)


class StackedDenseExperts(nn.Module):
    """A mixture's float experts (gate / up as one layer, down, no biases) as stacked weights for the grouped op."""

    def __init__(self, experts: list[nn.Module]):
        super().__init__()
        first = experts[0]
        self.intermediate, self.hidden = first.intermediate, first.down.weight.shape[0]
        for name, layers in (("gate_up", [e.gate_up for e in experts]), ("down", [e.down for e in experts])):
            stack = torch.stack([m.weight for m in layers])
            for e, m in enumerate(layers):
                m.weight = stack[e]
            self.register_buffer(name, stack)

    @staticmethod
    def fit(experts: list[nn.Module]) -> bool:
        """Whether every expert is float with gate and up as one layer."""
        return all(isinstance(e.gate_up, DenseLinear) and isinstance(e.down, DenseLinear) and e.gate_up.bias is None
                   and e.down.bias is None for e in experts)

    def forward(self, flat: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        pairs = ids.reshape(-1).to(torch.int32)
        h = torch.ops.anyfp4.dense_experts(flat, pairs, self.gate_up, True, self.intermediate, self.hidden)
        y = torch.ops.anyfp4.dense_experts(h, pairs, self.down, False, self.hidden, self.intermediate)
        return y.view(*ids.shape, self.hidden)


def stacked_experts(experts: list[nn.Module]) -> nn.Module | None:
    """The grouped form of a mixture's experts on a GPU (NVFP4, FP8 or float; None for others, or on the CPU)."""
    probe = experts[0].down
    weight = probe.codes if isinstance(probe, (NVFP4Linear, FP8Linear)) else getattr(probe, "weight", None)
    if weight is None or not weight.is_cuda:
        return None
    for kind in (StackedQuantizedExperts, StackedDenseExperts):
        if kind.fit(experts):
            return kind(experts)
    return None


class MixtureOfExperts(nn.Module):
    def __init__(self, shape: MoEShape, router: nn.Module, experts: list[nn.Module]):
        super().__init__()
        if len(experts) != shape.experts:
            raise ValueError(f"{len(experts)} experts built for a config of {shape.experts}")
        self.shape, self.router, self.experts = shape, router, nn.ModuleList(experts)
        self.stacked = stacked_experts(experts)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (n, hidden) -> each row's top_k expert ids (n, k) int32 and weights (n, k) float32, highest first."""
        return torch.ops.anyfp4.route_topk(self.router(x), self.shape.top_k, self.shape.norm_topk_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.partial(x).to(x.dtype)

    def scale_partial(self, total: torch.Tensor) -> torch.Tensor:
        """Tensor parallelism: the ranks' ``partial`` sums added up need nothing more (``AllReduce``)."""
        return total

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """The weighted sum of each token's experts in float32 (a tensor-parallel rank's share: its slices of every
        expert's hidden units)."""
        lead, hidden = x.shape[:-1], x.shape[-1]
        flat = x.reshape(-1, hidden)
        ids, weights = self.route(flat)
        return weighted_experts(self.experts, self.stacked, flat, ids, weights).reshape(*lead, hidden)


def weighted_experts(experts: nn.ModuleList, stacked: nn.Module | None, flat: torch.Tensor, ids: torch.Tensor,
                     weights: torch.Tensor) -> torch.Tensor:
    """flat (n, hidden), each row's expert ids (n, k) and weights (n, k) -> the weighted sums (n, hidden) float32,
    the k terms added in slot order. ``stacked``: the experts' grouped form (``stacked_experts``) or None."""
    if stacked is not None and flat.is_cuda and flat.shape[0] <= DECODE_ROWS:
        picked = stacked(flat, ids)
    elif torch.compiler.is_compiling() or (flat.is_cuda and torch.cuda.is_current_stream_capturing()):
        picked = every_expert(experts, flat, ids)
    else:
        picked = picked_experts(experts, flat, ids)
    return torch.ops.anyfp4.weighted_slots(picked, weights.float())


def picked_experts(experts: nn.ModuleList, flat: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(n, k, hidden): row r's slot j holds expert ids[r, j]'s output for row r; each picked expert runs once, over
    its rows."""
    picked = flat.new_empty(flat.shape[0], ids.shape[1], flat.shape[1])
    for e in torch.unique(ids).tolist():
        rows, slots = (ids == e).nonzero(as_tuple=True)
        picked[rows, slots] = experts[e](flat[rows])
    return picked


def every_expert(experts: nn.ModuleList, flat: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """As ``picked_experts`` with no host value: every expert over every row, each slot taking its expert's."""
    picked = flat.new_zeros(flat.shape[0], ids.shape[1], flat.shape[1])
    for e, expert in enumerate(experts):
        y = expert(flat)
        picked = torch.where((ids == e)[..., None], y[:, None, :], picked)
    return picked
