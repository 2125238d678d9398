"""Helpers every Triton kernel family shares: the one rounding of a float32 result to the output dtype, and the
reused workspace the prefill paths dequantize into."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def round_to_output(y, out_dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 -> fp16/bf16, round-to-nearest-even. The CPU interpreter's own bf16 cast does not
    round to nearest even, so there the rounding is done on the bits (finite values only)."""
    if INTERPRET and out_dtype == tl.bfloat16:
        bits = y.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return y.to(out_dtype)


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
