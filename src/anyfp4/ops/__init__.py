"""The one op boundary: ``torch.ops.anyfp4.*``. Every kernel is reached from here.

- ``nvfp4_linear(x, codes, scales, global_scale, bias, out_features, in_features)``:
  ``x @ W^T (+ bias)`` for an NVFP4 prepack (``kernels.nvfp4_prepack``).
- ``nvfp4_gated(x, codes, scales, global_scale, up_offset, out_features, in_features)``:
  ``silu(x @ Wg^T) * (x @ Wu^T)`` for a gated prepack.
- ``fp8_linear(x, codes, scales, bias, out_features, in_features)`` and
  ``fp8_gated(x, codes, scales, up_offset, out_features, in_features)``: the same for an FP8
  prepack (``kernels.fp8_prepack``): M = 1 runs an FP8 GEMV kernel, larger M dequantizes + cuBLAS.
  An optional last ``input_scale`` (the checkpoint's static activation scale) lets
  ``ANYFP4_FP8_PREFILL=w8a8`` run more than 32 rows as one FP8 ``torch._scaled_mm`` (``kernels.fp8_w8a8``).
- ``nvfp4_linear_partial(x, codes, scales, global_scale, out_features, in_features)`` and
  ``fp8_linear_partial(x, codes, scales, out_features, in_features)``: ``x @ W^T`` before the global / row
  scale, in float32, not rounded — a row-parallel rank's share of a sum that tensor parallelism adds up,
  then scales and rounds once.
- every quantized op takes an optional last argument ``split_k`` (0: the launch table's): the K slices of
  the CUDA decode kernel, which set the order a row's products are added in (tensor-parallel shards pass
  their full layer's, so that they compute one GPU's bits).
- ``small_attention(q, k_cache, v_cache, mask, input_pos)``: grouped-query attention of t <= 32 new
  positions over the static KV cache (``kernels.small_attention``), (b, t, h, hd) out; CUDA only.
- ``rope_cache(q, k, v, cos, sin, k_cache, v_cache, input_pos)``: rotary embedding of q and k, k and v
  written into the caches at ``input_pos`` (``kernels.rope_cache`` on CUDA, its pure-torch definition on
  the CPU), rotated q out.
- ``rms_norm(x, weight, eps)``: RMSNorm over the last dimension (``kernels.rms_norm``: one Triton
  program per row on CUDA, rows independent of each other; the pure-torch definition on the CPU);
  ``add_rms_norm(x, delta, weight, eps)``: ``(x + delta, rms_norm(x + delta))`` in one launch.

Inside the op (so torch.compile and CUDA graphs never bake a branch in): on CUDA, M = rows of
``x`` picks the kernel — M <= 32 on sm_80+: the CUDA tensor-core decode kernel (``kernels.weight_mma``,
NVRTC, launch table or heuristic; ``ANYFP4_KERNELS=triton`` turns it off); otherwise M = 1: the Triton
GEMV kernel, M <= 32: the Triton tensor-core decode kernel (activation block-pack by
``ANYFP4_ACT_PACK``); larger M: dequantize + cuBLAS (prefill), with ``ANYFP4_PREFILL=fused`` one Triton
GEMM that decodes weight tiles in registers (NVFP4), or with ``ANYFP4_PREFILL=chunked`` the
CUDA decode kernel 32 rows at a time. FP8 follows the same split (Triton:
GEMV at M = 1, dequantize + cuBLAS above). On the CPU: the pure-torch reference.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..dispatch.limits import DECODE_ROWS
from ..formats.nvfp4 import dequantize_nvfp4
from ..packing.nvfp4 import NVFP4Prepacked, unprepack_nvfp4, unprepack_nvfp4_gated
from .checks import check_bias, check_fake_devices, check_fp8, check_input_scale, check_nvfp4

def _as_prepacked(codes: Tensor, scales: Tensor, global_scale: Tensor, up_offset: int, out_features: int,
                  in_features: int) -> NVFP4Prepacked:
    return NVFP4Prepacked(codes, scales, global_scale, out_features, in_features, up_offset)


def _unit_scale(w: NVFP4Prepacked) -> NVFP4Prepacked:
    """The same prepack with a global scale of 1: its products are the sums before the global scale."""
    return _as_prepacked(w.codes, w.scales, torch.ones_like(w.global_scale), w.up_offset, w.out_features,
                         w.in_features)


def _reference(x: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], partial: bool = False) -> Tensor:
    """The CPU implementation: dequantize with formats/ and multiply in float32 (``partial``: before the
    global scale, not rounded to x's dtype)."""
    x2 = x.reshape(-1, w.in_features).float()
    if partial:
        y = x2 @ dequantize_nvfp4(unprepack_nvfp4(_unit_scale(w))).t()
        return y.reshape(*x.shape[:-1], w.out_features)
    if w.gated:
        gate, up = (dequantize_nvfp4(p) for p in unprepack_nvfp4_gated(w))
        y = torch.nn.functional.silu(x2 @ gate.t()) * (x2 @ up.t())
    else:
        y = x2 @ dequantize_nvfp4(unprepack_nvfp4(w)).t()
        if bias is not None:
            y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], w.out_features)


