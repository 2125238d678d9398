"""NVFP4 prefill path: dequantize the prepack to a dense fp16/bf16 (N, K) weight, then cuBLAS.

The dequantized value is ``(e2m1 * block_scale) * global_scale`` computed in float32 (the first
product is exact, the second is one rounding) and rounded once to the output dtype — bit for bit
``formats.nvfp4.dequantize_nvfp4(...).to(dtype)``.

The dense weight lives in the shared workspace (``common.workspace``), grown to the largest layer
seen and reused by every call, so prefill never holds more than one layer's dense copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from ...packing.nvfp4 import NVFP4Prepacked
from .bits import block_scale_pair, decode_words_pairs, tiled_scale_offset, tiled_word_offset
from .common import dequantize_matmul, round_to_output


@triton.jit
def nvfp4_dequant_kernel(
    codes_ptr, scales_ptr, gscale_ptr, out_ptr,
    N, K, ROW0,
    stride_c, stride_s, stride_on,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
):
    """codes/scales: prepack layout (stride_c / stride_s: words / bytes per row), rows ROW0 .. ROW0 + N;
    out: (N, K) fp16/bf16 row-major."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    rows = ROW0 + offs_n
    words = tl.load(codes_ptr + tiled_word_offset(rows[:, None], (k0 // 8 + tl.arange(0, BLOCK_K // 8))[None, :], stride_c))
    w = decode_words_pairs(words, BLOCK_N, BLOCK_K, tl.bfloat16, True)  # float32 e2m1 * 2^-126, exact
    sb = tl.load(scales_ptr + tiled_scale_offset(rows[:, None], (k0 // 16 + tl.arange(0, BLOCK_K // 16))[None, :], stride_s))
    s = block_scale_pair(sb, tl.bfloat16, True)  # float32 block scale * 2^112, exact
    # (e2m1 * 2^-126) * (bs * 2^112) is exact; * (global scale * 2^14) is the one rounding
    prod = tl.reshape(tl.reshape(w, (BLOCK_N, BLOCK_K // 16, 16)) * s[:, :, None], (BLOCK_N, BLOCK_K))
    y = prod * (tl.load(gscale_ptr) * 16384.0)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    tl.store(out_ptr + offs_n[:, None] * stride_on + offs_k[None, :], round_to_output(y, out_ptr.dtype.element_ty, INTERPRET),
             mask=mask)


def nvfp4_dequantize(w: NVFP4Prepacked, dtype: torch.dtype, out: torch.Tensor | None = None,
                     row0: int = 0) -> torch.Tensor:
    """Dense (N, K) weight of rows ``row0 .. row0 + N`` of the prepack (``row0 = up_offset``: the up half)."""
    n, k = w.out_features, w.in_features
    if out is None:
        out = torch.empty(n, k, dtype=dtype, device=w.codes.device)
    block_n, block_k = 32, 128
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    nvfp4_dequant_kernel[grid](w.codes, w.scales, w.global_scale, out, n, k, row0,
                               w.codes.stride(0), w.scales.stride(0), out.stride(0),
                               BLOCK_N=block_n, BLOCK_K=block_k, INTERPRET=triton_interpret(), num_warps=4)
    return out


def nvfp4_prefill_gemm(x: torch.Tensor, w: NVFP4Prepacked, bias: torch.Tensor | None,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Dequantize into the shared workspace, then ``torch.matmul`` (cuBLAS); gated prepacks fuse
    ``silu(gate) * up`` after the two products. ``out_dtype=float32`` (plain prepacks, no bias): cuBLAS
    writes its float32 sums unrounded."""
    return dequantize_matmul(x, w, bias, out_dtype, nvfp4_dequantize)
