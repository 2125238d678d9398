"""RMSNorm on the GPU, one program per row: ``weight * x / sqrt(mean(x^2) + eps)`` in float32,
rounded once to x's dtype. One launch instead of torch's chain of elementwise and reduction
kernels; and each row's sum of squares is reduced in the same order whatever the number of rows,
so a row's output does not depend on how many rows share the call (a decode step and a
speculative verify pass give the same bits for the same token).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..env import triton_interpret
from .nvfp4_dequant import round_to_output


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The pure-torch definition (the CPU path and the kernel's test oracle)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf).to(x.dtype)


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_x, stride_y, eps,
                    BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, round_to_output(w * (x * inv), y_ptr.dtype.element_ty, INTERPRET),
             mask=inside)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., n) fp16/bf16/fp32, weight (n,) -> (..., n) in x's dtype (into ``out`` if given)."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = out.view(-1, n) if out is not None else torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        rms_norm_kernel[(x2.shape[0],)](x2, weight, y, n, x2.stride(0), y.stride(0), float(eps), BLOCK=block,
                                        INTERPRET=triton_interpret(), num_warps=max(1, min(16, block // 256)))
    return y.view(x.shape)
