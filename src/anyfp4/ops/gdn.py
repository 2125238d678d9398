"""The Gated DeltaNet ops of Qwen3.5-style hybrids, with their fakes: ``causal_conv`` (the depthwise causal
convolution over a rolling state; ``causal_conv_proj``: the same and a small float projection of the layer's input
in one launch) and ``gated_delta_step`` (the gates, the delta rule and the gated RMSNorm), each
with optional snapshots of its state after every token; and the pieces ``gated_delta`` (the delta rule alone) and
``gated_rms_norm``. On CUDA the first two run the Triton kernels of ``kernels.gdn.step`` for steps of up to
DECODE_ROWS tokens (token by token through the state: a verify pass gives the bits of decode steps); a prompt runs
as ``ANYFP4_GDN_PREFILL`` says (``env.gdn_prefill_mode``): the step kernels (``recurrent``), the convolution kernel
and the chunked kernels of ``kernels.gdn.chunked`` (``chunked``), or the pure-torch definitions of
``kernels.gdn.reference`` (``torch``). On the CPU the definitions: one token at a time up to DECODE_ROWS tokens
(each as a decode step computes it), beyond that the convolution at once and the delta rule in chunks of
PREFILL_CHUNK; each row of a left-padded prompt runs the delta rule as it runs alone (from its first token, token by
token or in chunks by its own length), so its bits do not depend on the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dispatch.limits import DECODE_ROWS

PREFILL_CHUNK = 64  # tokens per chunk of the pure-torch delta rule beyond DECODE_ROWS tokens


def _gpu_path(x: Tensor, snapshots: Tensor | None) -> str | None:
    """Which kernels run this call: ``"step"`` (token by token), ``"chunked"`` (a prompt in chunks; the
    convolution's kernel is the step one) or None (the pure-torch definitions). On a GPU, steps of up to
    DECODE_ROWS tokens and calls with snapshots take the step kernels, prompts what ``ANYFP4_GDN_PREFILL`` says."""
    from ..env import gdn_prefill_mode

    if not x.is_cuda:
        return None
    if x.shape[1] <= DECODE_ROWS or snapshots is not None:
        return "step"
    mode = gdn_prefill_mode()
    return {"recurrent": "step", "chunked": "chunked"}.get(mode)


def _check_snapshots(snapshots: Tensor | None, state: Tensor, t: int, what: str) -> None:
    if snapshots is not None and (snapshots.shape[0] != state.shape[0] or snapshots.shape[1] < t
                                  or snapshots.shape[2:] != state.shape[1:] or snapshots.dtype != state.dtype):
        raise ValueError(f"{what}: snapshots {tuple(snapshots.shape)} {snapshots.dtype} do not hold {t} copies of "
                         f"the state {tuple(state.shape)} {state.dtype}")


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


def _check_conv(x: Tensor, weight: Tensor, conv_state: Tensor, snapshots: Tensor | None, what: str) -> None:
    if x.dim() != 3 or weight.shape != (x.shape[-1], weight.shape[-1]) or conv_state.shape != (
            x.shape[0], x.shape[-1], weight.shape[-1] - 1):
        raise ValueError(f"{what}: x {tuple(x.shape)}, weight {tuple(weight.shape)} and state "
                         f"{tuple(conv_state.shape)} disagree (want (b, t, ch), (ch, kernel), (b, ch, kernel - 1))")
    _check_snapshots(snapshots, conv_state, x.shape[1], what)


# The optional mutated arguments below have no defaults: torch 2.11's in-place bookkeeping indexes a mutated
# argument by its place in the schema, and a call that leaves it at its default arrives without it (IndexError).
@torch.library.custom_op("anyfp4::causal_conv", mutates_args=("conv_state", "snapshots"))
def causal_conv(x: Tensor, weight: Tensor, conv_state: Tensor, snapshots: Tensor | None) -> Tensor:
    """silu of the depthwise causal convolution of x (b, t, channels) with weight (channels, kernel), continuing
    from ``conv_state`` (b, channels, kernel - 1), which is left holding the last kernel - 1 inputs; ``snapshots``
    (b, >= t, channels, kernel - 1) receives it after each token."""
    from ..kernels.gdn.reference import causal_conv as run

    _check_conv(x, weight, conv_state, snapshots, "causal_conv")
    if _gpu_path(x, snapshots):  # the convolution kernel runs the tokens in parallel in either mode
        from ..kernels.gdn.step import conv

        return conv(x, weight, conv_state, snapshots)
    if x.shape[1] <= DECODE_ROWS:  # token by token: CPU elementwise kernels round by a value's place in the call
        outs = []
        for i in range(x.shape[1]):
            outs.append(run(x[:, i:i + 1], weight, conv_state))
            if snapshots is not None:
                snapshots[:, i].copy_(conv_state)
        return torch.cat(outs, 1)
    return run(x, weight, conv_state, snapshots).contiguous()


@causal_conv.register_fake
def _(x, weight, conv_state, snapshots):
    return x.new_empty(x.shape)


@torch.library.custom_op("anyfp4::causal_conv_proj", mutates_args=("conv_state", "snapshots"))
def causal_conv_proj(x: Tensor, weight: Tensor, conv_state: Tensor, snapshots: Tensor | None, h: Tensor,
                     proj_weight: Tensor, proj_bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """``causal_conv`` of x, and a small float projection of the layer's input h (b, t, K): h @ proj_weight^T (+
    proj_bias) (N, K) rounded to h's dtype. Where ``causal_conv`` runs the convolution kernel, both in its launch,
    the projection with ``dense_gemv``'s bits (a Gated DeltaNet's bf16 a / b projections: one launch fewer a
    layer); elsewhere ``causal_conv`` and the projection's definition, F.linear in float32."""
    if h.dim() != 3 or h.shape[:2] != x.shape[:2] or proj_weight.dim() != 2 or proj_weight.shape[1] != h.shape[-1] \
            or (proj_bias is not None and proj_bias.shape != (proj_weight.shape[0],)):
        raise ValueError(f"causal_conv_proj: h {tuple(h.shape)}, proj_weight {tuple(proj_weight.shape)} and "
                         f"proj_bias {None if proj_bias is None else tuple(proj_bias.shape)} disagree with x "
                         f"{tuple(x.shape)} (want (b, t, K), (N, K), (N,))")
    if _gpu_path(x, snapshots):  # where causal_conv runs the convolution kernel
        _check_conv(x, weight, conv_state, snapshots, "causal_conv_proj")
        from ..kernels.gdn.step import conv

        y, p = conv(x, weight, conv_state, snapshots, proj=(h, proj_weight, proj_bias))
        return y, p
    y = causal_conv(x, weight, conv_state, snapshots)
    p = F.linear(h.float(), proj_weight.float(), None if proj_bias is None else proj_bias.float()).to(h.dtype)
    return y, p


