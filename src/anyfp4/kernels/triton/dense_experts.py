"""Float (bf16 / fp16) GEMV over a mixture of experts' stacked weights for a decode step's (token, expert) pairs, in
one launch: ``out[p] = x[p // pairs_per_row] @ W[ids[p]]^T``, gated: ``silu(x @ Wg^T) * (x @ Wu^T)`` with the up
rows ``N_OUT`` below the gate rows — the float model's counterpart of ``nvfp4_experts`` (the baseline a quantized
mixture of experts is compared with runs the same way).

Anatomy: ``@triton.jit`` kernel, launcher. As ``dense_gemv``: each program owns BLOCK_N output rows of one pair and
walks the whole K in BLOCK_K chunks, float32 accumulation in one fixed order (a pair's bits do not depend on the
other pairs). Weights: (E, rows, K) contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from .common import round_to_output

BLOCK_N, BLOCK_K, NUM_WARPS = 4, 512, 4


@triton.jit
def _rows_dot(x_row, w, rows, K, stride_wn, N_OUT, BLOCK_K: tl.constexpr):
    """(BLOCK_N,) float32: rows ``rows`` of ``w`` dotted with the activation row."""
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros([rows.shape[0], BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + cols
        x = tl.load(x_row + kk, mask=kk < K, other=0.0).to(tl.float32)
        wt = tl.load(w + rows[:, None].to(tl.int64) * stride_wn + kk[None, :],
                     mask=(rows[:, None] < N_OUT) & (kk[None, :] < K), other=0.0).to(tl.float32)
        acc += wt * x[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def dense_experts_kernel(x_ptr, ids_ptr, w_ptr, out_ptr, N_OUT, K, PAIRS_PER_ROW, stride_x, stride_we, stride_wn,
                         stride_o, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr,
                         INTERPRET: tl.constexpr):
    nb, pair = tl.program_id(0), tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // PAIRS_PER_ROW).to(tl.int64) * stride_x
    w = w_ptr + expert * stride_we
    rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    y = _rows_dot(x_row, w, rows, K, stride_wn, N_OUT, BLOCK_K)
    if GATED:
        up = _rows_dot(x_row, w + N_OUT * stride_wn, rows, K, stride_wn, N_OUT, BLOCK_K)
        y = y / (1.0 + tl.exp(-y)) * up
    tl.store(out_ptr + pair.to(tl.int64) * stride_o + rows, round_to_output(y, out_ptr.dtype.element_ty, INTERPRET),
             mask=rows < N_OUT)


def dense_experts_gemv(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gated: bool, out_features: int,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """x (rows, K), ids (pairs,) int32, weights (E, out_features * (2 if gated else 1), K) contiguous ->
    (pairs, out_features) in x's dtype. Checked by the op."""
    pairs, k = ids.shape[0], x.shape[1]
    if out is None:
        out = torch.empty(pairs, out_features, dtype=x.dtype, device=x.device)
    dense_experts_kernel[(triton.cdiv(out_features, BLOCK_N), pairs)](
        x, ids, weights, out, out_features, k, pairs // x.shape[0], x.stride(0), weights.stride(0),
        weights.stride(1), out.stride(0), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GATED=gated,
        INTERPRET=triton_interpret(), num_warps=NUM_WARPS)
    return out