def _cpu(x: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], partial: bool = False) -> Tensor:
    """The op on the CPU: the C kernels (``kernels.cpu_linear``) where they build, else ``_reference``."""
    from ..kernels.cpu.linear import library, linear_on_rows, nvfp4_rows

    lib = library()
    if lib is None:
        return _reference(x, w, bias, partial)
    g = float(w.global_scale)
    return linear_on_rows(x, w, bias, partial,
                          lambda x2, starts, scaled: nvfp4_rows(lib, x2, w, starts, g if scaled else None))


def _in_row_chunks(x2: Tensor, run) -> Tensor:
    """``run`` on at most ``DECODE_ROWS`` rows at a time (the decode kernels' rows do not depend on the call's other rows)."""
    return torch.cat([run(x2[i:i + DECODE_ROWS]) for i in range(0, x2.shape[0], DECODE_ROWS)])


def _cuda(x: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor], partial: bool = False, split_k: int = 0) -> Tensor:
    from ..env import act_pack_mode, prefill_mode
    from ..kernels.triton.nvfp4_decode import nvfp4_decode_gemm
    from ..kernels.triton.nvfp4_dequant import nvfp4_prefill_gemm
    from ..kernels.triton.nvfp4_gemv import nvfp4_gemv
    from ..kernels.cuda import weight_mma
    from ..dispatch.tuning import act_pack_auto, decode_config, gemv_heuristic_config, mma_config
    from ..kernels.device import device_arch

    x2 = x.reshape(-1, w.in_features)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out_dtype = torch.float32 if partial else None
    if m == 0:
        return x.new_empty(*x.shape[:-1], w.out_features, dtype=out_dtype or x.dtype)
    bias = bias if not w.gated else None
    sm, sms = device_arch(x.device.index)
    k_pad = w.codes.shape[1] * 8

    def mma(rows: Tensor) -> Tensor:
        config = mma_config(sm, sms, "nvfp4", w.gated, w.out_features, w.in_features, k_pad, rows.shape[0], split_k)
        return weight_mma.nvfp4_mma_gemm(rows, w, bias, config, out_dtype=out_dtype)

    if m <= DECODE_ROWS and weight_mma.enabled(sm):
        y = mma(x2)
    elif m > DECODE_ROWS and prefill_mode() == "chunked" and weight_mma.enabled(sm):
        y = _in_row_chunks(x2, mma)
    elif m > DECODE_ROWS and prefill_mode() == "fused":
        from ..kernels.triton.nvfp4_decode import nvfp4_fused_gemm

        y = nvfp4_fused_gemm(x2, _unit_scale(w) if partial else w, bias, out_dtype=out_dtype)
    elif m > DECODE_ROWS:
        y = nvfp4_prefill_gemm(x2, _unit_scale(w) if partial else w, bias, out_dtype)
    else:
        if m == 1:
            y = nvfp4_gemv(x2, w, bias, gemv_heuristic_config(w.out_features, k_pad, sms))
        else:
            mode = act_pack_mode()
            pack = mode == "1" or (mode == "auto" and act_pack_auto(sm, m))
            config = decode_config(sm, sms, w.out_features, w.in_features, w.codes.shape[1] * 8, m)
            y = nvfp4_decode_gemm(x2, w, bias, config, act_pack=pack)
        if partial:  # the Triton decode kernels (sm_70/75) scale and round first
            y = y.float() / w.global_scale
    return y.reshape(*x.shape[:-1], w.out_features)


