"""A mixture of experts' weighted sum over each token's k expert outputs, in one launch: ``out[r] = sum_j
picked[r, j] * weights[r, j]`` in float32, the k terms added in slot order (rank order) — where the eager form is
2k small launches (a float32 copy, a product and a sum per slot).

Anatomy: ``@triton.jit`` kernel, launcher. Each program owns BLOCK columns of one row: a row's bits do not depend
on the other rows of the call. picked: (rows, k, hidden) with unit stride along hidden; weights (rows, k) float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK, NUM_WARPS = 512, 4


@triton.jit
def weighted_slots_kernel(p_ptr, w_ptr, out_ptr, H, stride_pr, stride_pk, stride_wr, stride_wk, stride_or,
                          K: tl.constexpr, BLOCK: tl.constexpr):
    r, hb = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = hb * BLOCK + tl.arange(0, BLOCK)
    inside = cols < H
    row = p_ptr + r * stride_pr
    acc = tl.load(row + cols, mask=inside, other=0.0).to(tl.float32) * tl.load(w_ptr + r * stride_wr)
    for j in tl.static_range(1, K):  # every slot's load in flight at once
        term = tl.load(row + j * stride_pk + cols, mask=inside, other=0.0).to(tl.float32)
        acc += term * tl.load(w_ptr + r * stride_wr + j * stride_wk)
    tl.store(out_ptr + r * stride_or + cols, acc, mask=inside)


def weighted_slots(picked: torch.Tensor, weights: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """picked (rows, k, hidden), weights (rows, k) float32 -> (rows, hidden) float32. Checked by the op."""
    rows, k, hidden = picked.shape
    if out is None:
        out = torch.empty(rows, hidden, dtype=torch.float32, device=picked.device)
    if rows:
        weighted_slots_kernel[(rows, triton.cdiv(hidden, BLOCK))](
            picked, weights, out, hidden, picked.stride(0), picked.stride(1), weights.stride(0),
            weights.stride(1), out.stride(0), K=k, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
