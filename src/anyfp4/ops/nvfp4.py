"""The NVFP4 ops (``nvfp4_linear``, ``nvfp4_gated``, ``nvfp4_linear_partial``) and their fakes, the NVFP4
reference and CPU path, and the NVFP4 launchers the shared run (``ops.linear_run``) calls."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..formats.nvfp4 import dequantize_nvfp4
from ..kernels.cpu.linear import nvfp4_rows
from ..packing.nvfp4 import NVFP4Prepacked, unprepack_nvfp4, unprepack_nvfp4_gated
from .checks import check_bias, check_fake_devices, check_nvfp4
from .linear_run import FormatKernels, cpu_linear, reference_linear, run_linear
from .registry import linear_op

K_PER_WORD = 8  # 4-bit codes per int32 word


def _dense(w: NVFP4Prepacked):
    if w.gated:
        return tuple(dequantize_nvfp4(p) for p in unprepack_nvfp4_gated(w))
    return dequantize_nvfp4(unprepack_nvfp4(w))


def _cpu_rows(lib, x2: Tensor, w: NVFP4Prepacked, row_starts: tuple[int, ...], scaled: bool) -> Tensor:
    return nvfp4_rows(lib, x2, w, row_starts, float(w.global_scale) if scaled else None)


def _mma(rows: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], config, out_dtype) -> Tensor:
    from ..kernels.cuda import weight_mma

    return weight_mma.nvfp4_mma_gemm(rows, w, bias, config, out_dtype=out_dtype)


def _mma_chunks(x2: Tensor, w, bias: Optional[Tensor], config_for, out_dtype) -> Tensor:
    from ..kernels.cuda import weight_mma

    return weight_mma.nvfp4_mma_gemm_chunks(x2, w, bias, config_for, out_dtype=out_dtype)


def _gemv(x2: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], sms: int) -> Tensor:
    from ..dispatch.tuning import gemv_heuristic_config
    from ..kernels.triton.nvfp4_gemv import nvfp4_gemv

    return nvfp4_gemv(x2, w, bias, gemv_heuristic_config(w.out_features, w.codes.shape[1] * K_PER_WORD, sms))


def _decode(x2: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], sm: int, sms: int, act_pack: bool) -> Tensor:
    from ..dispatch.tuning import decode_config
    from ..kernels.triton.nvfp4_decode import nvfp4_decode_gemm

    config = decode_config(sm, sms, w.out_features, w.in_features, w.codes.shape[1] * K_PER_WORD, x2.shape[0])
    return nvfp4_decode_gemm(x2, w, bias, config, act_pack=act_pack)


def _fused_prefill(x2: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], sm: int, out_dtype) -> Tensor:
    from ..dispatch.tuning import fused_config
    from ..kernels.triton.nvfp4_decode import nvfp4_fused_gemm

    config = fused_config(x2.shape[0], w.out_features * (2 if w.gated else 1), w.codes.shape[1] * K_PER_WORD, sm)
    return nvfp4_fused_gemm(x2, w, bias, config, out_dtype=out_dtype)


def _dequantize_matmul(x2: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], out_dtype) -> Tensor:
    from ..kernels.triton.nvfp4_dequant import nvfp4_prefill_gemm

    return nvfp4_prefill_gemm(x2, w, bias, out_dtype)


NVFP4 = FormatKernels(name="nvfp4", k_per_word=K_PER_WORD, sum_scale="global_scale", strided_rows=True,
                      dense=_dense, cpu_rows=_cpu_rows, mma=_mma, mma_chunks=_mma_chunks, gemv=_gemv,
                      dequantize_matmul=_dequantize_matmul,
                      decode=_decode, fused_prefill=_fused_prefill)


def nvfp4_reference(x: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], partial: bool = False) -> Tensor:
    """The pure-torch definition: dequantize with formats/ and multiply in float32 (``partial``: before the
    global scale, not rounded to x's dtype)."""
    return reference_linear(x, w, bias, NVFP4, partial)


def nvfp4_on_cpu(x: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], partial: bool = False) -> Tensor:
    """The op on the CPU: the C kernels (``kernels.cpu.linear``) where they build, else ``nvfp4_reference``."""
    return cpu_linear(x, w, bias, NVFP4, partial)


