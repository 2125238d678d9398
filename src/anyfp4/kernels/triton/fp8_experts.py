"""FP8 GEMV over a mixture of experts' stacked prepacks for a decode step's (token, expert) pairs, in one launch:
``out[p] = x[p // pairs_per_row] @ W[ids[p]]^T`` (gated: ``silu(gate) * up``), the expert of each pair read on the
GPU from ``ids`` — ``nvfp4_experts``' FP8 counterpart.

Anatomy: ``@triton.jit`` kernel, launcher. The per-row arithmetic is ``fp8_gemv``'s (``fp8_rows``: its tile dot
products, the row scale after the whole K), so a pair's output has the bits that GEMV gives its row alone. Prepacks
(``packing.fp8``) stacked: codes (E, N_pad, K_pad / 4) int32, scales (E, N_pad) float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from .common import round_to_output
from .fp8_linear import fp8_rows

BLOCK_N, NUM_WARPS = 8, 2  # rows per program (gated: as many up rows too)


@triton.jit
def fp8_experts_kernel(
    # pointers
    x_ptr, ids_ptr, codes_ptr, scales_ptr, out_ptr,
    # sizes
    K, N_OUT, UP_OFFSET, K_TILES, PAIRS_PER_ROW,
    # strides
    stride_x, stride_o, stride_ce, stride_se, stride_c,
    # meta-parameters
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr, INTERPRET: tl.constexpr,
):
    """x: (rows, K) activations; ids: (pairs,) int32; out: (pairs, N_OUT)."""
    pid_n, pair = tl.program_id(0), tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // PAIRS_PER_ROW).to(tl.int64) * stride_x
    codes, scales = codes_ptr + expert * stride_ce, scales_ptr + expert * stride_se
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    y = fp8_rows(x_row, codes, scales, rows, K, UP_OFFSET, K_TILES, stride_c, BLOCK_K, GATED)
    tl.store(out_ptr + pair.to(tl.int64) * stride_o + rows, round_to_output(y, out_ptr.dtype.element_ty, INTERPRET),
             mask=rows < N_OUT)


def fp8_experts_gemv(x: torch.Tensor, ids: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, up_offset: int,
                     out_features: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (rows, K), ids (pairs,) int32 with pairs a multiple of rows -> (pairs, out_features) in x's dtype; K tiles
    as ``fp8_gemv`` takes them (512, or 256 where 512 does not divide the padded K). Checked by the op."""
    pairs = ids.shape[0]
    k_pad = codes.shape[2] * 4
    block_k = 512 if k_pad % 512 == 0 else 256
    if out is None:
        out = torch.empty(pairs, out_features, dtype=x.dtype, device=x.device)
    fp8_experts_kernel[(triton.cdiv(out_features, BLOCK_N), pairs)](
        x, ids, codes, scales, out, x.shape[1], out_features, up_offset, k_pad // block_k, pairs // x.shape[0],
        x.stride(0), out.stride(0), codes.stride(0), scales.stride(0), codes.stride(1),
        BLOCK_N=BLOCK_N, BLOCK_K=block_k, GATED=up_offset > 0, INTERPRET=triton_interpret(), num_warps=NUM_WARPS,
    )
    return out
