"""Helpers every Triton kernel family shares: the one rounding of a float32 result to the output dtype, the start of
an early (programmatic dependent) launch, the reused workspace the prefill paths dequantize into, and the prefill
that multiplies that dense copy with cuBLAS."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from ..device import early_launch


@triton.jit
def round_to_output(y, out_dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 -> fp16/bf16, round-to-nearest-even. The CPU interpreter's own bf16 cast does not
    round to nearest even, so there the rounding is done on the bits (finite values only)."""
    if INTERPRET and out_dtype == tl.bfloat16:
        bits = y.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return y.to(out_dtype)


@triton.jit
def wait_for_previous_kernel(EARLY: tl.constexpr):
    """The first statement of a kernel that ``early_launch_args`` launches: with EARLY, let the next kernel launch
    (it too waits before it touches memory a kernel writes) and wait until the previous kernel has finished and its
    writes are visible; nothing before this reads or writes memory."""
    if EARLY:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


def early_launch_args(device: torch.device) -> dict:
    """The launch keywords of a kernel that starts with ``wait_for_previous_kernel``: ``EARLY`` and Triton's
    ``launch_pdl``, both on where ``device.early_launch`` allows it (a CUDA device, not the interpreter)."""
    early = device.type == "cuda" and not triton_interpret() and early_launch(device.index)
    return {"EARLY": early, "launch_pdl": early}


_WORKSPACE: dict[tuple, torch.Tensor] = {}


def workspace(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reused flat buffer of at least ``numel`` elements per (device, dtype) (grown, never shrunk): prefill
    never holds more than one layer's dense copy."""
    key = (device, dtype)
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        _WORKSPACE[key] = buf
    return buf[:numel]


def dequantize_matmul(x: torch.Tensor, w, bias: torch.Tensor | None, out_dtype: torch.dtype | None,
                      dequantize) -> torch.Tensor:
    """Prefill of either format: ``dequantize(w, dtype, dense, row0=...)`` writes the weight's rows into the shared
    workspace, then ``torch.matmul`` (cuBLAS); gated prepacks fuse ``silu(gate) * up`` after the two products.
    ``out_dtype=float32`` (plain prepacks, no bias): cuBLAS writes its float32 sums unrounded."""
    n, k = w.out_features, w.in_features
    dense = workspace(n * k, x.dtype, x.device).view(n, k)
    dequantize(w, x.dtype, dense)
    if out_dtype is not None and out_dtype != x.dtype:
        if w.gated or bias is not None:
            raise ValueError("a float32 prefill output is for plain prepacks without bias")
        return torch.mm(x, dense.t(), out_dtype=out_dtype)
    y = torch.matmul(x, dense.t())
    if not w.gated:
        return y + bias if bias is not None else y
    dequantize(w, x.dtype, dense, row0=w.up_offset)  # stream-ordered after the first matmul
    return torch.nn.functional.silu(y) * torch.matmul(x, dense.t())
