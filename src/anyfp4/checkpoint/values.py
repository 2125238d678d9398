"""The value ranges a checkpoint's tensors must fall in, and the checks, run on each tensor as it is read.

Where the ranges come from: every quantized weight was a bf16/fp16 weight before quantization, and
anyfp4 can run any checkpoint with fp16 activations, so a dequantized weight must fit fp16. A layer's
absolute maximum ``amax`` is therefore taken to lie in [2^-24, 65504]: from the smallest fp16
subnormal to the largest fp16 value (trained LLM weights sit far inside it, bf16 ones included).
The per-layer scales follow from ``amax``:

- NVFP4 global scale, ModelOpt (``weight_scale_2``, multiplied): amax / (6 * 448) in [2.2e-11, 24.4];
- NVFP4 global scale, compressed-tensors (``weight_global_scale``, divided): (6 * 448) / amax in
  [0.041, 4.5e10], whose float32 reciprocal is then finite and normal;
- FP8 weight scale (per tensor or per channel) and FP8 input scale: amax / 448 in [1.3e-10, 146.2].

Float tensors (unquantized weights, embeddings, norms, biases) must be finite and within +-65504.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .errors import CheckpointError

FP16_MAX = 65504.0
AMAX_RANGE = (2.0**-24, FP16_MAX)
E2M1_MAX, E4M3_MAX = 6.0, 448.0
NVFP4_SCALE_RANGE = (AMAX_RANGE[0] / (E2M1_MAX * E4M3_MAX), AMAX_RANGE[1] / (E2M1_MAX * E4M3_MAX))
NVFP4_RECIPROCAL_SCALE_RANGE = (1 / NVFP4_SCALE_RANGE[1], 1 / NVFP4_SCALE_RANGE[0])
FP8_SCALE_RANGE = (AMAX_RANGE[0] / E4M3_MAX, AMAX_RANGE[1] / E4M3_MAX)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_scale_range(value: torch.Tensor, bounds: tuple[float, float], what: str, file: Path, tensor: str) -> None:
    """Every element of ``value`` (float32) in ``[lo, hi]``; NaN and Inf fall outside."""
    lo, hi = bounds
    v = value.double().flatten()
    bad = ~((v >= lo) & (v <= hi))
    if bad.any():
        first = v[bad][0].item()
        raise CheckpointError(f"{what} must lie in [{lo:.3g}, {hi:.3g}] (an amax of {AMAX_RANGE[0]:.3g} to "
                              f"{AMAX_RANGE[1]:.0f}), found {first:.6g}", file=file, tensor=tensor)


def check_float_values(t: torch.Tensor, what: str, file: Path, tensor: str) -> None:
    """A float tensor is finite and within +-65504: one min/max reduction (NaN propagates through it),
    the details computed only for the error message."""
    if t.numel() == 0 or t.dtype not in _FLOATS:
        return
    lo, hi = torch.aminmax(t)
    if bool(lo >= -FP16_MAX) and bool(hi <= FP16_MAX):
        return
    nonfinite = ~torch.isfinite(t)
    if nonfinite.any():
        first = t.flatten()[nonfinite.flatten()][0].item()
        raise CheckpointError(f"{what} holds {int(nonfinite.sum())} NaN/Inf value(s), e.g. {first}", file=file,
                              tensor=tensor)
    worst = t.abs().max().item()
    raise CheckpointError(f"{what} holds values beyond +-{FP16_MAX:.0f} (the fp16 range), e.g. {worst:.6g}",
                          file=file, tensor=tensor)
