"""The Gated DeltaNet ops of Qwen3.5-style hybrids, with their fakes: ``causal_conv`` (the depthwise causal
convolution over a rolling state), ``gated_delta_step`` (decode and verify steps: the gates, the delta rule token by
token and the gated RMSNorm), and for prefill ``gated_delta`` (the delta rule alone, in chunks) and
``gated_rms_norm``. On CUDA, steps of up to DECODE_ROWS tokens run the Triton kernels of ``kernels.gdn.step`` one
token at a time; everything else runs the pure-torch definitions of ``kernels.gdn.reference``."""

from __future__ import annotations

import torch
from torch import Tensor

from ..dispatch.limits import DECODE_ROWS


def _stepwise(x: Tensor) -> bool:
    """Whether the CUDA step kernels take this call: a few tokens on a GPU."""
    return x.is_cuda and x.shape[1] <= DECODE_ROWS


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

    if x.dim() != 3 or weight.shape != (x.shape[-1], weight.shape[-1]) or conv_state.shape != (
            x.shape[0], x.shape[-1], weight.shape[-1] - 1):
        raise ValueError(f"causal_conv: x {tuple(x.shape)}, weight {tuple(weight.shape)} and state "
                         f"{tuple(conv_state.shape)} disagree (want (b, t, ch), (ch, kernel), (b, ch, kernel - 1))")
    if _stepwise(x):
        from ..kernels.gdn.step import conv_step

        outs = [conv_step(x[:, i:i + 1], weight, conv_state) for i in range(x.shape[1])]
        return outs[0] if len(outs) == 1 else torch.cat(outs, 1)
    return run(x, weight, conv_state).contiguous()


@causal_conv.register_fake
def _(x, weight, conv_state):
    return x.new_empty(x.shape)


@torch.library.custom_op("anyfp4::gated_delta_step", mutates_args=("state",))
def gated_delta_step(mixed: Tensor, a: Tensor, b: Tensor, z: Tensor, neg_a: Tensor, dt_bias: Tensor,
                     norm_weight: Tensor, state: Tensor, eps: float, k_heads: int,
                     valid: Tensor | None = None) -> Tensor:
    """Tokens after the convolution (``reference.gated_delta_step``): mixed (b, t, 2 hk dk + hv dv), a / b
    (b, t, hv), z (b, t, hv dv), ``neg_a`` = -exp(A_log) and ``dt_bias`` (hv,) float32, ``norm_weight`` (dv,),
    ``state`` (b, hv, dk, dv) float32 advanced in place, ``valid`` (b, t) 0 on left padding -> (b, t, hv dv)."""
    from ..kernels.gdn.reference import gated_delta_step as run

    bsz, t = mixed.shape[:2]
    hv, dk, dv = state.shape[1:]
    want = {"mixed": (mixed, (bsz, t, 2 * k_heads * dk + hv * dv)), "a": (a, (bsz, t, hv)), "b": (b, (bsz, t, hv)),
            "z": (z, (bsz, t, hv * dv)), "neg_a": (neg_a, (hv,)), "dt_bias": (dt_bias, (hv,)),
            "norm_weight": (norm_weight, (dv,))}
    for name, (x, shape) in want.items():
        if tuple(x.shape) != shape:
            raise ValueError(f"gated_delta_step: {name} has shape {tuple(x.shape)}, the state {tuple(state.shape)} "
                             f"and {k_heads} key heads give {shape}")
    if state.dtype != torch.float32 or neg_a.dtype != torch.float32 or dt_bias.dtype != torch.float32:
        raise TypeError("gated_delta_step: the state, neg_a and dt_bias must be float32")
    if hv % k_heads:
        raise ValueError(f"gated_delta_step: {hv} value heads do not share {k_heads} key heads evenly")
    if _stepwise(mixed):
        from ..kernels.gdn.step import delta_step

        outs = [delta_step(mixed[:, i:i + 1], a[:, i:i + 1], b[:, i:i + 1], z[:, i:i + 1], neg_a, dt_bias, norm_weight,
                           state, eps, k_heads, None if valid is None else valid[:, i]) for i in range(t)]
        return outs[0] if t == 1 else torch.cat(outs, 1)
    return run(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid).contiguous()


@gated_delta_step.register_fake
def _(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid=None):
    return mixed.new_empty(mixed.shape[0], mixed.shape[1], z.shape[-1])


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
