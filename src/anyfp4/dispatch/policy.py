"""Which kernel runs a quantized linear: one pure function of plain values (``choose_kernel``), the one place that
decides it for NVFP4 and FP8 alike.

The op (``ops.linear_run``) gathers what the choice depends on at call time — the device's sm, whether the CUDA
decode kernel serves it, the ``ANYFP4_*`` switches from ``env.py`` — and passes them in, so this module reads no
environment and no device, and its whole behaviour is a table (``tests/dispatch/test_policy.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .limits import DECODE_ROWS

FORMATS = ("nvfp4", "fp8")

# Activation block-pack of the Triton decode kernel pays from these M on (sm -> first M). sm_70 / sm_75: the
# measurements of the hand-written kernels this design comes from. sm_90: never — on the H200 the packed variant
# was slower at every M and shape measured (54 of 54 cases, nvfp4_linear_h200.json), because this kernel loads an
# activation tile row by row into shared memory either way. Other GPUs: off until measured.
ACT_PACK_FROM_M = {70: 8, 75: 7}

W8A8_MIN_SM = 89  # FP8 tensor cores (torch._scaled_mm)


class Kernel(enum.Enum):
    """What computes a call (the format's launcher of that kind, ``ops.nvfp4`` / ``ops.fp8``)."""
    CPU = "cpu"  # the C kernels (kernels/cpu) where they build, else the pure-torch reference
    CUDA_MMA = "cuda-mma"  # the CUDA tensor-core decode kernel (kernels/cuda/weight_mma), all rows at once
    CUDA_MMA_ROW_CHUNKS = "cuda-mma-row-chunks"  # the same, DECODE_ROWS rows at a time (ANYFP4_PREFILL=chunked)
    TRITON_GEMV = "triton-gemv"  # M = 1: the Triton GEMV kernel
    TRITON_DECODE = "triton-decode"  # NVFP4, M <= DECODE_ROWS: the Triton tensor-core decode kernel
    TRITON_FUSED_PREFILL = "triton-fused-prefill"  # NVFP4 prefill, weight tiles decoded in registers
    DEQUANTIZE_CUBLAS = "dequantize-cublas"  # dequantize the weight, then one cuBLAS matmul
    W8A8_SCALED_MM = "w8a8-scaled-mm"  # FP8 prefill: activations quantized with input_scale, torch._scaled_mm


@dataclass(frozen=True)
class Choice:
    kernel: Kernel
    act_pack: bool = False  # TRITON_DECODE: block-pack the activation tiles
    warning: str | None = None  # a setting that could not apply here, for the caller to tell once


def act_pack_auto(sm: int, m: int) -> bool:
    first = ACT_PACK_FROM_M.get(sm)
    return first is not None and m >= first


# ANYFP4_PREFILL=auto on sm_90+ (H100, 2026-12-06, x bf16 F.linear in the same run): dequantize + cuBLAS costs ~2.5
# bytes a weight before its GEMM, 0.41-0.65x bf16 at 48-256 rows (results/prefill_modes_h100.json). NVFP4's fused
# Triton GEMM, with its tiles decoded two codes per integer operation and tiles of 64 rows
# (results/fused_configs_h100.json, the tiles in ``dispatch.tuning.fused_config``), beats it on every measured shape
# up to 64 rows (gate+up 28672x4096 at 48: 62 vs 210 us, 1.35x bf16; 28672x8192: 110 vs 385; 4096x14336: 96 vs 105;
# 5120x1536: 12.8 vs 12.8) and at 65-128 rows on weights of >= 24M elements (14336x4096 at 128: 53 vs 104; 6144x4096:
# 37 vs 45; 4096x14336: 100 vs 109), not on smaller ones (5120x1536: 15 vs 13); from 256 rows they tie or cuBLAS wins.
AUTO_FUSED_MIN_ROWS = DECODE_ROWS + 1  # call rows
AUTO_FUSED_ANY_SHAPE_ROWS = 2 * DECODE_ROWS
AUTO_FUSED_MAX_ROWS = 4 * DECODE_ROWS
AUTO_FUSED_MIN_ELEMENTS = 24 * 2 ** 20  # weight rows (both halves of a gated weight) x K, above 64 rows
AUTO_MIN_SM = 90  # where those were measured; elsewhere dequantize + cuBLAS


def auto_prefill_kernel(fmt: str, m: int, sm: int, mma_enabled: bool, weight_rows: int, k: int) -> Kernel:
    """``ANYFP4_PREFILL=auto``'s kernel for an ``m``-row prefill call (m > DECODE_ROWS) of a ``weight_rows`` x ``k``
    weight (a gated weight's rows: both halves), by the measurements above — made with fp16 / bf16 activations on
    a GPU the CUDA decode kernel serves (``mma_enabled``); without it, dequantize + cuBLAS."""
    if fmt == "nvfp4" and sm >= AUTO_MIN_SM and mma_enabled and AUTO_FUSED_MIN_ROWS <= m <= AUTO_FUSED_MAX_ROWS:
        if m <= AUTO_FUSED_ANY_SHAPE_ROWS or weight_rows * k >= AUTO_FUSED_MIN_ELEMENTS:
            return Kernel.TRITON_FUSED_PREFILL
    return Kernel.DEQUANTIZE_CUBLAS


def choose_kernel(fmt: str, m: int, sm: int | None, *, mma_enabled: bool = False, prefill: str = "cublas",
                  act_pack: str = "auto", fp8_prefill: str = "weight-only", has_input_scale: bool = False,
                  partial: bool = False, weight_shape: tuple[int, int] | None = None) -> Choice:
    """The kernel for an ``m``-row call of a ``fmt`` layer.

    ``sm``: the CUDA device's sm (major * 10 + minor), None off CUDA; ``mma_enabled``: the CUDA decode kernel
    serves that device (``kernels.cuda.weight_mma.enabled``); ``prefill``, ``act_pack``, ``fp8_prefill``: the
    values of ``ANYFP4_PREFILL``, ``ANYFP4_ACT_PACK``, ``ANYFP4_FP8_PREFILL``; ``has_input_scale``: the FP8 layer
    carries a static activation scale; ``partial``: the float32 share before the weight's scale is asked for.

    Decode-sized calls (M <= DECODE_ROWS) take the CUDA kernel where it serves, else the Triton GEMV (M = 1) or
    decode kernel (NVFP4; FP8 has none and dequantizes). Prefill takes dequantize + cuBLAS unless
    ``ANYFP4_PREFILL`` says ``chunked`` (the CUDA kernel in row chunks, where it serves), ``fused`` (NVFP4's
    fused Triton GEMM) or ``auto`` with a ``weight_shape`` (rows, K) that ``auto_prefill_kernel`` gives another
    kernel; an FP8 layer with an input scale, not asked for its share, takes W8A8 with ``ANYFP4_FP8_PREFILL=w8a8``
    on the CPU, or on sm_89+ unless ``chunked``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r} (one of {', '.join(FORMATS)})")
    prefill_rows = m > DECODE_ROWS
    warning = None
    if fmt == "fp8" and fp8_prefill == "w8a8" and has_input_scale and prefill_rows and not partial:
        if sm is None:
            return Choice(Kernel.W8A8_SCALED_MM)
        if sm < W8A8_MIN_SM:
            warning = (f"ANYFP4_FP8_PREFILL=w8a8 needs FP8 tensor cores (sm_{W8A8_MIN_SM}+); FP8 prefill stays "
                       "weight-only here")
        elif prefill != "chunked":
            return Choice(Kernel.W8A8_SCALED_MM)
    if sm is None:
        return Choice(Kernel.CPU, warning=warning)
    if prefill_rows and prefill == "auto" and weight_shape is not None:
        kernel = auto_prefill_kernel(fmt, m, sm, mma_enabled, *weight_shape)
    elif not prefill_rows and mma_enabled:
        kernel = Kernel.CUDA_MMA
    elif prefill_rows and prefill == "chunked" and mma_enabled:
        kernel = Kernel.CUDA_MMA_ROW_CHUNKS
    elif prefill_rows and prefill == "fused" and fmt == "nvfp4":
        kernel = Kernel.TRITON_FUSED_PREFILL
    elif prefill_rows:
        kernel = Kernel.DEQUANTIZE_CUBLAS
    elif m == 1:
        kernel = Kernel.TRITON_GEMV
    elif fmt == "nvfp4":
        pack = act_pack == "1" or (act_pack == "auto" and act_pack_auto(sm, m))
        return Choice(Kernel.TRITON_DECODE, act_pack=pack, warning=warning)
    else:
        kernel = Kernel.DEQUANTIZE_CUBLAS
    return Choice(kernel, warning=warning)


def decode_rows_invariant(sm: int | None, mma_enabled: bool) -> bool:
    """Whether ``choose_kernel`` gives every call of up to DECODE_ROWS rows one kernel with one summation order
    per row, so that a row's bits do not depend on M (what speculative verification relies on): the CPU's C
    kernels and the CUDA decode kernel do; the Triton path does not (a GEMV at M = 1, the decode kernel or
    dequantize + cuBLAS above, each M bucket with its own split)."""
    return sm is None or mma_enabled


def experts_on_cuda_mma(sm: int | None, mma_enabled: bool, dtype_is_half: bool) -> bool:
    """Whether a mixture of experts' grouped NVFP4 / FP8 op runs the CUDA decode kernel's grouped launch (a GPU
    it serves, fp16 / bf16 activations); else its Triton kernel (GPU) or the reference (CPU)."""
    return sm is not None and mma_enabled and dtype_is_half
