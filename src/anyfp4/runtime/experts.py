"""A mixture-of-experts MLP (Qwen3-MoE, Mixtral): a float router scores the experts of each token, the token's
``top_k`` highest (softmax probabilities, renormalized over the k when the config says so) each run a SwiGLU expert
(``nn.linear.GatedMLP``, any weight format), and their outputs are summed with those weights.

Two ways to run the experts, with the same bits for each row (each expert's rows through the same row-independent
ops): eagerly, each expert that some token picked over just its rows (what a step reads is the weights of the
experts picked: the CPU path, and a GPU's until the grouped kernels); and while a CUDA graph is captured or
torch.compile traces, every expert over every row with the unpicked ones weighted by zero, which needs no host
value (slower by experts / top_k, correct). A token's k outputs are added in float32 in the order of their rank, so
a row's sum does not depend on which other rows share the call.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import MoEShape


class MixtureOfExperts(nn.Module):
    def __init__(self, shape: MoEShape, router: nn.Module, experts: list[nn.Module]):
        super().__init__()
        if len(experts) != shape.experts:
            raise ValueError(f"{len(experts)} experts built for a config of {shape.experts}")
        self.shape, self.router, self.experts = shape, router, nn.ModuleList(experts)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (n, hidden) -> each row's top_k expert ids (n, k) and weights (n, k) float32, highest first."""
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.shape.top_k, dim=-1)
        if self.shape.norm_topk_prob:
            total = weights[:, :1]
            for j in range(1, self.shape.top_k):  # in rank order, elementwise: the same bits in any batch
                total = total + weights[:, j:j + 1]
            weights = weights / total
        return ids, weights

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
        if torch.compiler.is_compiling() or (flat.is_cuda and torch.cuda.is_current_stream_capturing()):
            picked = self._every_expert(flat, ids)
        else:
            picked = self._picked_experts(flat, ids)
        out = picked[:, 0].float() * weights[:, :1]
        for j in range(1, self.shape.top_k):
            out = out + picked[:, j].float() * weights[:, j:j + 1]
        return out.reshape(*lead, hidden)

    def _picked_experts(self, flat: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(n, k, hidden): row r's slot j holds expert ids[r, j]'s output for row r; each picked expert runs once,
        over its rows."""
        picked = flat.new_empty(flat.shape[0], self.shape.top_k, flat.shape[1])
        for e in torch.unique(ids).tolist():
            rows, slots = (ids == e).nonzero(as_tuple=True)
            picked[rows, slots] = self.experts[e](flat[rows])
        return picked

    def _every_expert(self, flat: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """As ``_picked_experts`` with no host value: every expert over every row, each slot taking its expert's."""
        picked = flat.new_zeros(flat.shape[0], self.shape.top_k, flat.shape[1])
        for e, expert in enumerate(self.experts):
            y = expert(flat)
            picked = torch.where((ids == e)[..., None], y[:, None, :], picked)
        return picked
