"""Opt-in W8A8 prefill for FP8 prepacks (``ANYFP4_FP8_PREFILL=w8a8``): the activations quantized to E4M3 with a
static per-tensor ``input_scale`` (the checkpoint's, as ModelOpt calibrates it), one ``torch._scaled_mm`` on FP8
tensor cores, then the per-row weight scales (and bias, or SiLU * up) applied to its float32 output:

    y = (x_q @ W_q^T) * input_scale * scale[n],   x_q = e4m3(clamp(x / input_scale, -448, 448))

The prepack's words keep their bits in the decode layout (``packing.fp8.BYTE_BITS``), so the weight is first
written back as plain E4M3 bytes, row-major, into a reused workspace (``fp8_linear.fp8_raw_kernel``; on the CPU
the prepack's pure-torch inverse, so the CPU path needs no Triton): 2 bytes moved per weight where weight-only
dequantization moves 3, and a GEMM reading half the operand bytes. The padded prepack (rows to ``ROW_ALIGN``, K to ``K_ALIGN``) is used whole, so
every GEMM dimension is a multiple of 16 as ``_scaled_mm`` wants; padding is zero on both sides.
"""

from __future__ import annotations

import torch

from ..packing.fp8 import FP8Prepacked, checkpoint_words

E4M3_MAX = 448.0


def raw_weight(w: FP8Prepacked, row0: int = 0) -> torch.Tensor:
    """The E4M3 weight of one half of the prepack (rows ``row0 ..``, padding included) as a (rows, K_pad)
    float8_e4m3fn tensor: in the shared workspace on a GPU (valid until the next prefill), a new tensor on
    the CPU."""
    rows = (w.up_offset or w.codes.shape[0]) if row0 == 0 else w.codes.shape[0] - row0
    if not w.codes.is_cuda:
        return checkpoint_words(w.codes[row0:row0 + rows]).contiguous().view(torch.float8_e4m3fn)
    from .triton.fp8_linear import fp8_raw_weight

    return fp8_raw_weight(w, row0, rows)


def quantize_activations(x2: torch.Tensor, input_scale: torch.Tensor, k_pad: int) -> torch.Tensor:
    """(M, K) activations -> (M rounded up to 16, K_pad) E4M3 (``_scaled_mm`` wants every dimension a multiple
    of 16), ``x / input_scale`` rounded to nearest even in float32, saturated to +-448, zero past M and K."""
    q = torch.zeros(-(-x2.shape[0] // 16) * 16, k_pad, dtype=torch.float8_e4m3fn, device=x2.device)
    q[: x2.shape[0], : x2.shape[1]] = (x2.float() / input_scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q


def w8a8_matmul(x2: torch.Tensor, w: FP8Prepacked, bias: torch.Tensor | None,
                input_scale: torch.Tensor) -> torch.Tensor:
    """(M, K) activations -> (M, N) in x's dtype; a gated prepack gives silu(gate) * up."""
    n = w.out_features
    s_in = input_scale.reshape(()).float()
    xq = quantize_activations(x2, s_in, w.codes.shape[1] * 4)
    one = torch.ones((), dtype=torch.float32, device=x2.device)

    def half(row0: int) -> torch.Tensor:
        raw = raw_weight(w, row0)
        y = torch._scaled_mm(xq, raw.t(), scale_a=s_in, scale_b=one, out_dtype=torch.float32)
        return y[: x2.shape[0], :n] * w.scales[row0:row0 + n]

    if w.gated:
        y = torch.nn.functional.silu(half(0)) * half(w.up_offset)
    else:
        y = half(0)
        if bias is not None:
            y = y + bias.float()
    return y.to(x2.dtype)
