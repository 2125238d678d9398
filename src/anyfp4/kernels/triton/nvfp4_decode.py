"""NVFP4 decode GEMM for small M (M <= 32): ``out[M, N] = x[M, K] @ W[N, K]^T (+ bias)``, and the
gated variant ``silu(x @ Wg^T) * (x @ Wu^T)`` with gate and up stacked along N in one prepack.

Anatomy: configuration (``DecodeConfig``), ``@triton.jit`` kernels, launcher (check, allocate,
launch). Weights come from ``packing.nvfp4.NVFP4Prepacked``.

How a weight tile is decoded, all in integer bit arithmetic (no FP4/FP8 conversion
instructions, so the same source compiles for sm_70 .. sm_90):

- a 32-bit word holds 8 E2M1 codes, codes p and p + 4 placed (``packing.nvfp4.CODE_BITS``) so that a shift
  or rotation and a mask make them the two halves of an int32 as bf16 ``e2m1 * 2^-126`` (fp16: three bits
  up, ``e2m1 * 2^-14``; subnormal 0.5 included): two codes per integer operation
  (``bits.decode_words_pairs``);
- a prepacked block-scale byte (``packing.nvfp4.SCALE_BYTE``) shifted into the exponent field, plus a constant,
  is exactly bf16 ``bs * 2^112`` or fp16 ``bs`` (``bits.block_scale_pair``);
- their product ``e2m1 * bs * 2^-14`` is exact in either type (at most 6 significant bits, within
  [2^-24, 0.17]), so the tensor-core dot of that tile with the activations is exact up to fp32
  accumulation; the output is multiplied once by ``global_scale * 2^14``.

Split-K: program (n-tile, s) accumulates K-slice ``s``. With ``split_k > 1`` the fp32 partial
sums go to a workspace and a second kernel (``nvfp4_epilogue.splitk_reduce_kernel``) adds them in
the fixed order s = 0, 1, ... — no atomics, so identical inputs give identical bits.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ...dispatch.configs import DecodeConfig, FusedConfig
from ...env import triton_interpret
from ...packing.nvfp4 import NVFP4Prepacked
from .bits import block_scale_pair, decode_words_pairs, tiled_scale_offset, tiled_word_offset
from .nvfp4_epilogue import epilogue, splitk_reduce_kernel

ACT_PACK_GROUP = 16  # block-packed activations: [K_pad / 16][rows][16]


@triton.jit
def _scale_bytes(scales_ptr, offs_n, k0, stride_s, BLOCK_K: tl.constexpr):
    return tl.load(scales_ptr + tiled_scale_offset(offs_n[:, None], (k0 // 16 + tl.arange(0, BLOCK_K // 16))[None, :],
                                                   stride_s))


@triton.jit
def _decode_weight_tile(codes_ptr, sb, offs_n, k0, stride_c,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """(BLOCK_N, BLOCK_K) tile of ``dtype`` (the activations' fp16 / bf16) holding e2m1 * block_scale * 2^-14,
    exactly, from its code words and its scale bytes ``sb`` (``_scale_bytes``): two codes per integer operation,
    one multiply per code."""
    wide: tl.constexpr = INTERPRET and dtype == tl.bfloat16
    words = tl.load(codes_ptr + tiled_word_offset(offs_n[:, None], (k0 // 8 + tl.arange(0, BLOCK_K // 8))[None, :], stride_c))
    w = decode_words_pairs(words, BLOCK_N, BLOCK_K, dtype, wide)
    w = tl.reshape(w, (BLOCK_N, BLOCK_K // 16, 16)) * block_scale_pair(sb, dtype, wide)[:, :, None]
    return tl.reshape(w, (BLOCK_N, BLOCK_K)).to(dtype)


@triton.jit
def _load_act_tile(x_ptr, offs_m, k0, M, K, stride_xm, X_ROWS,
                   BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, X_PACKED: tl.constexpr):
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if X_PACKED:  # [K_pad / 16][X_ROWS][16], zero padded: no masks
        ptrs = x_ptr + (offs_k // 16)[None, :] * (X_ROWS * 16) + offs_m[:, None] * 16 + (offs_k % 16)[None, :]
        return tl.load(ptrs)
    ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    return tl.load(ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)


@triton.jit
def _dot(x, w, SWAP_AB: tl.constexpr, INTERPRET: tl.constexpr):
    """x (rows, k) . w (weight rows, k): (rows, weight rows), or with SWAP_AB its transpose, w @ x^T — the decoded
    tile the multiply's first operand, which Hopper's wgmma reads from registers, so the next tile's decode runs
    while this multiply is in flight (as the second operand it goes through shared memory and is waited for)."""
    if INTERPRET:  # the CPU interpreter's dot wants float32 operands
        x, w = x.to(tl.float32), w.to(tl.float32)
    if SWAP_AB:  # one return: the two shapes differ, and a function's returns must agree
        y = tl.dot(w, tl.trans(x))
    else:
        y = tl.dot(x, tl.trans(w))
    return y


@triton.jit
def nvfp4_decode_kernel(
    # pointers
    x_ptr, codes_ptr, scales_ptr, gscale_ptr, bias_ptr, out_ptr, partial_ptr,
    # sizes
    M, K, N_OUT, UP_OFFSET, X_ROWS, K_ITERS, SPLIT_K,
    # strides
    stride_xm, stride_c, stride_s, stride_om,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PARTIAL: tl.constexpr,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, X_PACKED: tl.constexpr, SWAP_AB: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """x: (M, K) fp16/bf16 row-major, or block-packed (X_PACKED); codes/scales: prepack layout;
    out: (M, N_OUT). GATED: gate rows [0, N_OUT), up rows [UP_OFFSET, UP_OFFSET + N_OUT).
    USE_PARTIAL (SPLIT_K > 1): sums go to partial (SPLIT_K, M, N_OUT * (2 if GATED else 1)) float32.
    Grid: (N tiles, SPLIT_K, M tiles); decode calls have one M tile, the fused prefill GEMM several.
    SWAP_AB: the sums accumulate transposed (``_dot``), turned back before they are stored."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # scale bytes are loaded one tile ahead (the pipeliner leaves these byte loads to the loop's critical path)
    k0 = pid_k * K_ITERS * BLOCK_K
    sb = _scale_bytes(scales_ptr, offs_n, k0, stride_s, BLOCK_K)
    sb_up = sb
    if GATED:
        sb_up = _scale_bytes(scales_ptr, offs_n + UP_OFFSET, k0, stride_s, BLOCK_K)
    for it in range(0, K_ITERS):
        k0 = (pid_k * K_ITERS + it) * BLOCK_K
        k_next = tl.where(it + 1 < K_ITERS, k0 + BLOCK_K, k0)
        sb_next = _scale_bytes(scales_ptr, offs_n, k_next, stride_s, BLOCK_K)
        x = _load_act_tile(x_ptr, offs_m, k0, M, K, stride_xm, X_ROWS, BLOCK_M, BLOCK_K, X_PACKED)
        w = _decode_weight_tile(codes_ptr, sb, offs_n, k0, stride_c, BLOCK_N, BLOCK_K, x.dtype, INTERPRET)
        acc += _dot(x, w, SWAP_AB, INTERPRET)
        sb = sb_next
        if GATED:
            sb_up_next = _scale_bytes(scales_ptr, offs_n + UP_OFFSET, k_next, stride_s, BLOCK_K)
            wu = _decode_weight_tile(codes_ptr, sb_up, offs_n + UP_OFFSET, k0, stride_c, BLOCK_N, BLOCK_K, x.dtype,
                                     INTERPRET)
            acc_up += _dot(x, wu, SWAP_AB, INTERPRET)
            sb_up = sb_up_next
    if SWAP_AB:
        acc, acc_up = tl.trans(acc), tl.trans(acc_up)
    if not USE_PARTIAL:
        epilogue(acc, acc_up, offs_m, offs_n, M, N_OUT, gscale_ptr, bias_ptr, out_ptr, stride_om, HAS_BIAS, GATED,
                 INTERPRET)
    else:
        width = N_OUT * (2 if GATED else 1)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N_OUT)
        base = partial_ptr + pid_k * M * width + offs_m[:, None] * width + offs_n[None, :]
        tl.store(base, acc, mask=mask)
        if GATED:
            tl.store(base + N_OUT, acc_up, mask=mask)


