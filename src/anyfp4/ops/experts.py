"""The grouped expert ops of a mixture of experts, and their fakes: for each (token, expert) pair p, expert
``ids[p]``'s linear (gated: ``silu(gate) * up``) of row ``p // (pairs / rows)`` of x, from the experts' weights
stacked along a leading dimension — ``nvfp4_experts(x, ids, codes, scales, global_scales, up_offset, out_features,
in_features)`` over NVFP4 prepacks, ``fp8_experts(x, ids, codes, scales, up_offset, out_features, in_features)``
over FP8 prepacks, ``dense_experts(x, ids, weights, gated, out_features, in_features)`` over float weights (E, rows,
K). On CUDA one launch for every pair: NVFP4 and FP8 with fp16 / bf16 activations on a GPU the CUDA decode kernel
serves (``dispatch.policy.experts_on_cuda_mma``) its grouped launch (``kernels.cuda.weight_mma.experts_mma``), else
Triton (``kernels.triton.nvfp4_experts`` / ``fp8_experts`` / ``dense_experts``) — the routing stays on the GPU; the
ids must be experts of the stack (the kernels read them as addresses); elsewhere the pure-torch definitions, pair
by pair. And ``weighted_slots(picked, weights)``: each token's k expert outputs times their routing weights, added
in float32 in slot order (one launch on CUDA, ``kernels.triton.weighted_slots``; elsewhere k float32 products and
sums)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..packing.fp8 import FP8Prepacked
from ..packing.nvfp4 import NVFP4Prepacked
from .checks import check_fake_devices
from .fp8 import fp8_reference
from .nvfp4 import nvfp4_reference
from .registry import linear_op


def _check_pairs(name: str, x: Tensor, ids: Tensor, in_features: int) -> None:
    if x.dim() != 2 or x.shape[1] != in_features or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"{name}: x must be (rows, {in_features}) fp16 / bf16 / fp32, got {tuple(x.shape)} "
                         f"{x.dtype}")
    if ids.dim() != 1 or ids.dtype != torch.int32 or x.shape[0] == 0 or ids.shape[0] % x.shape[0]:
        raise ValueError(f"{name}: ids must be (pairs,) int32, a multiple of the {x.shape[0]} rows of x; got "
                         f"{tuple(ids.shape)} {ids.dtype}")


def _check_rows(name: str, codes: Tensor, k_per_word: int, up_offset: int, out_features: int,
                in_features: int) -> None:
    rows = 2 * up_offset if up_offset else out_features
    if codes.shape[1] < rows or codes.shape[2] * k_per_word < in_features:
        raise ValueError(f"{name}: prepacks of {codes.shape[1]} rows x {codes.shape[2] * k_per_word} columns do not "
                         f"hold {out_features} outputs{' (gated)' if up_offset else ''} of {in_features} inputs")


def _check(x: Tensor, ids: Tensor, codes: Tensor, scales: Tensor, global_scales: Tensor, up_offset: int,
           out_features: int, in_features: int) -> None:
    name = "nvfp4_experts"
    _check_pairs(name, x, ids, in_features)
    experts = codes.shape[0]
    if (codes.dim() != 3 or codes.dtype != torch.int32 or scales.dim() != 3 or scales.shape[0] != experts
            or scales.dtype != torch.uint8 or global_scales.shape != (experts,)
            or global_scales.dtype != torch.float32):
        raise ValueError(f"{name}: the stacked prepacks must be codes (E, N_pad, K_pad / 8) int32, scales (E, ...) "
                         f"uint8 and global scales (E,) float32; got {tuple(codes.shape)} {codes.dtype}, "
                         f"{tuple(scales.shape)} {scales.dtype}, {tuple(global_scales.shape)} {global_scales.dtype}")
    _check_rows(name, codes, 8, up_offset, out_features, in_features)


def _cuda_mma(x: Tensor) -> bool:
    """The policy's choice for a grouped NVFP4 / FP8 op on this GPU (``dispatch.policy.experts_on_cuda_mma``)."""
    from ..dispatch.policy import experts_on_cuda_mma
    from ..kernels import device
    from ..kernels.cuda import weight_mma

    sm = device.device_arch(x.device.index)[0]
    half = x.dtype in (torch.float16, torch.bfloat16)
    return experts_on_cuda_mma(sm, half and weight_mma.enabled(sm, x.dtype), half)


