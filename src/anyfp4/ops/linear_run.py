"""What the NVFP4 and FP8 ops share: one run of a quantized linear from the kernel choice to the launch, the
reference's structure, the unit-scale prepack, the row chunks. A format brings its launchers
(``FormatKernels``); which one runs is ``dispatch.policy``'s decision, fed here with the call's facts.

Every run reads the ``ANYFP4_*`` switches (``env.py``) and the device at call time, inside the custom op, so
torch.compile and CUDA graphs never bake a branch in.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
from torch import Tensor

from .. import env
from ..dispatch.policy import Choice, Kernel, choose_kernel
from ..kernels.cpu.linear import library, linear_on_rows


@dataclass(frozen=True)
class FormatKernels:
    """One weight format's pieces, as ``run_linear`` calls them. ``x2``: (M, K) rows of the activations; ``w``:
    the format's prepack; ``bias``: None for a gated prepack; ``out_dtype``: float32 for a share, else None
    (x's dtype). Each launcher imports its kernel when called (the CPU path needs neither Triton nor NVRTC)."""
    name: str  # "nvfp4" / "fp8": the format of dispatch's policy and launch tables
    k_per_word: int  # k of one int32 code word: the padded K is codes.shape[1] * k_per_word
    sum_scale: str  # the prepack's field of scales applied after the sums (1 in a share's unit-scale prepack)
    strided_rows: bool  # the GPU kernels read rows at any row stride (else rows are made contiguous first)
    dense: Callable  # (w) -> the dequantized (N, K) weight; of a gated prepack: (gate, up)
    cpu_rows: Callable  # (lib, x2, w, row_starts, scaled) -> the C kernel's rows (kernels/cpu/linear.py)
    mma: Callable  # (rows, w, bias, MMAConfig, out_dtype) -> CUDA decode kernel, rows <= DECODE_ROWS
    mma_chunks: Callable  # (x2, w, bias, rows -> MMAConfig, out_dtype) -> the same, DECODE_ROWS rows at a time
    gemv: Callable  # (x2, w, bias, sms) -> Triton GEMV at M = 1, scaled and rounded to x's dtype
    dequantize_matmul: Callable  # (x2, w, bias, out_dtype) -> dequantize + cuBLAS
    decode: Optional[Callable] = None  # (x2, w, bias, sm, sms, act_pack) -> Triton decode, scaled and rounded
    fused_prefill: Optional[Callable] = None  # (x2, w, bias, sm, out_dtype) -> fused Triton prefill GEMM
    w8a8: Optional[Callable] = None  # (x2, w, bias, input_scale) -> W8A8 prefill (FP8)


def unit_scale(w, fmt: FormatKernels):
    """The same prepack with its after-sum scales set to 1: its products are the sums before those scales."""
    return replace(w, **{fmt.sum_scale: torch.ones_like(getattr(w, fmt.sum_scale))})


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(f"anyfp4: {message}", stacklevel=3)


def row_by_row(x2: Tensor, row: Callable[[Tensor], Tensor], n: int, dtype: torch.dtype) -> Tensor:
    """(M, n) of ``dtype``: ``row`` on each row of x2 alone, as a fresh float32 (1, K) tensor. A float32 matmul
    over M rows sums in an order that depends on M (its blocking; at M = 1 another kernel altogether), and an
    elementwise op like silu takes a scalar tail past the last full vector of the call: one row at a time, a
    row's bits depend neither on the call's other rows nor on where it sits among them."""
    y = torch.empty(x2.shape[0], n, dtype=dtype)
    for i in range(x2.shape[0]):
        y[i] = row(x2[i:i + 1].to(torch.float32, copy=True))[0]
    return y


def reference_linear(x: Tensor, w, bias: Optional[Tensor], fmt: FormatKernels, partial: bool = False) -> Tensor:
    """The pure-torch definition: dequantize with formats/ and multiply in float32, each row of x alone
    (``row_by_row``) so that its bits do not depend on the call's other rows (``partial``: before the after-sum
    scales, not rounded to x's dtype)."""
    x2 = x.reshape(-1, w.in_features)
    shape = (*x.shape[:-1], w.out_features)
    if partial:
        dense = fmt.dense(unit_scale(w, fmt))
        return row_by_row(x2, lambda r: r @ dense.t(), w.out_features, torch.float32).reshape(shape)
    if w.gated:
        gate, up = fmt.dense(w)

        def row(r: Tensor) -> Tensor:
            return (torch.nn.functional.silu(r @ gate.t()) * (r @ up.t())).to(x.dtype)
    else:
        dense = fmt.dense(w)
        b = None if bias is None else bias.float()

        def row(r: Tensor) -> Tensor:
            y = r @ dense.t()
            return (y if b is None else y + b).to(x.dtype)
    return row_by_row(x2, row, w.out_features, x.dtype).reshape(shape)


def cpu_linear(x: Tensor, w, bias: Optional[Tensor], fmt: FormatKernels, partial: bool = False) -> Tensor:
    """The op on the CPU: the C kernels (``kernels.cpu.linear``) where they build, else ``reference_linear``."""
    lib = library()
    if lib is None:
        return reference_linear(x, w, bias, fmt, partial)
    return linear_on_rows(x, w, bias, partial, lambda x2, starts, scaled: fmt.cpu_rows(lib, x2, w, starts, scaled))


def _choice(fmt: FormatKernels, m: int, sm: Optional[int], partial: bool, input_scale: Optional[Tensor],
            dtype: torch.dtype, weight_shape: tuple[int, int]) -> Choice:
    """The policy's choice, from the switches of ``env.py`` and (on a GPU) whether the CUDA kernel serves it, the
    activation dtype and the weight's (rows, K)."""
    facts = dict(partial=partial, has_input_scale=input_scale is not None)
    if fmt.name == "fp8" and input_scale is not None:  # the switch matters only for a layer with an input scale
        facts["fp8_prefill"] = env.fp8_prefill_mode()
    if sm is not None:
        from ..kernels.cuda import weight_mma

        facts.update(mma_enabled=weight_mma.enabled(sm, dtype), prefill=env.prefill_mode(), weight_shape=weight_shape)
        if fmt.name == "nvfp4":
            facts["act_pack"] = env.act_pack_mode()
    return choose_kernel(fmt.name, m, sm, **facts)


def run_linear(x: Tensor, w, bias: Optional[Tensor], fmt: FormatKernels, *, partial: bool = False,
               split_k: int = 0, input_scale: Optional[Tensor] = None, on_gpu: Optional[bool] = None) -> Tensor:
    """``x @ W^T (+ bias)`` (gated: ``silu(x @ Wg^T) * (x @ Wu^T)``; ``partial``: float32, before the after-sum
    scales, not rounded — a row-parallel rank's share), by the kernel ``dispatch.policy`` chooses. ``split_k``
    (> 0): the CUDA decode kernel's K slices for every M (else the launch table's); ``input_scale``: the static
    activation scale the opt-in W8A8 prefill quantizes with; ``on_gpu``: the GPU path (default: x on CUDA)."""
    on_gpu = x.is_cuda if on_gpu is None else on_gpu
    x2 = x.reshape(-1, w.in_features)
    shape = (*x.shape[:-1], w.out_features)
    m = x2.shape[0]
    out_dtype = torch.float32 if partial else None
    if on_gpu and m == 0:
        return x.new_empty(shape, dtype=out_dtype or x.dtype)
    if on_gpu:
        from ..kernels import device

        sm, sms = device.device_arch(x.device.index)
    else:
        sm, sms = None, 0
    weight_shape = (w.out_features * (2 if w.gated else 1), w.in_features)
    choice = _choice(fmt, m, sm, partial, input_scale, x.dtype, weight_shape)
    if choice.warning:
        warn_once(choice.warning)
    kernel = choice.kernel
    if kernel is Kernel.W8A8_SCALED_MM:
        return fmt.w8a8(x2.contiguous(), w, bias, input_scale).reshape(shape)
    if kernel is Kernel.CPU:
        return cpu_linear(x, w, bias, fmt, partial)
    from ..dispatch.tuning import mma_config

    if not fmt.strided_rows or x2.stride(-1) != 1:
        x2 = x2.contiguous()
    bias = None if w.gated else bias
    k_pad = w.codes.shape[1] * fmt.k_per_word

    def config(rows: int):
        return mma_config(sm, sms, fmt.name, w.gated, w.out_features, w.in_features, k_pad, rows, split_k)

    if kernel is Kernel.CUDA_MMA:
        y = fmt.mma(x2, w, bias, config(m), out_dtype)
    elif kernel is Kernel.CUDA_MMA_ROW_CHUNKS:  # the decode kernels' rows do not depend on the call's other rows
        y = fmt.mma_chunks(x2, w, bias, config, out_dtype)
    elif kernel is Kernel.TRITON_FUSED_PREFILL:
        y = fmt.fused_prefill(x2, unit_scale(w, fmt) if partial else w, bias, sm, out_dtype)
    elif kernel is Kernel.DEQUANTIZE_CUBLAS:
        y = fmt.dequantize_matmul(x2, unit_scale(w, fmt) if partial else w, bias, out_dtype)
    else:
        if kernel is Kernel.TRITON_GEMV:
            y = fmt.gemv(x2, w, bias, sms)
        else:
            y = fmt.decode(x2, w, bias, sm, sms, choice.act_pack)
        if partial:  # the Triton decode kernels (sm_70/75) scale and round first
            y = y.float() / getattr(w, fmt.sum_scale)[: w.out_features]
    return y.reshape(shape)