@triton.jit
def act_block_pack_kernel(x_ptr, xp_ptr, M, K, stride_xm, X_ROWS, BLOCK_G: tl.constexpr):
    """x (M, K) -> xp [K_pad / 16][X_ROWS][16]; rows >= M and k >= K are written as zeros."""
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)  # 16-wide K groups
    r = tl.program_id(1)
    kk = tl.arange(0, 16)
    k = g[:, None] * 16 + kk[None, :]
    # Rows >= M read no column. The row test stays a scalar select: ANDed into the block mask, a scalar
    # comparison reaches Triton's interpreter as an int32 mask, which Triton 3.9 refuses.
    k_end = tl.where(r < M, K, 0)
    v = tl.load(x_ptr + r * stride_xm + k, mask=k < k_end, other=0.0)
    tl.store(xp_ptr + g[:, None] * (X_ROWS * 16) + r * 16 + kk[None, :], v)


def block_m_for(m: int) -> int:
    return 16 if m <= 16 else 32


def act_block_pack(x: torch.Tensor, k_pad: int) -> torch.Tensor:
    """Rewrite x (M, K) as [K_pad/16][rows][16], rows = M rounded up to the kernel's row tile."""
    m, k = x.shape
    rows = block_m_for(m)
    xp = torch.empty(k_pad // 16 * rows * 16, dtype=x.dtype, device=x.device)
    block_g = 16
    act_block_pack_kernel[(triton.cdiv(k_pad // 16, block_g), rows)](x, xp, m, k, x.stride(0), rows, BLOCK_G=block_g)
    return xp


def nvfp4_decode_gemm(x: torch.Tensor, w: NVFP4Prepacked, bias: torch.Tensor | None, config: DecodeConfig,
                      act_pack: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) with M <= 32 -> (M, N); a gated prepack gives silu(gate) * up. Checked by the op."""
    m = x.shape[0]
    block_m = block_m_for(m)
    if out is None:
        out = torch.empty(m, w.out_features, dtype=x.dtype, device=x.device)
    if act_pack:
        xk, stride_xm = act_block_pack(x, w.codes.shape[1] * 8), 0
    else:
        xk, stride_xm = x, x.stride(0)
    return _launch(xk, stride_xm, act_pack, x.shape, w, bias, out, config, block_m)


def _launch(xk: torch.Tensor, stride_xm: int, x_packed: bool, x_shape, w: NVFP4Prepacked, bias: torch.Tensor | None,
            out: torch.Tensor, c: DecodeConfig | FusedConfig, block_m: int) -> torch.Tensor:
    """``nvfp4_decode_kernel`` over (N tiles, ``c.split_k`` K slices, row tiles of ``block_m``) into ``out``; with
    K slices their float32 partials are added in the order 0, 1, ... by ``splitk_reduce_kernel`` (no atomics:
    identical inputs give identical bits)."""
    m, k = x_shape
    n_out = w.out_features
    k_tiles = w.codes.shape[1] * 8 // c.block_k
    if k_tiles % c.split_k:
        raise ValueError(f"split_k {c.split_k} must divide the {k_tiles} K tiles of block_k {c.block_k}")
    partial = out if c.split_k == 1 else torch.empty(c.split_k, m, n_out * (2 if w.gated else 1),
                                                     dtype=torch.float32, device=out.device)
    bias_arg = bias if bias is not None else out
    grid = (triton.cdiv(n_out, c.block_n), c.split_k, triton.cdiv(m, block_m))
    nvfp4_decode_kernel[grid](
        xk, w.codes, w.scales, w.global_scale, bias_arg, out, partial,
        m, k, n_out, w.up_offset, block_m, k_tiles // c.split_k, c.split_k,
        stride_xm, w.codes.stride(0), w.scales.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, USE_PARTIAL=c.split_k > 1,
        HAS_BIAS=bias is not None, GATED=w.gated, X_PACKED=x_packed,
        SWAP_AB=isinstance(c, FusedConfig) and c.swap_ab, INTERPRET=triton_interpret(),
        num_warps=c.num_warps, num_stages=c.num_stages,
    )
    if c.split_k > 1:
        block_r = 256
        splitk_reduce_kernel[(triton.cdiv(n_out, block_r), m)](
            partial, w.global_scale, bias_arg, out, m, n_out, out.stride(0), c.split_k,
            BLOCK_R=block_r, HAS_BIAS=bias is not None, GATED=w.gated, INTERPRET=triton_interpret(), num_warps=4,
        )
    return out


def nvfp4_fused_gemm(x: torch.Tensor, w: NVFP4Prepacked, bias: torch.Tensor | None,
                     config: FusedConfig = FusedConfig(), out: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Prefill without a dense copy of the weight (``ANYFP4_PREFILL=fused``): the decode kernel over tiles of
    ``block_m`` rows, each decoding its weight tiles in registers for ``tl.dot``, in ``split_k`` K slices (float32
    partials added in a fixed order, as the decode GEMM does). x (M, K) -> (M, N); a gated
    prepack gives silu(gate) * up; ``out_dtype=float32``: the output unrounded (with a unit global scale: the
    sums before the global scale, a tensor-parallel rank's share)."""
    c = config
    k_pad = w.codes.shape[1] * 8
    if k_pad % c.block_k or 128 % c.block_n:
        raise ValueError(f"block_k {c.block_k} must divide K_pad {k_pad} and block_n {c.block_n} divide 128")
    if x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(x.shape[0], w.out_features, dtype=out_dtype or x.dtype, device=x.device)
    return _launch(x, x.stride(0), False, x.shape, w, bias, out, c, c.block_m)
