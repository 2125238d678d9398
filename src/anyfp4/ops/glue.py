"""The layer-glue ops of the runner: ``rms_norm``, ``add_rms_norm``, ``rope_cache``, ``small_attention`` and their
fakes (Triton kernels of ``kernels.glue`` on CUDA, their pure-torch definitions on the CPU)."""

from __future__ import annotations

import torch
from torch import Tensor


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
def small_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, mask: Tensor, input_pos: Tensor,
                    key_start: Tensor | None = None, gate: Tensor | None = None) -> Tensor:
    from ..kernels.glue.small_attention import small_attention as run

    if mask.dtype != torch.bool:
        raise TypeError(f"small_attention: mask must be bool, got {mask.dtype}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise TypeError(f"small_attention: q {q.dtype}, caches {k_cache.dtype}/{v_cache.dtype} must match")
    return run(q, k_cache, v_cache, mask, input_pos, key_start, gate=gate)


@small_attention.register_fake
def _(q, k_cache, v_cache, mask, input_pos, key_start=None, gate=None):
    b, h, t, hd = q.shape
    return q.new_empty(b, t, h, hd)


@torch.library.custom_op("anyfp4::rope_cache", mutates_args=("k_cache", "v_cache"))
def rope_cache(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
               input_pos: Tensor, q_norm: Tensor | None = None, k_norm: Tensor | None = None,
               eps: float = 0.0) -> Tensor:
    """q / k rotated, k / v into the caches; with ``q_norm`` and ``k_norm`` (head_dim weights) each q / k head
    RMSNormed (``eps``) before its rotation, in the same launch."""
    from ..kernels.glue.reference import rope_cache_reference

    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise TypeError("rope_cache: cos and sin must be float32")
    if k.shape[-1] != q.shape[-1] or k_cache.shape[1] != k.shape[2] or k_cache.shape[-1] != q.shape[-1]:
        raise ValueError(f"rope_cache: q {tuple(q.shape)}, k {tuple(k.shape)} and cache {tuple(k_cache.shape)} disagree")
    if cos.shape[-1] % 2 or cos.shape[-1] > q.shape[-1]:
        raise ValueError(f"rope_cache: rotary tables {tuple(cos.shape)} must be even-wide and at most head_dim "
                         f"{q.shape[-1]}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("rope_cache: give both q_norm and k_norm, or neither")
    norms = None
    if q_norm is not None:
        if q_norm.shape != (q.shape[-1],) or k_norm.shape != (q.shape[-1],):
            raise ValueError(f"rope_cache: q_norm {tuple(q_norm.shape)} and k_norm {tuple(k_norm.shape)} must both "
                             f"be ({q.shape[-1]},), one weight per head dimension")
        if q_norm.device != q.device or k_norm.device != q.device:
            raise ValueError("rope_cache: q_norm / k_norm must be on q's device")
        norms = (q_norm.contiguous(), k_norm.contiguous(), eps)
    if q.device.type == "cuda":
        from ..kernels.glue.rope_cache import rope_cache as run

        return run(q, k, v, cos, sin, k_cache, v_cache, input_pos, norms=norms)
    return rope_cache_reference(q, k, v, cos, sin, k_cache, v_cache, input_pos, norms)


@rope_cache.register_fake
def _(q, k, v, cos, sin, k_cache, v_cache, input_pos, q_norm=None, k_norm=None, eps=0.0):
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
