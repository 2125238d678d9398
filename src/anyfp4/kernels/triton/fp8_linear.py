"""FP8 (E4M3) weight-only linear on the GPU: an M = 1 GEMV kernel, and dequantize + cuBLAS otherwise, reading
the prepack of ``packing.fp8`` (its layout and ``BYTE_BITS`` are described there); and the prepack written back as
plain E4M3 bytes for the W8A8 prefill (``fp8_w8a8``).

Decoding in the Triton kernels is integer bit arithmetic: in the GEMV (``bits.fp8_fp16_at``) each value's
magnitude at fp16 bits 7-13 and sign at 15 is exactly ``e4m3 * 2^-8``, widened to float32, the epilogue
multiplies by ``scale[n] * 2^8``; the dequantize kernel takes two values per integer operation as bf16 bits
widened to float32 (``bits.decode_fp8_pairs``: ``e4m3 * 2^-120``), times ``2^120``, then the row's scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from ...packing.fp8 import FP8Prepacked
from .bits import decode_fp8_pairs, fp8_checkpoint_words, fp8_fp16_at, tiled_word_offset
from .common import dequantize_matmul, round_to_output, workspace

_E4M3_UNSHIFT = tl.constexpr(2.0 ** 120)  # decode_fp8_pairs' values times this are the E4M3 values


@triton.jit
def fp8_row_tile(x_ptr, codes_ptr, rows, t, j, K, stride_c, BLOCK_K: tl.constexpr):
    words = tl.load(codes_ptr + tiled_word_offset(rows[:, None], (t * (BLOCK_K // 4) + j)[None, :], stride_c))
    part = tl.zeros(words.shape, dtype=tl.float32)
    for i in tl.static_range(4):
        kk = t * BLOCK_K + j * 4 + i
        xi = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        w = fp8_fp16_at(words, i).to(tl.float32)
        part += w * xi[None, :]
    return tl.sum(part, axis=1)


@triton.jit
def fp8_rows(x_ptr, codes_ptr, scales_ptr, rows, K, UP_OFFSET, K_TILES, stride_c, BLOCK_K: tl.constexpr,
             GATED: tl.constexpr):
    """(BLOCK_N,) float32 outputs of ``rows`` for one activation row, the whole K: the sums times the row scales,
    gated: silu(gate) * up."""
    j = tl.arange(0, BLOCK_K // 4)
    acc = tl.zeros(rows.shape, dtype=tl.float32)
    acc_up = tl.zeros(rows.shape, dtype=tl.float32)
    for t in range(0, K_TILES):
        acc += fp8_row_tile(x_ptr, codes_ptr, rows, t, j, K, stride_c, BLOCK_K)
        if GATED:
            acc_up += fp8_row_tile(x_ptr, codes_ptr, rows + UP_OFFSET, t, j, K, stride_c, BLOCK_K)
    y = acc * (tl.load(scales_ptr + rows) * 256.0)
    if GATED:
        u = acc_up * (tl.load(scales_ptr + rows + UP_OFFSET) * 256.0)
        y = y / (1.0 + tl.exp(-y)) * u
    return y


@triton.jit
def fp8_gemv_kernel(
    x_ptr, codes_ptr, scales_ptr, bias_ptr, out_ptr,
    K, N_OUT, UP_OFFSET, K_TILES,
    stride_c,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """x: (K,) fp16/bf16; codes/scales: FP8 prepack; out: (1, N_OUT). One program: BLOCK_N rows, all K."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    y = fp8_rows(x_ptr, codes_ptr, scales_ptr, rows, K, UP_OFFSET, K_TILES, stride_c, BLOCK_K, GATED)
    if not GATED and HAS_BIAS:
        y = y + tl.load(bias_ptr + rows, mask=rows < N_OUT, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, round_to_output(y, out_ptr.dtype.element_ty, INTERPRET), mask=rows < N_OUT)