def _grouped_mma(fmt: str, x: Tensor, ids: Tensor, codes: Tensor, block_scales: Tensor | None, gscale: Tensor,
                 up_offset: int, out_features: int) -> Tensor:
    """The CUDA decode kernel's grouped launch (``kernels.cuda.weight_mma.experts_mma``), its config from the
    shape alone (``dispatch.tuning.experts_mma_config``)."""
    from ..dispatch.tuning import experts_mma_config
    from ..kernels.cuda import weight_mma

    if ids.shape[0] == 0:
        return x.new_empty(0, out_features)
    k_pad = codes.shape[2] * weight_mma.K_PER_WORD[fmt]
    return weight_mma.experts_mma(fmt, x if x.stride(1) == 1 else x.contiguous(), ids.contiguous(), codes,
                                  block_scales, gscale, out_features, up_offset, experts_mma_config(k_pad, fmt))


def _expert(codes, scales, global_scales, e: int, up_offset: int, out_features: int, in_features: int):
    return NVFP4Prepacked(codes[e], scales[e], global_scales[e:e + 1], out_features, in_features, up_offset)


@linear_op("nvfp4_experts")
def nvfp4_experts(x: Tensor, ids: Tensor, codes: Tensor, scales: Tensor, global_scales: Tensor, up_offset: int,
                  out_features: int, in_features: int) -> Tensor:
    """x (rows, in_features), ids (pairs,) int32 -> (pairs, out_features) in x's dtype."""
    _check(x, ids, codes, scales, global_scales, up_offset, out_features, in_features)
    if x.is_cuda and _cuda_mma(x):
        return _grouped_mma("nvfp4", x, ids, codes, scales, global_scales, up_offset, out_features)
    if x.is_cuda:
        from ..kernels.triton.nvfp4_experts import nvfp4_experts_gemv

        return nvfp4_experts_gemv(x, ids, codes, scales, global_scales, up_offset, out_features)
    per_row = ids.shape[0] // x.shape[0]
    out = x.new_empty(ids.shape[0], out_features)
    for p, e in enumerate(ids.tolist()):
        w = _expert(codes, scales, global_scales, e, up_offset, out_features, in_features)
        out[p] = nvfp4_reference(x[p // per_row:p // per_row + 1], w, None)[0]
    return out


@nvfp4_experts.register_fake
def _(x, ids, codes, scales, global_scales, up_offset, out_features, in_features):
    check_fake_devices("nvfp4_experts", x, ids, codes, scales, global_scales)
    return x.new_empty(ids.shape[0], out_features)


def _check_dense(x: Tensor, ids: Tensor, weights: Tensor, gated: bool, out_features: int, in_features: int) -> None:
    name = "dense_experts"
    _check_pairs(name, x, ids, in_features)
    rows = out_features * (2 if gated else 1)
    if weights.dim() != 3 or weights.shape[1:] != (rows, in_features) or not weights.is_contiguous():
        raise ValueError(f"{name}: weights must be (E, {rows}, {in_features}) contiguous, got "
                         f"{tuple(weights.shape)}")


@linear_op("dense_experts")
def dense_experts(x: Tensor, ids: Tensor, weights: Tensor, gated: bool, out_features: int,
                  in_features: int) -> Tensor:
    """x (rows, in_features), ids (pairs,) int32, weights (E, out_features (x 2 gated), in_features) ->
    (pairs, out_features) in x's dtype."""
    _check_dense(x, ids, weights, gated, out_features, in_features)
    if x.is_cuda:
        from ..kernels.triton.dense_experts import dense_experts_gemv

        return dense_experts_gemv(x, ids, weights, gated, out_features)
    per_row = ids.shape[0] // x.shape[0]
    out = x.new_empty(ids.shape[0], out_features)
    for p, e in enumerate(ids.tolist()):
        y = x[p // per_row].float() @ weights[e].float().t()
        out[p] = (F.silu(y[:out_features]) * y[out_features:] if gated else y).to(x.dtype)
    return out


@dense_experts.register_fake
def _(x, ids, weights, gated, out_features, in_features):
    check_fake_devices("dense_experts", x, ids, weights)
    return x.new_empty(ids.shape[0], out_features)


@linear_op("fp8_experts")
def fp8_experts(x: Tensor, ids: Tensor, codes: Tensor, scales: Tensor, up_offset: int, out_features: int,
                in_features: int) -> Tensor:
    """x (rows, in_features), ids (pairs,) int32, codes (E, N_pad, K_pad / 4) int32, scales (E, N_pad) float32 ->
    (pairs, out_features) in x's dtype."""
    name = "fp8_experts"
    _check_pairs(name, x, ids, in_features)
    if (codes.dim() != 3 or codes.dtype != torch.int32 or scales.shape != codes.shape[:2]
            or scales.dtype != torch.float32):
        raise ValueError(f"{name}: the stacked prepacks must be codes (E, N_pad, K_pad / 4) int32 and scales "
                         f"(E, N_pad) float32; got {tuple(codes.shape)} {codes.dtype}, {tuple(scales.shape)} "
                         f"{scales.dtype}")
    _check_rows(name, codes, 4, up_offset, out_features, in_features)
    if x.is_cuda and _cuda_mma(x):
        return _grouped_mma("fp8", x, ids, codes, None, scales, up_offset, out_features)
    if x.is_cuda:
        from ..kernels.triton.fp8_experts import fp8_experts_gemv

        return fp8_experts_gemv(x, ids, codes, scales, up_offset, out_features)
    per_row = ids.shape[0] // x.shape[0]
    out = x.new_empty(ids.shape[0], out_features)
    for p, e in enumerate(ids.tolist()):
        w = FP8Prepacked(codes[e], scales[e], out_features, in_features, up_offset)
        out[p] = fp8_reference(x[p // per_row:p // per_row + 1], w, None)[0]
    return out


@fp8_experts.register_fake
def _(x, ids, codes, scales, up_offset, out_features, in_features):
    check_fake_devices("fp8_experts", x, ids, codes, scales)
    return x.new_empty(ids.shape[0], out_features)


@linear_op("weighted_slots")
def weighted_slots(picked: Tensor, weights: Tensor) -> Tensor:
    """picked (rows, k, hidden) fp16 / bf16 / fp32, weights (rows, k) float32 -> (rows, hidden) float32: ``sum_j
    picked[:, j] * weights[:, j]``, the k terms added in slot order, each row by itself."""
    if (picked.dim() != 3 or picked.dtype not in (torch.float16, torch.bfloat16, torch.float32)
            or weights.shape != picked.shape[:2] or weights.dtype != torch.float32 or picked.shape[1] == 0):
        raise ValueError(f"weighted_slots: picked must be (rows, k, hidden) fp16 / bf16 / fp32 with k >= 1 and "
                         f"weights (rows, k) float32; got {tuple(picked.shape)} {picked.dtype}, "
                         f"{tuple(weights.shape)} {weights.dtype}")
    if picked.is_cuda:
        from ..kernels.triton.weighted_slots import weighted_slots as launch

        return launch(picked if picked.stride(-1) == 1 else picked.contiguous(), weights)
    out = picked[:, 0].float() * weights[:, :1]
    for j in range(1, picked.shape[1]):
        out = out + picked[:, j].float() * weights[:, j:j + 1]
    return out


@weighted_slots.register_fake
def _(picked, weights):
    check_fake_devices("weighted_slots", picked, weights)
    return picked.new_empty(picked.shape[0], picked.shape[2], dtype=torch.float32)