def nvfp4_on_gpu(x: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], partial: bool = False,
                 split_k: int = 0) -> Tensor:
    """The op's GPU path (whatever device x is on: the tests run it on the CPU with an emulated GPU)."""
    return run_linear(x, w, bias, NVFP4, partial=partial, split_k=split_k, on_gpu=True)


def _prepack(codes: Tensor, scales: Tensor, global_scale: Tensor, up_offset: int, out_features: int,
             in_features: int) -> NVFP4Prepacked:
    return NVFP4Prepacked(codes, scales, global_scale, out_features, in_features, up_offset)


@linear_op("nvfp4_linear")
def nvfp4_linear(x: Tensor, codes: Tensor, scales: Tensor, global_scale: Tensor, bias: Optional[Tensor],
                 out_features: int, in_features: int, split_k: int = 0) -> Tensor:
    check_nvfp4(x, codes, scales, global_scale, out_features, in_features, 0, "nvfp4_linear")
    check_bias(bias, x, out_features, "nvfp4_linear")
    w = _prepack(codes, scales, global_scale, 0, out_features, in_features)
    return run_linear(x, w, bias, NVFP4, split_k=split_k)


@nvfp4_linear.register_fake
def _(x, codes, scales, global_scale, bias, out_features, in_features, split_k=0):
    check_fake_devices("nvfp4_linear", x, codes, scales, global_scale, bias)
    return x.new_empty(*x.shape[:-1], out_features)


@linear_op("nvfp4_gated")
def nvfp4_gated(x: Tensor, codes: Tensor, scales: Tensor, global_scale: Tensor, up_offset: int,
                out_features: int, in_features: int, split_k: int = 0) -> Tensor:
    if up_offset <= 0:
        raise ValueError("nvfp4_gated: up_offset must be positive (use prepack_nvfp4_gated)")
    check_nvfp4(x, codes, scales, global_scale, out_features, in_features, up_offset, "nvfp4_gated")
    w = _prepack(codes, scales, global_scale, up_offset, out_features, in_features)
    return run_linear(x, w, None, NVFP4, split_k=split_k)


@nvfp4_gated.register_fake
def _(x, codes, scales, global_scale, up_offset, out_features, in_features, split_k=0):
    check_fake_devices("nvfp4_gated", x, codes, scales, global_scale)
    return x.new_empty(*x.shape[:-1], out_features)


@linear_op("nvfp4_linear_partial")
def nvfp4_linear_partial(x: Tensor, codes: Tensor, scales: Tensor, global_scale: Tensor, out_features: int,
                         in_features: int, split_k: int = 0) -> Tensor:
    """``x @ W^T / global_scale`` in float32, not rounded: a row-parallel rank's share of a sum that the ranks
    add, then scale and round once (on sm_80+ and in prefill; the sm_70/75 decode kernels round first)."""
    check_nvfp4(x, codes, scales, global_scale, out_features, in_features, 0, "nvfp4_linear_partial")
    w = _prepack(codes, scales, global_scale, 0, out_features, in_features)
    return run_linear(x, w, None, NVFP4, partial=True, split_k=split_k)


@nvfp4_linear_partial.register_fake
def _(x, codes, scales, global_scale, out_features, in_features, split_k=0):
    check_fake_devices("nvfp4_linear_partial", x, codes, scales, global_scale)
    return x.new_empty(*x.shape[:-1], out_features, dtype=torch.float32)


def nvfp4_prepacked_linear(x: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor] = None) -> Tensor:
    """Convenience: call the right op (``nvfp4_gated`` or ``nvfp4_linear``) for a prepack."""
    if w.gated:
        return torch.ops.anyfp4.nvfp4_gated(x, w.codes, w.scales, w.global_scale, w.up_offset, w.out_features,
                                            w.in_features)
    return torch.ops.anyfp4.nvfp4_linear(x, w.codes, w.scales, w.global_scale, bias, w.out_features, w.in_features)