@triton.jit
def fp8_dequant_kernel(codes_ptr, scales_ptr, out_ptr, N, K, ROW0, stride_c, stride_on,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr):
    """Dense (N, K) = float32(e4m3) * scale[n], one rounding to the output dtype."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    rows = ROW0 + offs_n
    words = tl.load(codes_ptr + tiled_word_offset(rows[:, None], (k0 // 4 + tl.arange(0, BLOCK_K // 4))[None, :], stride_c))
    w = decode_fp8_pairs(words, BLOCK_N, BLOCK_K)  # e4m3 * 2^-120, exact
    y = (w * _E4M3_UNSHIFT) * tl.load(scales_ptr + rows)[:, None]  # exact, then the scale: one rounding
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    tl.store(out_ptr + offs_n[:, None] * stride_on + offs_k[None, :],
             round_to_output(y, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


@triton.jit
def fp8_raw_kernel(codes_ptr, out_ptr, ROW0, stride_c, stride_o, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    """Rows ROW0 + (program's rows) of an FP8 prepack -> checkpoint-order words (4 E4M3 bytes each) at
    ``out[row - ROW0, word]``. The grid covers whole row blocks and all words (no masks)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    words = tl.load(codes_ptr + tiled_word_offset(ROW0 + offs_n[:, None], offs_w[None, :], stride_c))
    tl.store(out_ptr + offs_n[:, None] * stride_o + offs_w[None, :], fp8_checkpoint_words(words))



def fp8_raw_weight(w: FP8Prepacked, row0: int, rows: int) -> torch.Tensor:
    """Rows ``row0 .. row0 + rows`` of a GPU prepack (whole row blocks) as plain (rows, K_pad) float8_e4m3fn bytes,
    in the shared workspace (valid until the next prefill): the W8A8 prefill's weight operand (``fp8_w8a8``)."""
    words_per_row = w.codes.shape[1]
    out = workspace(rows * words_per_row, torch.int32, w.codes.device).view(rows, words_per_row)
    block_n, block_w = 32, 64
    fp8_raw_kernel[(rows // block_n, words_per_row // block_w)](
        w.codes, out, row0, words_per_row, words_per_row, BLOCK_N=block_n, BLOCK_W=block_w, num_warps=4)
    return out.view(torch.float8_e4m3fn)


def fp8_gemv(x: torch.Tensor, w: FP8Prepacked, bias: torch.Tensor | None, block_n: int = 8,
             block_k: int = 512) -> torch.Tensor:
    k_pad = w.codes.shape[1] * 4
    if k_pad % block_k:
        block_k = 256
    out = torch.empty(1, w.out_features, dtype=x.dtype, device=x.device)
    fp8_gemv_kernel[(triton.cdiv(w.out_features, block_n),)](
        x, w.codes, w.scales, bias if bias is not None else out, out,
        w.in_features, w.out_features, w.up_offset, k_pad // block_k, w.codes.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, HAS_BIAS=bias is not None, GATED=w.gated,
        INTERPRET=triton_interpret(), num_warps=2,
    )
    return out


def fp8_dequantize(w: FP8Prepacked, dtype: torch.dtype, out: torch.Tensor | None = None, row0: int = 0):
    n, k = w.out_features, w.in_features
    if out is None:
        out = torch.empty(n, k, dtype=dtype, device=w.codes.device)
    block_n, block_k = 32, 128
    fp8_dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        w.codes, w.scales, out, n, k, row0, w.codes.stride(0), out.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, INTERPRET=triton_interpret(), num_warps=4)
    return out


def fp8_matmul(x: torch.Tensor, w: FP8Prepacked, bias: torch.Tensor | None,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """M > 1: dequantize into the shared workspace, then cuBLAS; gated prepacks fuse SiLU * up.
    ``out_dtype=float32`` (plain prepacks, no bias): cuBLAS writes its float32 sums unrounded."""
    return dequantize_matmul(x, w, bias, out_dtype, fp8_dequantize)
