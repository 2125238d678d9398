"""Random weights of a shape, made on the device, for timing and for random-weight models: never zeros (a
kernel must not be timed on zeros), never NaN.

- NVFP4: codes uniform over all 16 values (random bytes), block scales E4M3 bytes of positive normal
  values (bytes 0x30..0x7D by default: 0.5 .. 416), one global scale (1e-3 by default);
- FP8: E4M3 bytes over the finite range (0x00..0x7D) with a random sign, one scale per tensor (1e-3 by
  default) or per row;
- bf16: Gaussian, ``std`` wide.

Every maker draws from ``generator`` (or torch's default one) in a fixed order, so a seeded generator
gives the same weights every time.
"""

from __future__ import annotations

import torch

from ..formats.fp8 import FP8Weight
from ..formats.nvfp4 import GROUP_SIZE, NVFP4Weight

NVFP4_SCALE_BYTES = (0x30, 0x7E)  # [low, high) of the E4M3 block-scale bytes: positive normals, 0.5 .. 416
FP8_FINITE_BYTES = 0x7E  # magnitude bytes 0x00..0x7D (0 .. 416): 0x7E, 448, is left out; 0x7F is NaN


def random_nvfp4(n: int, k: int, device, generator: torch.Generator | None = None, *,
                 scale_bytes: tuple[int, int] = NVFP4_SCALE_BYTES, global_scale: float = 1e-3) -> NVFP4Weight:
    """An (n, k) NVFP4 weight: packed (n, k // 2) random bytes, block scales (n, k // 16) E4M3 bytes drawn
    from ``[scale_bytes[0], scale_bytes[1])``, a () float32 global scale."""
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device, generator=generator)
    scales = torch.randint(*scale_bytes, (n, k // GROUP_SIZE), dtype=torch.uint8, device=device, generator=generator)
    return NVFP4Weight(packed, scales.view(torch.float8_e4m3fn), torch.tensor(global_scale, device=device))


def random_fp8(n: int, k: int, device, generator: torch.Generator | None = None, per_channel: bool = False, *,
               scale: float = 1e-3, input_scale: float | None = None) -> FP8Weight:
    """An (n, k) FP8 weight: E4M3 bytes of any finite magnitude but 448, either sign; a () float32 scale of
    ``scale``, or with ``per_channel`` (n,) row scales uniform in [scale / 2, 3 * scale / 2); a () static
    activation scale when ``input_scale`` is given (as W8A8 checkpoints carry one)."""
    raw = torch.randint(0, FP8_FINITE_BYTES, (n, k), dtype=torch.uint8, device=device, generator=generator)
    sign = torch.randint(0, 2, (n, k), dtype=torch.uint8, device=device, generator=generator) << 7
    if per_channel:
        row_scale = scale * (0.5 + torch.rand(n, device=device, generator=generator))
    else:
        row_scale = torch.tensor(scale, device=device)
    activation_scale = torch.tensor(input_scale, device=device) if input_scale is not None else None
    return FP8Weight((raw | sign).view(torch.float8_e4m3fn), row_scale, activation_scale)


def random_bf16(n: int, k: int, device, generator: torch.Generator | None = None, std: float = 0.02) -> torch.Tensor:
    """An (n, k) bf16 weight, Gaussian with standard deviation ``std`` (drawn in float32, then rounded)."""
    return (torch.randn(n, k, device=device, generator=generator) * std).to(torch.bfloat16)
