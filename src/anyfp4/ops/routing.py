"""A mixture of experts' routing: ``route_topk(logits, k, normalize)`` -> each token's ``k`` most probable experts
(softmax of its router logits; highest first, ties to the lower index) as ids (rows, k) int32 and their
probabilities (rows, k) float32, renormalized over the k (added in rank order) when ``normalize``. On CUDA one
Triton launch (``kernels.triton.route_topk``); elsewhere the same steps in torch."""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import check_fake_devices
from .registry import linear_op


def _check(logits: Tensor, k: int) -> None:
    if logits.dim() != 2 or logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"route_topk: logits must be (rows, experts) fp16 / bf16 / fp32, got {tuple(logits.shape)} "
                         f"{logits.dtype}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"route_topk: k = {k} must be 1..{logits.shape[1]} (the experts)")


def route_reference(logits: Tensor, k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """The definition in torch: float32 softmax, top-k, the k weights added in rank order (the same bits in any
    batch: elementwise)."""
    weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    if normalize:
        total = weights[:, :1]
        for j in range(1, k):
            total = total + weights[:, j:j + 1]
        weights = weights / total
    return ids.to(torch.int32), weights


@linear_op("route_topk")
def route_topk(logits: Tensor, k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """logits (rows, experts) -> ids (rows, k) int32, weights (rows, k) float32."""
    _check(logits, k)
    if logits.is_cuda:
        from ..kernels.triton.route_topk import route_topk as launch

        return launch(logits if logits.stride(1) == 1 else logits.contiguous(), k, normalize)
    return route_reference(logits, k, normalize)


@route_topk.register_fake
def _(logits, k, normalize):
    check_fake_devices("route_topk", logits)
    rows = logits.shape[0]
    return (logits.new_empty(rows, k, dtype=torch.int32), logits.new_empty(rows, k, dtype=torch.float32))
