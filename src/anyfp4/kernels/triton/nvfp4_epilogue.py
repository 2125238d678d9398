"""The end of the NVFP4 decode kernels (``nvfp4_decode``, ``nvfp4_gemv``): the epilogue (global scale, SiLU * up
or bias, the one rounding to the output dtype) and the split-K reduction, which adds the float32 partials of
every K slice in the fixed order 0, 1, ... (no atomics: identical inputs give identical bits) before it."""

from __future__ import annotations

import triton
import triton.language as tl

from .common import round_to_output


@triton.jit
def epilogue(acc, acc_up, offs_m, offs_n, M, N_OUT, gscale_ptr, bias_ptr, out_ptr, stride_om,
             HAS_BIAS: tl.constexpr, GATED: tl.constexpr, INTERPRET: tl.constexpr):
    """(rows, columns) float32 sums of the weights as decoded (e2m1 * bs * 2^-14) -> the output."""
    g = tl.load(gscale_ptr) * 16384.0  # global scale * 2^14
    y = acc * g
    if GATED:
        u = acc_up * g
        y = y / (1.0 + tl.exp(-y)) * u
    elif HAS_BIAS:
        y = y + tl.load(bias_ptr + offs_n, mask=offs_n < N_OUT, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N_OUT)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
             round_to_output(y, out_ptr.dtype.element_ty, INTERPRET), mask=mask)


@triton.jit
def splitk_reduce_kernel(partial_ptr, gscale_ptr, bias_ptr, out_ptr, M, N_OUT, stride_om, SPLIT_K,
                         BLOCK_R: tl.constexpr, HAS_BIAS: tl.constexpr,
                         GATED: tl.constexpr, INTERPRET: tl.constexpr):
    """Sum the SPLIT_K fp32 partials of each output in the fixed order 0..SPLIT_K-1, then the epilogue."""
    m = tl.program_id(1)
    offs_n = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask = offs_n < N_OUT
    width = N_OUT * (2 if GATED else 1)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for s in range(0, SPLIT_K):
        row = partial_ptr + s * M * width + m * width
        acc += tl.load(row + offs_n, mask=mask, other=0.0)
        if GATED:
            acc_up += tl.load(row + N_OUT + offs_n, mask=mask, other=0.0)
    epilogue(acc[None, :], acc_up[None, :], tl.zeros((1,), dtype=tl.int32) + m, offs_n, M, N_OUT, gscale_ptr,
             bias_ptr, out_ptr, stride_om, HAS_BIAS, GATED, INTERPRET)