@causal_conv_proj.register_fake
def _(x, weight, conv_state, snapshots, h, proj_weight, proj_bias):
    return x.new_empty(x.shape), h.new_empty(*h.shape[:-1], proj_weight.shape[0])


@torch.library.custom_op("anyfp4::gated_delta_step", mutates_args=("state", "snapshots"))
def gated_delta_step(mixed: Tensor, a: Tensor, b: Tensor, z: Tensor, neg_a: Tensor, dt_bias: Tensor,
                     norm_weight: Tensor, state: Tensor, eps: float, k_heads: int,
                     valid: Tensor | None, snapshots: Tensor | None) -> Tensor:
    """The tokens after the convolution (``reference.gated_delta_step``): mixed (b, t, 2 hk dk + hv dv), a / b
    (b, t, hv), z (b, t, hv dv), ``neg_a`` = -exp(A_log) and ``dt_bias`` (hv,) float32, ``norm_weight`` (dv,),
    ``state`` (b, hv, dk, dv) float32 advanced in place, ``valid`` (b, t) 0 on left padding, ``snapshots``
    (b, >= t, hv, dk, dv) the state after each token -> (b, t, hv dv)."""
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
    if valid is not None and tuple(valid.shape) != (bsz, t):
        raise ValueError(f"gated_delta_step: valid has shape {tuple(valid.shape)}, want {(bsz, t)}")
    _check_snapshots(snapshots, state, t, "gated_delta_step")
    args = (mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid, snapshots)
    starts = _padded_starts(valid) if t > DECODE_ROWS and bsz > 1 and snapshots is None else None
    if starts is None:
        return _delta_rule(*args)
    # a left-padded prompt: each row as it runs alone (its path chosen by its own length: token by token or in chunks
    # from its first token), since the chunks of the whole batch would start at the batch's first slot; its
    # padding's outputs are zeros
    out = z.new_zeros(bsz, t, z.shape[-1])
    for r, first in enumerate(starts):
        if first == t:
            continue  # all padding
        row, tail = slice(r, r + 1), slice(first, t)
        # views, strided as the row's own tensors would be (CPU elementwise kernels round by a value's place)
        out[row, tail] = _delta_rule(mixed[row, tail], a[row, tail], b[row, tail], z[row, tail], neg_a, dt_bias,
                                     norm_weight, state[row], eps, k_heads, valid[row, tail], None)
    return out


def _delta_rule(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid, snapshots) -> Tensor:
    """``gated_delta_step`` over every row at once, by the kernels ``_gpu_path`` picks (the pure-torch ones on the
    CPU)."""
    path = _gpu_path(mixed, snapshots)
    if path == "step":
        from ..kernels.gdn.step import delta_rule

        return delta_rule(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid, snapshots)
    if path == "chunked":
        from ..kernels.gdn.chunked import chunked_delta_rule

        return chunked_delta_rule(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid)
    return _torch_delta_rule(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid, snapshots)


def _padded_starts(valid: Tensor | None) -> list[int] | None:
    """Each row's first valid token where ``valid`` is a left-padded batch's (each row's valid tokens one run to the
    end, some row padded); None otherwise."""
    if valid is None:
        return None
    ok = valid != 0
    lengths = ok.sum(1)
    t = valid.shape[1]
    suffix = ok == (torch.arange(t, device=valid.device)[None, :] >= (t - lengths)[:, None])
    if not bool(suffix.all()) or bool((lengths == t).all()):
        return None
    return (t - lengths).tolist()


def _torch_delta_rule(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid, snapshots) -> Tensor:
    """The pure-torch path of ``gated_delta_step``: token by token up to DECODE_ROWS tokens, else in chunks."""
    from ..kernels.gdn.reference import gated_delta_step as run

    t = mixed.shape[1]
    if t <= DECODE_ROWS:  # token by token, each as a decode step computes it (CPU elementwise kernels round by a
        outs = []         # value's place in the call)
        for i in range(t):
            one = slice(i, i + 1)
            outs.append(run(mixed[:, one], a[:, one], b[:, one], z[:, one], neg_a, dt_bias, norm_weight, state, eps,
                            k_heads, None if valid is None else valid[:, one]))
            if snapshots is not None:
                snapshots[:, i].copy_(state)
        return torch.cat(outs, 1)
    return run(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid, snapshots,
               PREFILL_CHUNK).contiguous()


@gated_delta_step.register_fake
def _(mixed, a, b, z, neg_a, dt_bias, norm_weight, state, eps, k_heads, valid, snapshots):
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
