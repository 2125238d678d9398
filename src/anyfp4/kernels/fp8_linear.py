"""FP8 (E4M3) weight-only linear: prepack, an M = 1 GEMV kernel, and dequantize + cuBLAS otherwise.

Prepack (``FP8Prepacked``): ``codes`` (N_pad, K_pad // 4) int32, word ``j`` of a row holding the
E4M3 values of ``k = 4j .. 4j + 3``, the words stored in tiles of 16 rows x 16 words (64 k) like the
NVFP4 prepack's (``nvfp4_prepack.tile_words``: one contiguous 1 KiB read per warp and step of the
CUDA kernel); ``scales`` (N_pad,) float32 per output channel (a per-tensor scale is broadcast, so
fused projections concatenate exactly); padding holds zeros. A gated prepack stacks gate and up,
up starting at row ``up_offset``.

Inside a word the bits of the four values are placed (``BYTE_BITS``) for the CUDA kernel's bf16
decode, which forms two bf16 pairs, (k0, k2) and (k1, k3), each value's 7 magnitude bits at 4-10 and
its sign at 15 of a half: pair (k0, k2) is ``w & 0x87F087F0`` (k0 stored there as is, k2 16 bits up),
pair (k1, k3) is ``((w << 4) & 0x80F080F0) | (rotl(w, 12) & 0x07000700)`` (four operations; no
layout makes both pairs one shift and one mask). The magnitude bits read as bf16 are
``e4m3 * 2^-120`` (subnormals included).

Decoding in the Triton kernels is integer bit arithmetic too (``bit_decode.fp8_fp16_at``): each
value's magnitude at fp16 bits 7-13 and sign at 15 is exactly ``e4m3 * 2^-8``, widened to float32;
the epilogue multiplies by ``scale[n] * 2^8``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..env import triton_interpret
from ..formats.fp8 import FP8Weight
from .bit_decode import fp8_fp16_at, tiled_word_offset
from .nvfp4_dequant import round_to_output, workspace
from .nvfp4_prepack import (K_ALIGN, ROW_ALIGN, TILE_ROWS, _round_up, gather_bits, spread_bits, tile_words,
                            untile_words)


# for value i (k = 4j + i) of word j: the word bit holding each of its E4M3 bits 0..7 (bit 7: the sign)
BYTE_BITS = ((4, 5, 6, 7, 8, 9, 10, 15), (0, 1, 2, 3, 28, 29, 30, 11),
             (20, 21, 22, 23, 24, 25, 26, 31), (16, 17, 18, 19, 12, 13, 14, 27))


def _spread_fp8_words(words: torch.Tensor) -> torch.Tensor:
    """Checkpoint-order words (value i in bits 8i .. 8i + 7) -> the layout of ``BYTE_BITS``."""
    return spread_bits(words, BYTE_BITS)


def _gather_fp8_words(words: torch.Tensor) -> torch.Tensor:
    """The inverse of ``_spread_fp8_words``."""
    return gather_bits(words, BYTE_BITS)


@dataclass(frozen=True)
class FP8Prepacked:
    codes: torch.Tensor  # (N_pad, K_pad // 4) int32
    scales: torch.Tensor  # (N_pad,) float32
    out_features: int
    in_features: int
    up_offset: int = 0

    @property
    def gated(self) -> bool:
        return self.up_offset > 0


def _pad(weight: FP8Weight, device) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    n_pad, k_pad = _round_up(n, ROW_ALIGN), _round_up(k, K_ALIGN)
    codes = torch.zeros(n_pad, k_pad, dtype=torch.uint8, device=device)
    codes[:n, :k] = weight.weight.to(device).view(torch.uint8)
    scale = weight.scale.float().reshape(-1).to(device)
    scales = torch.zeros(n_pad, dtype=torch.float32, device=device)
    scales[:n] = scale.expand(n) if scale.numel() == 1 else scale
    if torch.device(device).type == "cuda":
        from .weight_mma import reserve_counters

        reserve_counters(torch.device(device))
    return tile_words(_spread_fp8_words(codes.view(torch.int32))), scales


def prepack_fp8(weight: FP8Weight, device=None) -> FP8Prepacked:
    device = torch.device(device) if device is not None else weight.weight.device
    codes, scales = _pad(weight, device)
    return FP8Prepacked(codes, scales, weight.shape[0], weight.shape[1])


def prepack_fp8_gated(gate: FP8Weight, up: FP8Weight, device=None) -> FP8Prepacked:
    if gate.shape != up.shape:
        raise ValueError(f"gate {gate.shape} and up {up.shape} must have the same shape")
    device = torch.device(device) if device is not None else gate.weight.device
    (gc, gs), (uc, us) = _pad(gate, device), _pad(up, device)
    return FP8Prepacked(torch.cat([gc, uc]), torch.cat([gs, us]), gate.shape[0], gate.shape[1], up_offset=gc.shape[0])


def unprepack_fp8(p: FP8Prepacked, row0: int = 0) -> FP8Weight:
    """The exact inverse of the prepack (scales per channel); ``row0 = up_offset`` gives the up half."""
    n, k = p.out_features, p.in_features
    rows = _gather_fp8_words(untile_words(p.codes[row0:row0 + _round_up(n, TILE_ROWS)]))  # this half's row blocks
    weight = rows.view(torch.uint8)[:n, :k].contiguous().view(torch.float8_e4m3fn)
    return FP8Weight(weight, p.scales[row0:row0 + n].clone())


@triton.jit
def _fp8_row_tile(x_ptr, codes_ptr, rows, t, j, K, stride_c, BLOCK_K: tl.constexpr):
    words = tl.load(codes_ptr + tiled_word_offset(rows[:, None], (t * (BLOCK_K // 4) + j)[None, :], stride_c))
    part = tl.zeros(words.shape, dtype=tl.float32)
    for i in tl.static_range(4):
        kk = t * BLOCK_K + j * 4 + i
        xi = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        w = fp8_fp16_at(words, i).to(tl.float32)
        part += w * xi[None, :]
    return tl.sum(part, axis=1)


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
    j = tl.arange(0, BLOCK_K // 4)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for t in range(0, K_TILES):
        acc += _fp8_row_tile(x_ptr, codes_ptr, rows, t, j, K, stride_c, BLOCK_K)
        if GATED:
            acc_up += _fp8_row_tile(x_ptr, codes_ptr, rows + UP_OFFSET, t, j, K, stride_c, BLOCK_K)
    y = acc * (tl.load(scales_ptr + rows) * 256.0)
    if GATED:
        u = acc_up * (tl.load(scales_ptr + rows + UP_OFFSET) * 256.0)
        y = y / (1.0 + tl.exp(-y)) * u
    elif HAS_BIAS:
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
    v0, v1, v2, v3 = fp8_fp16_at(words, 0), fp8_fp16_at(words, 1), fp8_fp16_at(words, 2), fp8_fp16_at(words, 3)
    # join stacks on a new last axis: this nesting puts value 2a + b at [a, b], i.e. in k order
    w = tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), (BLOCK_N, BLOCK_K)).to(tl.float32)
    y = (w * 256.0) * tl.load(scales_ptr + rows)[:, None]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    tl.store(out_ptr + offs_n[:, None] * stride_on + offs_k[None, :],
             round_to_output(y, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


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
    n, k = w.out_features, w.in_features
    dense = workspace(n * k, x.dtype, x.device).view(n, k)
    fp8_dequantize(w, x.dtype, dense)
    if out_dtype is not None and out_dtype != x.dtype:
        if w.gated or bias is not None:
            raise ValueError("a float32 output is for plain prepacks without bias")
        return torch.mm(x, dense.t(), out_dtype=out_dtype)
    y = torch.matmul(x, dense.t())
    if not w.gated:
        return y + bias if bias is not None else y
    fp8_dequantize(w, x.dtype, dense, row0=w.up_offset)
    return torch.nn.functional.silu(y) * torch.matmul(x, dense.t())