@torch.library.custom_op("anyfp4::nvfp4_linear", mutates_args=())
def nvfp4_linear(x: Tensor, codes: Tensor, scales: Tensor, global_scale: Tensor, bias: Optional[Tensor],
                 out_features: int, in_features: int, split_k: int = 0) -> Tensor:
    check_nvfp4(x, codes, scales, global_scale, out_features, in_features, 0, "nvfp4_linear")
    check_bias(bias, x, out_features, "nvfp4_linear")
    w = _as_prepacked(codes, scales, global_scale, 0, out_features, in_features)
    return _cuda(x, w, bias, split_k=split_k) if x.is_cuda else _cpu(x, w, bias)


@nvfp4_linear.register_fake
def _(x, codes, scales, global_scale, bias, out_features, in_features, split_k=0):
    check_fake_devices("nvfp4_linear", x, codes, scales, global_scale, bias)
    return x.new_empty(*x.shape[:-1], out_features)


@torch.library.custom_op("anyfp4::nvfp4_gated", mutates_args=())
def nvfp4_gated(x: Tensor, codes: Tensor, scales: Tensor, global_scale: Tensor, up_offset: int,
                out_features: int, in_features: int, split_k: int = 0) -> Tensor:
    if up_offset <= 0:
        raise ValueError("nvfp4_gated: up_offset must be positive (use prepack_nvfp4_gated)")
    check_nvfp4(x, codes, scales, global_scale, out_features, in_features, up_offset, "nvfp4_gated")
    w = _as_prepacked(codes, scales, global_scale, up_offset, out_features, in_features)
    return _cuda(x, w, None, split_k=split_k) if x.is_cuda else _cpu(x, w, None)


@nvfp4_gated.register_fake
def _(x, codes, scales, global_scale, up_offset, out_features, in_features, split_k=0):
    check_fake_devices("nvfp4_gated", x, codes, scales, global_scale)
    return x.new_empty(*x.shape[:-1], out_features)


@torch.library.custom_op("anyfp4::nvfp4_linear_partial", mutates_args=())
def nvfp4_linear_partial(x: Tensor, codes: Tensor, scales: Tensor, global_scale: Tensor, out_features: int,
                         in_features: int, split_k: int = 0) -> Tensor:
    """``x @ W^T / global_scale`` in float32, not rounded: a row-parallel rank's share of a sum that the ranks
    add, then scale and round once (on sm_80+ and in prefill; the sm_70/75 decode kernels round first)."""
    check_nvfp4(x, codes, scales, global_scale, out_features, in_features, 0, "nvfp4_linear_partial")
    w = _as_prepacked(codes, scales, global_scale, 0, out_features, in_features)
    return _cuda(x, w, None, partial=True, split_k=split_k) if x.is_cuda else _cpu(x, w, None, partial=True)


@nvfp4_linear_partial.register_fake
def _(x, codes, scales, global_scale, out_features, in_features, split_k=0):
    check_fake_devices("nvfp4_linear_partial", x, codes, scales, global_scale)
    return x.new_empty(*x.shape[:-1], out_features, dtype=torch.float32)


