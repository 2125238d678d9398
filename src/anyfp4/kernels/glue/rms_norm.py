"""RMSNorm on the GPU, one program per row: ``weight * x / sqrt(mean(x^2) + eps)`` in float32,
rounded once to x's dtype; and the same after a residual add (``h = x + delta`` rounded to x's
dtype as torch's add rounds it, then ``norm(h)``; both returned). One launch instead of torch's chain of elementwise and reduction
kernels; and each row's sum of squares is reduced in the same order whatever the number of rows,
so a row's output does not depend on how many rows share the call (a decode step and a
speculative verify pass give the same bits for the same token). The pure-torch definition is
``glue.reference.rms_norm_reference``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from ..triton.common import early_launch_args, round_to_output, wait_for_previous_kernel


@triton.jit
def add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, y_ptr, n_cols, stride_x, stride_d, stride_h, stride_y, eps,
                        BLOCK: tl.constexpr, INTERPRET: tl.constexpr, EARLY: tl.constexpr):
    wait_for_previous_kernel(EARLY)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + row * stride_d + cols, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)  # with x: not a second wait after the sum
    h = round_to_output(x + d, h_ptr.dtype.element_ty, INTERPRET)
    tl.store(h_ptr + row * stride_h + cols, h, mask=inside)
    hf = h.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / n_cols + eps)
    tl.store(y_ptr + row * stride_y + cols, round_to_output(w * (hf * inv), y_ptr.dtype.element_ty, INTERPRET),
             mask=inside)


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_x, stride_y, eps,
                    BLOCK: tl.constexpr, INTERPRET: tl.constexpr, EARLY: tl.constexpr):
    wait_for_previous_kernel(EARLY)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)  # with x: not a second wait after the sum
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(y_ptr + row * stride_y + cols, round_to_output(w * (x * inv), y_ptr.dtype.element_ty, INTERPRET),
             mask=inside)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x (..., n) as (rows, n) with a contiguous last dimension (a copy only when needed)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., n) fp16/bf16/fp32, weight (n,) -> (..., n) in x's dtype (into ``out`` if given)."""
    n = x.shape[-1]
    x2 = _rows(x)
    y = out.view(-1, n) if out is not None else torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        rms_norm_kernel[(x2.shape[0],)](x2, weight, y, n, x2.stride(0), y.stride(0), float(eps), BLOCK=block,
                                        INTERPRET=triton_interpret(), num_warps=max(1, min(16, block // 256)),
                                        **early_launch_args(x.device))
    return y.view(x.shape)


def add_rms_norm_triton(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                        out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)) for x, delta (..., n) of one dtype; into ``out`` if given."""
    n = x.shape[-1]
    x2, d2 = _rows(x), _rows(delta)
    if out is not None:
        h, y = out[0].view(-1, n), out[1].view(-1, n)
    else:
        h, y = (torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device) for _ in range(2))
    if x2.shape[0]:
        block = triton.next_power_of_2(n)
        add_rms_norm_kernel[(x2.shape[0],)](x2, d2, weight, h, y, n, x2.stride(0), d2.stride(0), h.stride(0),
                                            y.stride(0), float(eps), BLOCK=block, INTERPRET=triton_interpret(),
                                            num_warps=max(1, min(16, block // 256)), **early_launch_args(x.device))
    return h.view(x.shape), y.view(x.shape)
