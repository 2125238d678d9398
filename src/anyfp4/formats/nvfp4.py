"""NVFP4: E2M1 codes, nibble packing, two-level scaling. The reference every kernel is tested against.

An NVFP4 weight of shape (N, K) is three tensors (ModelOpt names):

- ``weight``: (N, K // 2) uint8, two E2M1 codes per byte; element ``k = 2j`` is the LOW
  nibble of byte ``j``, ``k = 2j + 1`` the HIGH nibble.
- ``weight_scale``: (N, K // 16) float8_e4m3fn, one block scale per 16 consecutive k.
- ``weight_scale_2``: () float32 global scale (multiply by it).

``W[n, k] = e2m1(code[n, k]) * float(weight_scale[n, k // 16]) * weight_scale_2``.

E2M1 code bits are ``s mmm``: magnitude codes 0..7 decode to {0, .5, 1, 1.5, 2, 3, 4, 6},
code 8 is -0. Quantization follows NVIDIA ModelOpt 0.47 (``NVFP4_DEFAULT_CFG`` export)
operation for operation, so that anyfp4 writes the same bytes for the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fp8 import E4M3_MAX, e4m3_decode

GROUP_SIZE = 16
E2M1_MAX = 6.0
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Block-scale clamp: the smallest E4M3 subnormal and the largest finite E4M3 value.
BLOCK_SCALE_MIN = 2.0**-9


def e2m1_values() -> torch.Tensor:
    """The 16 E2M1 code values as float32, indexed by code (8..15 are the negatives, 8 is -0)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    return torch.cat([mags, -mags])


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes (uint8 holding 0..15) to float32 with integer bit arithmetic.

    Magnitude bits ``e m`` (exponent e in 0..3 at bits 2..1, mantissa m at bit 0):
    e == 0 is subnormal (m * 0.5), otherwise (2 + m) * 2^(e - 2).
    """
    c = codes.to(torch.int32)
    exponent = (c >> 1) & 0x3
    mantissa = c & 0x1
    significand = torch.where(exponent > 0, 2 + mantissa, mantissa)  # in units of 2^(e - 2) (or 2^-1)
    power = torch.where(exponent > 0, exponent, torch.ones_like(exponent)) - 2
    value = torch.ldexp(significand.to(torch.float32), power.to(torch.float32))
    return torch.where(((c >> 3) & 1) == 1, -value, value)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round float values (already divided by their scales) to E2M1 codes, uint8 in 0..15.

    Round-to-nearest, ties-to-even (in code space: 0.25->0, 0.75->1, 1.25->1, 1.75->2,
    2.5->2, 3.5->4, 5->4), saturating at 6. A negative value keeps its sign bit even when
    it rounds to zero (-0.1 -> code 8), as ModelOpt does; -0.0 itself encodes as 0.
    NaN has no E2M1 code: callers must reject non-finite input first.
    """
    xf = x.to(torch.float32)
    a = xf.abs()
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=xf.device)
    mids = (mags[:-1] + mags[1:]) * 0.5  # 0.25 0.75 1.25 1.75 2.5 3.5 5
    # code = number of midpoints strictly below a, plus one at a tie whose upper neighbour is even.
    code = (a.unsqueeze(-1) > mids).sum(-1)
    upper_is_even = torch.tensor([0, 1, 0, 1, 0, 1, 0], dtype=torch.bool, device=xf.device)
    tie_up = ((a.unsqueeze(-1) == mids) & upper_is_even).any(-1)
    code = code + tie_up.to(code.dtype)
    sign = (xf < 0).to(code.dtype) << 3
    return (sign | code).to(torch.uint8)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) uint8 codes in 0..15 -> (..., K // 2) bytes; even k in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even last dimension, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """(..., K // 2) bytes -> (..., K) uint8 codes; the inverse of ``pack_nibbles``."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_nibbles expects uint8, got {packed.dtype}")
    low = packed & 0xF
    high = packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


@dataclass(frozen=True)
class NVFP4Weight:
    """An NVFP4 linear weight in ModelOpt layout (see the module docstring for shapes)."""

    packed: torch.Tensor  # (N, K // 2) uint8
    block_scale: torch.Tensor  # (N, K // 16) float8_e4m3fn
    global_scale: torch.Tensor  # () float32, multiply

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2


def _global_scale(amax: torch.Tensor, fp8_max: float = E4M3_MAX) -> torch.Tensor:
    """``amax / (6 * fp8_max)`` in float32. An all-zero weight's amax counts as 6 (its quantizer's
    maxbound, as ModelOpt's ``export_amax`` substitutes): scale 1 / 448, all codes 0, decoding to exact
    zeros. ModelOpt 0.47's weight export divides by the zero scale instead and writes NaN block scales."""
    amax = amax.float()
    amax = torch.where(amax == 0, torch.full_like(amax, E2M1_MAX), amax)
    return amax / (E2M1_MAX * fp8_max)


def nvfp4_global_scale(weight: torch.Tensor, fp8_max: float = E4M3_MAX) -> torch.Tensor:
    """``amax(|W|) / (6 * fp8_max)`` as a float32 scalar (ModelOpt's ``weight_scale_2``)."""
    return _global_scale(weight.abs().amax(), fp8_max)


def nvfp4_block_scales(weight: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Per-16 block scales: ``block_amax / (6 * global_scale)``, all-zero blocks -> 1.0,
    clamped to [2^-9, 448], cast to E4M3 (round-to-nearest-even). Shape (N, K // 16)."""
    n, k = weight.shape
    block_amax = weight.reshape(n, k // GROUP_SIZE, GROUP_SIZE).abs().amax(dim=-1).float()
    scale = block_amax / (E2M1_MAX * global_scale.float())
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale.clamp(min=BLOCK_SCALE_MIN, max=E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_nvfp4(weight: torch.Tensor, global_scale: torch.Tensor | None = None) -> NVFP4Weight:
    """Quantize a float (N, K) weight to NVFP4 exactly as ModelOpt's export does.

    ``global_scale`` lets fused projections (q/k/v, gate/up) share one scale: pass the
    scale computed from the largest amax among them (see ``shared_global_scale``).
    Each element is divided, in float32, by ``float(block_scale) * global_scale``
    (that product rounded to float32 first) and rounded to E2M1.
    """
    if weight.dim() != 2:
        raise ValueError(f"quantize_nvfp4 expects a 2-D weight, got shape {tuple(weight.shape)}")
    n, k = weight.shape
    if k % GROUP_SIZE:
        raise ValueError(f"NVFP4 needs K (in_features) to be a multiple of {GROUP_SIZE}, got K = {k}")
    if not weight.is_floating_point():
        raise TypeError(f"quantize_nvfp4 expects a floating-point weight, got {weight.dtype}")
    if not torch.isfinite(weight).all():
        raise ValueError("cannot quantize a weight that holds NaN or Inf")
    if global_scale is None:
        global_scale = nvfp4_global_scale(weight)
    global_scale = global_scale.float()
    if not (torch.isfinite(global_scale) and global_scale > 0):
        raise ValueError(f"NVFP4 global scale must be finite and positive, got {global_scale.item()}")
    block_scale = nvfp4_block_scales(weight, global_scale)
    divisor = block_scale.float() * global_scale  # (N, K/16), float32
    scaled = weight.float().reshape(n, k // GROUP_SIZE, GROUP_SIZE) / divisor.unsqueeze(-1)
    codes = e2m1_encode(scaled.reshape(n, k))
    return NVFP4Weight(pack_nibbles(codes), block_scale, global_scale)


def shared_global_scale(weights: list[torch.Tensor]) -> torch.Tensor:
    """One global scale for projections that are fused at run time: from the largest amax."""
    return _global_scale(torch.stack([w.abs().amax().float() for w in weights]).amax())


def _byte_lut(device: torch.device) -> torch.Tensor:
    """(256, 2) float32: the (low, high) nibble values of every byte, from ``e2m1_decode``."""
    key = str(device)
    lut = _BYTE_LUTS.get(key)
    if lut is None:
        lut = e2m1_decode(unpack_nibbles(torch.arange(256, dtype=torch.uint8).reshape(256, 1))).to(device)
        _BYTE_LUTS[key] = lut
    return lut


_BYTE_LUTS: dict[str, torch.Tensor] = {}


def dequantize_nvfp4(q: NVFP4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reconstruct (N, K): ``(e2m1 * float(block_scale)) * global_scale`` in float32, then ``dtype``.

    ``e2m1 * block_scale`` is exact in float32 (at most 5 significant bits); the multiply
    by the global scale is the one float32 rounding, and the cast to ``dtype`` the second.
    Kernels that dequantize must reproduce this bit for bit.
    """
    n, k = q.shape
    values = _byte_lut(q.packed.device)[q.packed.long()].reshape(n, k // GROUP_SIZE, GROUP_SIZE)
    scales = e4m3_decode(q.block_scale).unsqueeze(-1)
    out = (values * scales) * q.global_scale.float()
    return out.reshape(n, k).to(dtype)