def linear(x: Tensor, w: NVFP4Prepacked, bias: Optional[Tensor] = None) -> Tensor:
    """Convenience: call the right op for a prepack."""
    if w.gated:
        return torch.ops.anyfp4.nvfp4_gated(x, w.codes, w.scales, w.global_scale, w.up_offset, w.out_features,
                                            w.in_features)
    return torch.ops.anyfp4.nvfp4_linear(x, w.codes, w.scales, w.global_scale, bias, w.out_features, w.in_features)


def _w8a8_applies(x: Tensor, m: int, input_scale: Optional[Tensor]) -> bool:
    """``ANYFP4_FP8_PREFILL=w8a8`` for a prefill-sized call of a layer with an input scale, on a device with FP8
    matmuls (sm_89+ GPUs, the CPU) and without ``ANYFP4_PREFILL=chunked``."""
    from ..env import fp8_prefill_mode, prefill_mode

    if input_scale is None or m <= DECODE_ROWS or fp8_prefill_mode() != "w8a8":
        return False
    if not x.is_cuda:
        return True
    from ..kernels.device import device_arch

    if device_arch(x.device.index)[0] < 89:
        _warn_once("ANYFP4_FP8_PREFILL=w8a8 needs FP8 tensor cores (sm_89+); FP8 prefill stays weight-only here")
        return False
    return prefill_mode() != "chunked"


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        import warnings

        warnings.warn(f"anyfp4: {message}", stacklevel=3)


def _fp8_unit_scale(w):
    """The same FP8 prepack with row scales of 1: its products are the sums before the row scales."""
    from ..packing.fp8 import FP8Prepacked

    return FP8Prepacked(w.codes, torch.ones_like(w.scales), w.out_features, w.in_features, w.up_offset)


def _fp8_cuda(x2: Tensor, w, bias: Optional[Tensor], partial: bool, split_k: int) -> Tensor:
    """The FP8 op on a GPU, x2 (M, K) contiguous -> (M, N): the CUDA kernel at M <= 32 (or, with
    ``ANYFP4_PREFILL=chunked``, 32 rows at a time), else the Triton GEMV at M = 1 or dequantize + cuBLAS."""
    from ..env import prefill_mode
    from ..kernels.cuda import weight_mma
    from ..kernels.triton.fp8_linear import fp8_gemv, fp8_matmul
    from ..dispatch.tuning import mma_config
    from ..kernels.device import device_arch

    m = x2.shape[0]
    out_dtype = torch.float32 if partial else None
    bias = bias if not w.gated else None
    sm, sms = device_arch(x2.device.index)

    def mma(rows: Tensor) -> Tensor:
        config = mma_config(sm, sms, "fp8", w.gated, w.out_features, w.in_features, w.codes.shape[1] * 4,
                            rows.shape[0], split_k)
        return weight_mma.fp8_mma_gemm(rows, w, bias, config, out_dtype=out_dtype)

    if m == 0:
        return x2.new_empty(0, w.out_features, dtype=out_dtype or x2.dtype)
    if m <= DECODE_ROWS and weight_mma.enabled(sm):
        return mma(x2)
    if prefill_mode() == "chunked" and weight_mma.enabled(sm):
        return _in_row_chunks(x2, mma)
    if m == 1:
        y = fp8_gemv(x2, w, bias)
        return y.float() / w.scales[: w.out_features] if partial else y  # the Triton GEMV scales and rounds first
    return fp8_matmul(x2, _fp8_unit_scale(w) if partial else w, bias, out_dtype)


