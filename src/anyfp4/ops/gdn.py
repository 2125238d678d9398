"""The Gated DeltaNet ops of Qwen3.5-style hybrids: ``gated_delta`` (the delta-rule mixer over a recurrent state),
``causal_conv`` (the depthwise causal convolution over a rolling state) and ``gated_rms_norm``, with their fakes.
Every device runs the pure-torch definitions of ``kernels.gdn.reference`` for now."""

from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("anyfp4::gated_delta", mutates_args=("state",))
def gated_delta(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk: int) -> Tensor:
    """q, k (b, t, hk, dk), v (b, t, hv, dv), g, beta (b, t, hv); ``state`` (b, hv, dk, dv) float32 is advanced over
    the t tokens. ``chunk`` 0: token by token (rows independent of the batch: decode and verify steps); else
    chunks of that many tokens (prefill)."""
    from ..kernels.gdn.reference import gated_delta_chunked, gated_delta_recurrent

    if q.shape != k.shape or v.shape[:2] != q.shape[:2] or g.shape != v.shape[:3] or beta.shape != g.shape:
        raise ValueError(f"gated_delta: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g "
                         f"{tuple(g.shape)} and beta {tuple(beta.shape)} disagree")
    if chunk < 0:
        raise ValueError(f"gated_delta: chunk must be >= 0, got {chunk}")
    if chunk == 0:
        return gated_delta_recurrent(q, k, v, g, beta, state).contiguous()
    return gated_delta_chunked(q, k, v, g, beta, state, chunk).contiguous()


@gated_delta.register_fake
def _(q, k, v, g, beta, state, chunk):
    return v.new_empty(v.shape)


@torch.library.custom_op("anyfp4::causal_conv", mutates_args=("conv_state",))
def causal_conv(x: Tensor, weight: Tensor, conv_state: Tensor) -> Tensor:
    """silu of the depthwise causal convolution of x (b, t, channels) with weight (channels, kernel), continuing
    from ``conv_state`` (b, channels, kernel - 1), which is left holding the last kernel - 1 inputs."""
    from ..kernels.gdn.reference import causal_conv as run

    return run(x, weight, conv_state).contiguous()


@causal_conv.register_fake
def _(x, weight, conv_state):
    return x.new_empty(x.shape)


@torch.library.custom_op("anyfp4::gated_rms_norm", mutates_args=())
def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension times ``weight``, times silu(gate)."""
    from ..kernels.gdn.reference import gated_rms_norm as run

    if gate.shape != x.shape or weight.shape != (x.shape[-1],):
        raise ValueError(f"gated_rms_norm: x {tuple(x.shape)}, gate {tuple(gate.shape)} and weight "
                         f"{tuple(weight.shape)} disagree")
    return run(x, gate, weight, eps).contiguous()


@gated_rms_norm.register_fake
def _(x, gate, weight, eps):
    return x.new_empty(x.shape)
