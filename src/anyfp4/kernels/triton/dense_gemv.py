"""A float weight's GEMV for decode-sized calls of a layer with few outputs (the Gated DeltaNet's bf16 a / b
projections: 2 x 48 outputs from 5120 inputs), where cuBLAS needs a zero-padded input, a split-K GEMM and its
reduction (four launches): ``out[m, n] = x[m] . W[n] (+ bias[n])``, one launch.

Each program owns BLOCK_N output rows of one input row and walks the whole K in BLOCK_K chunks, float32
accumulation in one fixed order: a row's bits do not depend on how many rows share the call (a decode step and a
speculative verify pass agree). The pure-torch definition is ``F.linear`` in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from .common import round_to_output


BLOCK_N = 2  # output rows a program owns
BLOCK_K = 1024  # inputs a program reads per chunk
NUM_WARPS = 4
# A pass of the loop reads four chunks, every load issued before the first chunk is added, so that a program waits
# for memory once per four chunks instead of once per chunk (K = 5120: two waits instead of five). The chunks are
# added in k order as one at a time would be (a chunk past K adds +0.0 to sums that are never -0.0), so the bits do
# not depend on it.


@triton.jit
def _chunk(x_ptr, w_ptr, rows, cols, k0, N, K, stride_wn):
    kk = k0 + cols
    x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + rows[:, None] * stride_wn + kk[None, :], mask=(rows[:, None] < N) & (kk[None, :] < K),
                other=0.0).to(tl.float32)
    return w, x


@triton.jit
def gemv_rows(x_ptr, w_ptr, bias_ptr, out_ptr, nb, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr):
    """Output rows nb * BLOCK_N .. of one input row (x_ptr, out_ptr at its row): the whole K in BLOCK_K chunks,
    float32 sums in one fixed order. Every kernel that computes such rows calls this, with BLOCK_N, BLOCK_K and
    NUM_WARPS, so that they all give the same bits."""
    rows = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, 4 * BLOCK_K):  # four chunks a pass (see above)
        w0, x0 = _chunk(x_ptr, w_ptr, rows, cols, k0, N, K, stride_wn)
        w1, x1 = _chunk(x_ptr, w_ptr, rows, cols, k0 + BLOCK_K, N, K, stride_wn)
        w2, x2 = _chunk(x_ptr, w_ptr, rows, cols, k0 + 2 * BLOCK_K, N, K, stride_wn)
        w3, x3 = _chunk(x_ptr, w_ptr, rows, cols, k0 + 3 * BLOCK_K, N, K, stride_wn)
        acc += w0 * x0[None, :]  # each chunk as the one-chunk loop added it (a multiply-add into acc)
        acc += w1 * x1[None, :]
        acc += w2 * x2[None, :]
        acc += w3 * x3[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, round_to_output(y, out_ptr.dtype.element_ty, INTERPRET), mask=rows < N)


@triton.jit
def dense_gemv_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, N, K, stride_xm, stride_wn, stride_om,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr):
    nb, m = tl.program_id(0), tl.program_id(1)
    gemv_rows(x_ptr + m * stride_xm, w_ptr, bias_ptr, out_ptr + m * stride_om, nb, N, K, stride_wn, BLOCK_N, BLOCK_K,
              HAS_BIAS, INTERPRET)


GRID_ROWS = 32768  # input rows a launch takes (its grid's second axis, at most 65535)


def dense_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K), weight (N, K) contiguous, bias (N,) or None -> (..., N) in x's dtype (into ``out`` if given)."""
    n, k = weight.shape
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device) if out is None else out.view(rows, n)
    for r0 in range(0, rows, GRID_ROWS):  # one launch up to GRID_ROWS rows; a row's bits are the same in any
        xs, ys = x2[r0:r0 + GRID_ROWS], y[r0:r0 + GRID_ROWS]
        dense_gemv_kernel[(triton.cdiv(n, BLOCK_N), xs.shape[0])](
            xs, weight, bias if bias is not None else weight, ys, n, k, xs.stride(0), weight.stride(0), ys.stride(0),
            BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, HAS_BIAS=bias is not None, INTERPRET=triton_interpret(),
            num_warps=NUM_WARPS)
    return y.view(*x.shape[:-1], n)
