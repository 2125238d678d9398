"""NVFP4 GEMV over a mixture of experts' stacked weights for a decode step's (token, expert) pairs, in one launch:
``out[p] = x[p // pairs_per_row] @ W[ids[p]]^T`` (gated: ``silu(gate) * up``), every pair's expert read on the GPU
from ``ids`` (no host value: a CUDA graph replays it for any routing).

Anatomy: ``@triton.jit`` kernel, launcher. The per-row arithmetic is ``nvfp4_gemv``'s (its tile dot product and
epilogue, the whole K in one program: no split-K), so a pair's output has the bits the GEMV gives its row alone,
whatever the other pairs. Grid: (row blocks of the output, pairs). Experts' prepacks (``packing.nvfp4``) are stacked
along a leading dimension: codes (E, N_pad, K_pad / 8) int32, scales (E, ...) uint8, global scales (E,) float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from .nvfp4_epilogue import epilogue
from .nvfp4_gemv import row_tile_dot

BLOCK_N, BLOCK_K, NUM_WARPS = 8, 256, 2  # rows per program (gated: as many up rows too), K per tile


@triton.jit
def nvfp4_experts_kernel(
    # pointers
    x_ptr, ids_ptr, codes_ptr, scales_ptr, gscale_ptr, out_ptr,
    # sizes
    K, N_OUT, UP_OFFSET, K_TILES, PAIRS_PER_ROW,
    # strides
    stride_x, stride_o, stride_ce, stride_se, stride_c, stride_s,
    # meta-parameters
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr, INTERPRET: tl.constexpr,
):
    """x: (rows, K) activations; ids: (pairs,) int32 expert of each pair; out: (pairs, N_OUT).
    GATED: gate rows [0, N_OUT), up rows [UP_OFFSET, UP_OFFSET + N_OUT) of each expert."""
    pid_n, pair = tl.program_id(0), tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // PAIRS_PER_ROW).to(tl.int64) * stride_x
    codes, scales = codes_ptr + expert * stride_ce, scales_ptr + expert * stride_se
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_K // 8)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for t in range(0, K_TILES):
        acc += row_tile_dot(x_row, codes, scales, rows, t, j, K, stride_c, stride_s, BLOCK_K)
        if GATED:
            acc_up += row_tile_dot(x_row, codes, scales, rows + UP_OFFSET, t, j, K, stride_c, stride_s, BLOCK_K)
    out_row = out_ptr + pair.to(tl.int64) * stride_o
    epilogue(acc[None, :], acc_up[None, :], tl.zeros((1,), dtype=tl.int32), rows, 1, N_OUT, gscale_ptr + expert,
             out_row, out_row, N_OUT, False, GATED, INTERPRET)


def nvfp4_experts_gemv(x: torch.Tensor, ids: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                       global_scales: torch.Tensor, up_offset: int, out_features: int,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """x (rows, K), ids (pairs,) int32 with pairs a multiple of rows -> (pairs, out_features) in x's dtype.
    Checked by the op."""
    pairs, k = ids.shape[0], x.shape[1]
    k_pad = codes.shape[2] * 8
    if k_pad % BLOCK_K:
        raise ValueError(f"K_pad = {k_pad} is not a multiple of {BLOCK_K}")
    if out is None:
        out = torch.empty(pairs, out_features, dtype=x.dtype, device=x.device)
    nvfp4_experts_kernel[(triton.cdiv(out_features, BLOCK_N), pairs)](
        x, ids, codes, scales, global_scales, out,
        k, out_features, up_offset, k_pad // BLOCK_K, pairs // x.shape[0],
        x.stride(0), out.stride(0), codes.stride(0), scales.stride(0), codes.stride(1), scales.stride(1),
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GATED=up_offset > 0, INTERPRET=triton_interpret(), num_warps=NUM_WARPS,
    )
    return out
