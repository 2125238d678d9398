"""The FP8 ops (``fp8_linear``, ``fp8_gated``, ``fp8_linear_partial``) and their fakes, the FP8 reference and CPU
path, and the FP8 launchers the shared run (``ops.linear_run``) calls."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..formats.fp8 import dequantize_fp8
from ..kernels.cpu.linear import fp8_rows
from ..packing.fp8 import FP8Prepacked, unprepack_fp8
from .checks import check_bias, check_fake_devices, check_fp8, check_input_scale
from .linear_run import FormatKernels, cpu_linear, reference_linear, run_linear
from .registry import linear_op

K_PER_WORD = 4  # FP8 codes per int32 word


def _dense(w: FP8Prepacked):
    if w.gated:
        return dequantize_fp8(unprepack_fp8(w)), dequantize_fp8(unprepack_fp8(w, w.up_offset))
    return dequantize_fp8(unprepack_fp8(w))


def _cpu_rows(lib, x2: Tensor, w: FP8Prepacked, row_starts: tuple[int, ...], scaled: bool) -> Tensor:
    return fp8_rows(lib, x2, w, row_starts, scaled)


def _mma(rows: Tensor, w: FP8Prepacked, bias: Optional[Tensor], config, out_dtype) -> Tensor:
    from ..kernels.cuda import weight_mma

    return weight_mma.fp8_mma_gemm(rows, w, bias, config, out_dtype=out_dtype)


def _mma_chunks(x2: Tensor, w, bias: Optional[Tensor], config_for, out_dtype) -> Tensor:
    from ..kernels.cuda import weight_mma

    return weight_mma.fp8_mma_gemm_chunks(x2, w, bias, config_for, out_dtype=out_dtype)


def _gemv(x2: Tensor, w: FP8Prepacked, bias: Optional[Tensor], sms: int) -> Tensor:
    from ..kernels.triton.fp8_linear import fp8_gemv

    return fp8_gemv(x2, w, bias)


def _dequantize_matmul(x2: Tensor, w: FP8Prepacked, bias: Optional[Tensor], out_dtype) -> Tensor:
    from ..kernels.triton.fp8_linear import fp8_matmul

    return fp8_matmul(x2, w, bias, out_dtype)


def _w8a8(x2: Tensor, w: FP8Prepacked, bias: Optional[Tensor], input_scale: Tensor) -> Tensor:
    from ..kernels.fp8_w8a8 import w8a8_matmul

    return w8a8_matmul(x2, w, bias, input_scale)


FP8 = FormatKernels(name="fp8", k_per_word=K_PER_WORD, sum_scale="scales", strided_rows=False, dense=_dense,
                    cpu_rows=_cpu_rows, mma=_mma, mma_chunks=_mma_chunks, gemv=_gemv,
                    dequantize_matmul=_dequantize_matmul, w8a8=_w8a8)


def fp8_reference(x: Tensor, w: FP8Prepacked, bias: Optional[Tensor], partial: bool = False) -> Tensor:
    """The pure-torch definition: dequantize with formats/ and multiply in float32 (``partial``: before the
    row scales, not rounded to x's dtype)."""
    return reference_linear(x, w, bias, FP8, partial)


def fp8_on_cpu(x: Tensor, w: FP8Prepacked, bias: Optional[Tensor], partial: bool = False) -> Tensor:
    """The op on the CPU without an input scale: the C kernels where they build, else ``fp8_reference``."""
    return cpu_linear(x, w, bias, FP8, partial)


def fp8_on_gpu(x: Tensor, w: FP8Prepacked, bias: Optional[Tensor], partial: bool = False,
               split_k: int = 0) -> Tensor:
    """The op's GPU path without an input scale (whatever device x is on: the tests run it on the CPU with an
    emulated GPU)."""
    return run_linear(x, w, bias, FP8, partial=partial, split_k=split_k, on_gpu=True)


@linear_op("fp8_linear")
def fp8_linear(x: Tensor, codes: Tensor, scales: Tensor, bias: Optional[Tensor], out_features: int,
               in_features: int, split_k: int = 0, input_scale: Optional[Tensor] = None) -> Tensor:
    check_fp8(x, codes, scales, out_features, in_features, 0, "fp8_linear")
    check_bias(bias, x, out_features, "fp8_linear")
    check_input_scale(input_scale, x, "fp8_linear")
    return run_linear(x, FP8Prepacked(codes, scales, out_features, in_features), bias, FP8, split_k=split_k,
                      input_scale=input_scale)


@fp8_linear.register_fake
def _(x, codes, scales, bias, out_features, in_features, split_k=0, input_scale=None):
    check_fake_devices("fp8_linear", x, codes, scales, bias, input_scale)
    return x.new_empty(*x.shape[:-1], out_features)


@linear_op("fp8_linear_partial")
def fp8_linear_partial(x: Tensor, codes: Tensor, scales: Tensor, out_features: int, in_features: int,
                       split_k: int = 0) -> Tensor:
    """``x @ W^T`` before the row scales, in float32, not rounded (see ``nvfp4_linear_partial``)."""
    check_fp8(x, codes, scales, out_features, in_features, 0, "fp8_linear_partial")
    return run_linear(x, FP8Prepacked(codes, scales, out_features, in_features), None, FP8, partial=True,
                      split_k=split_k)


@fp8_linear_partial.register_fake
def _(x, codes, scales, out_features, in_features, split_k=0):
    check_fake_devices("fp8_linear_partial", x, codes, scales)
    return x.new_empty(*x.shape[:-1], out_features, dtype=torch.float32)


@linear_op("fp8_gated")
def fp8_gated(x: Tensor, codes: Tensor, scales: Tensor, up_offset: int, out_features: int,
              in_features: int, split_k: int = 0, input_scale: Optional[Tensor] = None) -> Tensor:
    if up_offset <= 0:
        raise ValueError("fp8_gated: up_offset must be positive (use prepack_fp8_gated)")
    check_fp8(x, codes, scales, out_features, in_features, up_offset, "fp8_gated")
    check_input_scale(input_scale, x, "fp8_gated")
    return run_linear(x, FP8Prepacked(codes, scales, out_features, in_features, up_offset), None, FP8,
                      split_k=split_k, input_scale=input_scale)


@fp8_gated.register_fake
def _(x, codes, scales, up_offset, out_features, in_features, split_k=0, input_scale=None):
    check_fake_devices("fp8_gated", x, codes, scales, input_scale)
    return x.new_empty(*x.shape[:-1], out_features)
