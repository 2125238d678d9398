"""NVFP4 GEMV for one activation row (M = 1, batch-1 decode): ``out[1, N] = x[1, K] @ W[N, K]^T``,
plain (+ bias) or gated (``silu(gate) * up``).

Anatomy: ``@triton.jit`` kernel, launcher. Same prepack and split-K reduction as
``nvfp4_decode`` (and its epilogue and fixed-order reduce kernel, ``nvfp4_epilogue``), but no tensor cores:
each program owns a few rows and a long K range, loads the code words of a row 16 bytes at a
time, and for each of the 8 code positions decodes a whole word tile with integer bit
arithmetic and multiply-adds it with the matching activations in float32. Everything stays in
the layout of the loaded words (no shared-memory round trip), which is what makes it faster
than the tensor-core kernel at M = 1 (benchmarks/NOTES.md).

Per 16-element block the partial sum is multiplied by the block scale once: the prepacked
scale byte ``b`` (``packing.nvfp4.SCALE_BYTE``) shifted to ``b << 20`` is, as float32 bits,
exactly ``bs * 2^-117`` (a normal float32, or 0), and ``* 2^117`` restores ``bs``. E2M1 codes decode to fp16 bits
(magnitude at 9-11, sign at 15) = ``e2m1 * 2^-14`` exactly, widened to float32; the
epilogue multiplies by ``global_scale * 2^14``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...dispatch.configs import DecodeConfig
from ...env import triton_interpret
from ...packing.nvfp4 import NVFP4Prepacked
from .bits import e2m1_fp16_at, tiled_scale_offset, tiled_word_offset
from .nvfp4_epilogue import epilogue, splitk_reduce_kernel


@triton.jit
def row_tile_dot(x_ptr, codes_ptr, scales_ptr, rows, t, j, K, stride_c, stride_s, BLOCK_K: tl.constexpr):
    """sum over one K tile of (e2m1 * 2^-14) * bs * x, per row: (BLOCK_N,) float32."""
    words = tl.load(codes_ptr + tiled_word_offset(rows[:, None], (t * (BLOCK_K // 8) + j)[None, :], stride_c))
    sb = tl.load(scales_ptr + tiled_scale_offset(rows[:, None], (t * (BLOCK_K // 16) + j // 2)[None, :], stride_s))
    scale = (sb.to(tl.int32) << 20).to(tl.float32, bitcast=True) * 1.6615349947311448e35  # * 2^117
    part = tl.zeros(words.shape, dtype=tl.float32)
    for i in tl.static_range(8):
        kk = t * BLOCK_K + j * 8 + i
        xi = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        w = e2m1_fp16_at(words, i).to(tl.float32)
        part += w * xi[None, :]
    return tl.sum(part * scale, axis=1)


@triton.jit
def nvfp4_gemv_kernel(
    # pointers
    x_ptr, codes_ptr, scales_ptr, gscale_ptr, bias_ptr, out_ptr, partial_ptr,
    # sizes
    K, N_OUT, UP_OFFSET, K_ITERS,
    # strides
    stride_c, stride_s,
    # meta-parameters
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr, INTERPRET: tl.constexpr,
):
    """x: (K,) activations (fp16/bf16); codes/scales: prepack layout; out: (1, N_OUT).
    GATED: gate rows [0, N_OUT), up rows [UP_OFFSET, UP_OFFSET + N_OUT).
    USE_PARTIAL: fp32 sums go to partial (SPLIT_K, 1, N_OUT * (2 if GATED else 1))."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_K // 8)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for it in range(0, K_ITERS):
        t = pid_k * K_ITERS + it
        acc += row_tile_dot(x_ptr, codes_ptr, scales_ptr, rows, t, j, K, stride_c, stride_s, BLOCK_K)
        if GATED:
            acc_up += row_tile_dot(x_ptr, codes_ptr, scales_ptr, rows + UP_OFFSET, t, j, K, stride_c,
                                    stride_s, BLOCK_K)
    if not USE_PARTIAL:
        epilogue(acc[None, :], acc_up[None, :], tl.zeros((1,), dtype=tl.int32), rows, 1, N_OUT, gscale_ptr,
                 bias_ptr, out_ptr, N_OUT, HAS_BIAS, GATED, INTERPRET)
    else:
        width = N_OUT * (2 if GATED else 1)
        mask = rows < N_OUT
        tl.store(partial_ptr + pid_k * width + rows, acc, mask=mask)
        if GATED:
            tl.store(partial_ptr + pid_k * width + N_OUT + rows, acc_up, mask=mask)


def nvfp4_gemv(x: torch.Tensor, w: NVFP4Prepacked, bias: torch.Tensor | None, config: DecodeConfig,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x (1, K) -> (1, N); a gated prepack gives silu(gate) * up. Checked by the op."""
    k = x.shape[1]
    n_out = w.out_features
    k_pad = w.codes.shape[1] * 8
    c = config
    k_tiles = k_pad // c.block_k
    if k_pad % c.block_k or k_tiles % c.split_k:
        raise ValueError(f"config {c} does not tile K_pad = {k_pad}")
    if out is None:
        out = torch.empty(1, n_out, dtype=x.dtype, device=x.device)
    width = n_out * (2 if w.gated else 1)
    partial = out if c.split_k == 1 else torch.empty(c.split_k, 1, width, dtype=torch.float32, device=x.device)
    bias_arg = bias if bias is not None else out
    nvfp4_gemv_kernel[(triton.cdiv(n_out, c.block_n), c.split_k)](
        x, w.codes, w.scales, w.global_scale, bias_arg, out, partial,
        k, n_out, w.up_offset, k_tiles // c.split_k,
        w.codes.stride(0), w.scales.stride(0),
        BLOCK_N=c.block_n, BLOCK_K=c.block_k, USE_PARTIAL=c.split_k > 1, HAS_BIAS=bias is not None,
        GATED=w.gated, INTERPRET=triton_interpret(), num_warps=c.num_warps, num_stages=c.num_stages,
    )
    if c.split_k > 1:
        block_r = 256
        splitk_reduce_kernel[(triton.cdiv(n_out, block_r), 1)](
            partial, w.global_scale, bias_arg, out, 1, n_out, out.stride(0), c.split_k,
            BLOCK_R=block_r, HAS_BIAS=bias is not None, GATED=w.gated, INTERPRET=triton_interpret(), num_warps=4,
        )
    return out