def _fp8_run(x: Tensor, w, bias: Optional[Tensor], partial: bool = False, split_k: int = 0,
             input_scale: Optional[Tensor] = None) -> Tensor:
    """``partial``: float32, before the row scales, not rounded (a row-parallel rank's share); ``input_scale``: the
    static activation scale the opt-in W8A8 prefill quantizes with."""
    from ..formats.fp8 import dequantize_fp8
    from ..packing.fp8 import unprepack_fp8

    x2 = x.reshape(-1, w.in_features)
    if not partial and _w8a8_applies(x, x2.shape[0], input_scale):
        from ..kernels.fp8_w8a8 import w8a8_matmul

        return w8a8_matmul(x2.contiguous(), w, bias, input_scale).reshape(*x.shape[:-1], w.out_features)
    if x.is_cuda:
        return _fp8_cuda(x2.contiguous(), w, bias, partial, split_k).reshape(*x.shape[:-1], w.out_features)
    from ..kernels.cpu.linear import fp8_rows, library, linear_on_rows

    lib = library()
    if lib is not None:
        return linear_on_rows(x, w, bias, partial, lambda x2, starts, scaled: fp8_rows(lib, x2, w, starts, scaled))
    xf = x2.float()
    if partial:
        return (xf @ dequantize_fp8(unprepack_fp8(_fp8_unit_scale(w))).t()).reshape(*x.shape[:-1], w.out_features)
    if w.gated:
        y = torch.nn.functional.silu(xf @ dequantize_fp8(unprepack_fp8(w)).t()) * (
            xf @ dequantize_fp8(unprepack_fp8(w, w.up_offset)).t())
    else:
        y = xf @ dequantize_fp8(unprepack_fp8(w)).t()
        if bias is not None:
            y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], w.out_features)


@torch.library.custom_op("anyfp4::fp8_linear", mutates_args=())
def fp8_linear(x: Tensor, codes: Tensor, scales: Tensor, bias: Optional[Tensor], out_features: int,
               in_features: int, split_k: int = 0, input_scale: Optional[Tensor] = None) -> Tensor:
    from ..packing.fp8 import FP8Prepacked

    check_fp8(x, codes, scales, out_features, in_features, 0, "fp8_linear")
    check_bias(bias, x, out_features, "fp8_linear")
    check_input_scale(input_scale, x, "fp8_linear")
    return _fp8_run(x, FP8Prepacked(codes, scales, out_features, in_features), bias, split_k=split_k,
                    input_scale=input_scale)


@fp8_linear.register_fake
def _(x, codes, scales, bias, out_features, in_features, split_k=0, input_scale=None):
    check_fake_devices("fp8_linear", x, codes, scales, bias, input_scale)
    return x.new_empty(*x.shape[:-1], out_features)


@torch.library.custom_op("anyfp4::fp8_linear_partial", mutates_args=())
def fp8_linear_partial(x: Tensor, codes: Tensor, scales: Tensor, out_features: int, in_features: int,
                       split_k: int = 0) -> Tensor:
    """``x @ W^T`` before the row scales, in float32, not rounded (see ``nvfp4_linear_partial``)."""
    from ..packing.fp8 import FP8Prepacked

    check_fp8(x, codes, scales, out_features, in_features, 0, "fp8_linear_partial")
    return _fp8_run(x, FP8Prepacked(codes, scales, out_features, in_features), None, partial=True, split_k=split_k)


@fp8_linear_partial.register_fake
def _(x, codes, scales, out_features, in_features, split_k=0):
    check_fake_devices("fp8_linear_partial", x, codes, scales)
    return x.new_empty(*x.shape[:-1], out_features, dtype=torch.float32)


@torch.library.custom_op("anyfp4::fp8_gated", mutates_args=())
def fp8_gated(x: Tensor, codes: Tensor, scales: Tensor, up_offset: int, out_features: int,
              in_features: int, split_k: int = 0, input_scale: Optional[Tensor] = None) -> Tensor:
    from ..packing.fp8 import FP8Prepacked

    if up_offset <= 0:
        raise ValueError("fp8_gated: up_offset must be positive (use prepack_fp8_gated)")
    check_fp8(x, codes, scales, out_features, in_features, up_offset, "fp8_gated")
    check_input_scale(input_scale, x, "fp8_gated")
    return _fp8_run(x, FP8Prepacked(codes, scales, out_features, in_features, up_offset), None, split_k=split_k,
                    input_scale=input_scale)


