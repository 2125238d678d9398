"""FP8 E4M3 (``float8_e4m3fn``): bit-level encode/decode and weight quantization.

E4M3 bytes are ``s eeee mmm`` with exponent bias 7. Exponent 0 is subnormal
(``m * 2**-9``), ``s 1111 111`` is NaN, there are no infinities and the largest
finite magnitude is 448.

The decoder here is written with integer bit arithmetic on purpose: it is the
reference for the GPU kernels, which cannot rely on a hardware FP8 conversion
before sm_89. Weight quantization reproduces NVIDIA ModelOpt's export arithmetic
(``FP8_DEFAULT_CFG``: per-tensor ``amax / 448``) so that anyfp4 writes the same
bytes for the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0
E4M3_NAN_MASK = 0x7F  # s.1111.111 is NaN, whatever the sign


def e4m3_decode(byte: torch.Tensor) -> torch.Tensor:
    """Decode E4M3 bytes (uint8 tensor, or a float8_e4m3fn tensor viewed as bytes) to float32.

    Pure integer arithmetic on the bit fields, then one exact power-of-two scaling.
    """
    if byte.dtype == torch.float8_e4m3fn:
        byte = byte.view(torch.uint8)
    if byte.dtype != torch.uint8:
        raise TypeError(f"e4m3_decode expects uint8 or float8_e4m3fn, got {byte.dtype}")
    b = byte.to(torch.int32)
    sign = (b >> 7) & 1
    exponent = (b >> 3) & 0xF
    mantissa = b & 0x7
    # normal: (8 + m) * 2^(e - 10); subnormal (e == 0): m * 2^-9 = m * 2^(1 - 10)
    significand = torch.where(exponent > 0, 8 + mantissa, mantissa)
    power = torch.where(exponent > 0, exponent, torch.ones_like(exponent)) - 10
    value = torch.ldexp(significand.to(torch.float32), power.to(torch.float32))
    value = torch.where(sign == 1, -value, value)
    is_nan = (b & E4M3_NAN_MASK) == E4M3_NAN_MASK
    return torch.where(is_nan, torch.full_like(value, float("nan")), value)


def _e4m3_positive_grid() -> torch.Tensor:
    """The 127 finite non-negative E4M3 values, ascending (byte 0..126 is monotonic)."""
    return e4m3_decode(torch.arange(0, 127, dtype=torch.uint8))


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """Round float values to E4M3 bytes (uint8): round-to-nearest, ties-to-even, saturating.

    Magnitudes beyond 448 (infinities included) saturate to +-448 and NaN maps to
    ``0x7F``, the sign is kept (-0.0 -> 0x80). Below 464 (what rounds to 448 or less) this is exactly what
    ``x.to(torch.float8_e4m3fn)`` does, which the tests check; beyond it torch's cast saturates in some
    versions (2.13) and gives NaN in others (2.11's CPU build), so the saturation is this function's own.
    """
    xf = x.to(torch.float32)
    grid = _e4m3_positive_grid().to(xf.device)
    a = xf.abs().clamp(max=E4M3_MAX)
    hi = torch.searchsorted(grid, a).clamp(min=1, max=126)  # grid[hi-1] < a <= grid[hi]
    lo = hi - 1
    # Midpoints of neighbouring E4M3 values need one more bit: exact in float32.
    mid = (grid[lo] + grid[hi]) * 0.5
    take_hi = (a > mid) | ((a == mid) & (hi % 2 == 0))
    code = torch.where(take_hi, hi, lo)
    code = torch.where(a == 0, torch.zeros_like(code), code)
    code = torch.where(torch.isnan(xf), torch.full_like(code, E4M3_NAN_MASK), code)
    sign = torch.signbit(xf).to(code.dtype) << 7
    return (sign | code).to(torch.uint8)


@dataclass(frozen=True)
class FP8Weight:
    """A weight-only FP8 linear: ``W[n, k] = float(weight[n, k]) * scale[n or ()]``.

    weight: (N, K) float8_e4m3fn. scale: float32, shape () per tensor or (N,) per channel.
    input_scale: a W8A8 checkpoint's static activation scale (float32, shape ()), or None; the weight's
    value does not depend on it (only the opt-in W8A8 prefill uses it).
    """

    weight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None = None

    @property
    def per_channel(self) -> bool:
        return self.scale.dim() > 0

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)


def fp8_weight_scale(weight: torch.Tensor, per_channel: bool = False) -> torch.Tensor:
    """``amax / 448`` in float32: one scalar per tensor, or one per output row.

    An all-zero weight (or row) gets scale 1, its amax counted as 448, the quantizer's maxbound, as
    ModelOpt's ``export_amax`` substitutes: all codes are 0 and decode to exact zeros. ModelOpt 0.47's
    weight export divides by a zero scale instead and writes NaN codes.
    """
    amax = (weight.abs().amax(dim=-1) if per_channel else weight.abs().amax()).float()
    return torch.where(amax == 0, torch.full_like(amax, E4M3_MAX), amax) / E4M3_MAX


def quantize_fp8(weight: torch.Tensor, scale: torch.Tensor | None = None, per_channel: bool = False) -> FP8Weight:
    """Quantize a float (N, K) weight to FP8 E4M3 with ModelOpt's arithmetic.

    Per tensor, ModelOpt divides the weight by a 0-dim float32 scale; torch keeps the
    weight's dtype for that division (a 0-dim tensor does not promote), so a bf16
    weight is divided in bf16 precision before the FP8 cast. Per channel the (N, 1)
    scale promotes the division to float32. Both are reproduced literally here.
    """
    if weight.dim() != 2:
        raise ValueError(f"quantize_fp8 expects a 2-D weight, got shape {tuple(weight.shape)}")
    if scale is None:
        scale = fp8_weight_scale(weight, per_channel)
    if not torch.isfinite(scale).all() or (scale <= 0).any():
        raise ValueError("FP8 weight scale must be finite and positive (does the weight hold NaN or Inf?)")
    divisor = scale[:, None] if scale.dim() == 1 else scale
    quotient = weight / divisor
    return FP8Weight(quotient.to(torch.float8_e4m3fn), scale)


_LUTS: dict[str, torch.Tensor] = {}


def _e4m3_lut(device: torch.device) -> torch.Tensor:
    """(256,) float32 value of every E4M3 byte, from ``e4m3_decode``: gathers are fast on a CPU."""
    key = str(device)
    if key not in _LUTS:
        _LUTS[key] = e4m3_decode(torch.arange(256, dtype=torch.uint8)).to(device)
    return _LUTS[key]


def dequantize_fp8(q: FP8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``float(weight) * scale`` in float32 (one rounding), then cast to ``dtype``."""
    scale = q.scale.to(torch.float32)
    if scale.dim() == 2:  # (N, 1) as some checkpoints store it
        scale = scale.reshape(-1)
    values = _e4m3_lut(q.weight.device)[q.weight.view(torch.uint8).long()]
    out = values * (scale[:, None] if scale.dim() == 1 else scale)
    return out.to(dtype)
