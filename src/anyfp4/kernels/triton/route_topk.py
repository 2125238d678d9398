"""A mixture of experts' routing in one launch: each token's softmax over the router's logits, its ``k`` most
probable experts (highest first) and their probabilities, renormalized over the k when asked — where the eager
form is a float32 copy, a softmax, a top-k (a selection and a sort), k - 1 sums, a division and an int32 copy.

Anatomy: ``@triton.jit`` kernel, launcher. One program per token (a row's results do not depend on the other rows
of the call). Ties between equal probabilities go to the lower expert index; a NaN probability ranks first (as in
torch.topk) and keeps its NaN weight, so a row that overflowed still picks experts it has (the expert kernels read
the ids as addresses). The k weights are added in rank order (``w0 + w1 + ...``) and divided with IEEE rounding, as
the eager form does; the probabilities themselves come from the GPU's ``exp``, within a few float32 ulps of torch's
softmax.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import early_launch_args, wait_for_previous_kernel


@triton.jit
def route_topk_kernel(logits_ptr, ids_ptr, weights_ptr, E, stride_l, stride_i, stride_w,
                      K: tl.constexpr, K_POW2: tl.constexpr, BLOCK_E: tl.constexpr, NORMALIZE: tl.constexpr,
                      EARLY: tl.constexpr):
    wait_for_previous_kernel(EARLY)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    inside = cols < E
    logits = tl.load(logits_ptr + row * stride_l + cols, mask=inside, other=-float("inf")).to(tl.float32)
    top = tl.max(logits, 0)
    e = tl.where(inside, tl.exp(logits - top), 0.0)
    probs = tl.math.div_rn(e, tl.sum(e, 0))
    # the order experts are picked in: a NaN probability (NaN or infinite logits) above every number, as torch.topk
    # has it, so that every pick is an expert of the row (never an index past it); padding below every probability
    key = tl.where(inside, tl.where(probs == probs, probs, 2.0), -1.0)
    slots = tl.arange(0, K_POW2)
    picked_ids = tl.zeros((K_POW2,), dtype=tl.int32)
    picked = tl.zeros((K_POW2,), dtype=tl.float32)
    total = 0.0
    for j in tl.static_range(K):
        idx = tl.min(tl.where(key == tl.max(key, 0), cols, BLOCK_E), 0)
        idx = tl.minimum(idx, E - 1)
        best = tl.sum(tl.where(cols == idx, probs, 0.0), 0)  # its probability (NaN stays NaN)
        picked_ids = tl.where(slots == j, idx, picked_ids)
        picked = tl.where(slots == j, best, picked)
        total = best if j == 0 else total + best
        key = tl.where(cols == idx, -2.0, key)
    if NORMALIZE:
        picked = tl.math.div_rn(picked, tl.zeros((K_POW2,), dtype=tl.float32) + total)
    keep = slots < K
    tl.store(ids_ptr + row * stride_i + slots, picked_ids, mask=keep)
    tl.store(weights_ptr + row * stride_w + slots, picked, mask=keep)


def route_topk(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (rows, E) with unit stride along E -> ids (rows, k) int32, weights (rows, k) float32. Checked by the
    op."""
    rows, experts = logits.shape
    ids = torch.empty(rows, k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
    if rows:
        block = triton.next_power_of_2(experts)
        route_topk_kernel[(rows,)](
            logits, ids, weights, experts, logits.stride(0), ids.stride(0), weights.stride(0),
            K=k, K_POW2=triton.next_power_of_2(k), BLOCK_E=block, NORMALIZE=normalize,
            num_warps=1 if block <= 256 else 4, **early_launch_args(logits.device))
    return ids, weights