@fp8_gated.register_fake
def _(x, codes, scales, up_offset, out_features, in_features, split_k=0, input_scale=None):
    check_fake_devices("fp8_gated", x, codes, scales, input_scale)
    return x.new_empty(*x.shape[:-1], out_features)


@torch.library.custom_op("anyfp4::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    from ..kernels.glue.reference import rms_norm_reference

    if weight.shape != (x.shape[-1],):
        raise ValueError(f"rms_norm: weight has shape {tuple(weight.shape)}, x has {x.shape[-1]} features")
    if weight.device != x.device:
        raise ValueError("rms_norm: x and weight must be on one device")
    if x.device.type == "cuda":
        from ..kernels.glue.rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    return rms_norm_reference(x, weight, eps).contiguous()


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)  # contiguous, like the kernel's output


@torch.library.custom_op("anyfp4::small_attention", mutates_args=())
def small_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, mask: Tensor, input_pos: Tensor) -> Tensor:
    from ..kernels.glue.small_attention import small_attention as run

    if mask.dtype != torch.bool:
        raise TypeError(f"small_attention: mask must be bool, got {mask.dtype}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"small_attention: q {q.dtype}, caches {k_cache.dtype}/{v_cache.dtype} must match")
    return run(q, k_cache, v_cache, mask, input_pos)


@small_attention.register_fake
def _(q, k_cache, v_cache, mask, input_pos):
    b, h, t, hd = q.shape
    return q.new_empty(b, t, h, hd)


@torch.library.custom_op("anyfp4::rope_cache", mutates_args=("k_cache", "v_cache"))
def rope_cache(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
               input_pos: Tensor) -> Tensor:
    from ..kernels.glue.reference import rope_cache_reference

    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise TypeError("rope_cache: cos and sin must be float32")
    if k.shape[-1] != q.shape[-1] or k_cache.shape[1] != k.shape[2] or k_cache.shape[-1] != q.shape[-1]:
        raise ValueError(f"rope_cache: q {tuple(q.shape)}, k {tuple(k.shape)} and cache {tuple(k_cache.shape)} disagree")
    if q.device.type == "cuda":
        from ..kernels.glue.rope_cache import rope_cache as run

        return run(q, k, v, cos, sin, k_cache, v_cache, input_pos)
    return rope_cache_reference(q, k, v, cos, sin, k_cache, v_cache, input_pos)


@rope_cache.register_fake
def _(q, k, v, cos, sin, k_cache, v_cache, input_pos):
    return q.new_empty(q.shape, dtype=k_cache.dtype)


@torch.library.custom_op("anyfp4::add_rms_norm", mutates_args=())
def add_rms_norm(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    from ..kernels.glue.reference import add_rms_norm_reference

    if delta.shape != x.shape or delta.dtype != x.dtype or delta.device != x.device:
        raise ValueError(f"add_rms_norm: delta {delta.dtype} {tuple(delta.shape)} must match x {x.dtype} "
                         f"{tuple(x.shape)}")
    if weight.shape != (x.shape[-1],) or weight.device != x.device:
        raise ValueError(f"add_rms_norm: weight has shape {tuple(weight.shape)}, x has {x.shape[-1]} features")
    if x.device.type == "cuda":
        from ..kernels.glue.rms_norm import add_rms_norm_triton

        return add_rms_norm_triton(x, delta, weight, eps)
    h, y = add_rms_norm_reference(x, delta, weight, eps)
    return h.contiguous(), y.contiguous()


@add_rms_norm.register_fake
def _(x, delta, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)
