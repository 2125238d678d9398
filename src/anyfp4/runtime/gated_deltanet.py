"""A Gated DeltaNet token mixer (the linear-attention layers of Qwen3.5-style hybrids), computed as transformers'
Qwen3.5 does: q/k/v from one projection through a depthwise causal convolution and silu, the gated delta rule over a
float32 recurrent state per value head (decay exp(-exp(A_log) * softplus(a + dt_bias)), write strength sigmoid(b)),
a gated RMSNorm per head with z, and the output projection. The input projections (qkv with z, b with a: each pair
one launch where their formats allow; float b / a through their GEMV run in the convolution's launch where that
GEMV takes the call) and the output projection are whatever linears the loader builds (any format);
the states live in fixed buffers, like the KV cache."""

from __future__ import annotations

import torch
from torch import nn

from .. import ops  # noqa: F401  (registers torch.ops.anyfp4)
from ..nn.linear import DenseLinear
from .config import GDNShape


class GatedDeltaNet(nn.Module):
    def __init__(self, shape: GDNShape, in_proj_qkvz: nn.Module, in_proj_ba: nn.Module, out_proj: nn.Module,
                 conv_weight: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, norm_weight: torch.Tensor,
                 eps: float):
        """``in_proj_qkvz``: in_proj_qkv and in_proj_z as one fused linear or a ModuleList of the two;
        ``in_proj_ba``: in_proj_b and in_proj_a likewise."""
        super().__init__()
        s = shape
        if s.v_heads % s.k_heads:
            raise ValueError(f"{s.v_heads} value heads do not share {s.k_heads} key heads evenly")
        want = {"conv weight": (conv_weight, (s.conv_channels, s.conv_kernel)), "A_log": (a_log, (s.v_heads,)),
                "dt_bias": (dt_bias, (s.v_heads,)), "norm weight": (norm_weight, (s.v_dim,))}
        for name, (t, expected) in want.items():
            if tuple(t.shape) != expected:
                raise ValueError(f"Gated DeltaNet {name} has shape {tuple(t.shape)}, the head counts give {expected}")
        self.shape, self.eps = s, eps
        self.in_proj_qkvz, self.in_proj_ba = in_proj_qkvz, in_proj_ba
        self.out_proj = out_proj
        self.register_buffer("conv_weight", conv_weight)
        self.register_buffer("neg_a", -a_log.float().exp())  # the decay rate per value head, float32
        self.register_buffer("dt_bias", dt_bias.float())
        self.register_buffer("norm_weight", norm_weight)
        self.conv_state: torch.Tensor | None = None
        self.recurrent_state: torch.Tensor | None = None
        self.snap_conv: torch.Tensor | None = None  # (b, tokens, ...): the states after each token of a step
        self.snap_recurrent: torch.Tensor | None = None
        self.snap_views: list[tuple[torch.Tensor, torch.Tensor]] = []  # (conv, recurrent) after token i, made once

    def state_tensors(self) -> list:
        """What a step reads and writes beside its inputs (a captured CUDA graph holds on to these tensors: new
        ones, snapshots included, mean a new capture)."""
        return [self.conv_state, self.recurrent_state, self.snap_conv, self.snap_recurrent]

    def advancing_states(self) -> list[torch.Tensor]:
        """The states a step advances (the rest of ``state_tensors`` it overwrites)."""
        return [self.conv_state, self.recurrent_state]

    def setup_state(self, batch: int) -> None:
        """Zeroed convolution and recurrent states for ``batch`` sequences (the same tensors when the shape is
        unchanged, so that CUDA graphs captured over them stay valid)."""
        s, dev = self.shape, self.conv_weight.device
        wanted = {"conv_state": ((batch, s.conv_channels, s.conv_kernel - 1), self.conv_weight.dtype),
                  "recurrent_state": ((batch, s.v_heads, s.k_dim, s.v_dim), torch.float32)}
        for name, (shape, dtype) in wanted.items():
            old = getattr(self, name)
            if old is not None and tuple(old.shape) == shape and old.dtype == dtype and old.device == dev:
                old.zero_()
            else:
                setattr(self, name, torch.zeros(shape, dtype=dtype, device=dev))
        if self.snap_recurrent is not None and self.snap_recurrent.shape[0] != batch:
            self.snap_conv = self.snap_recurrent = None  # snapshots of another batch
            self.snap_views = []

    def setup_snapshots(self, tokens: int) -> None:
        """Keep the states after each token of a step of up to ``tokens`` tokens (0: none), so that
        ``keep_states`` can return to any of them (speculative decoding: the accepted prefix of a verify step).
        Needs ``setup_state`` first; fixed buffers, like the states."""
        if tokens <= 0:
            self.snap_conv = self.snap_recurrent = None
            self.snap_views = []
            return
        b = self.recurrent_state.shape[0]
        old = self.snap_recurrent
        if old is not None and old.shape[:2] == (b, tokens):  # the same tensors: graphs captured over them stay valid
            return
        self.snap_conv = self.conv_state.new_zeros(b, tokens, *self.conv_state.shape[1:])
        self.snap_recurrent = self.recurrent_state.new_zeros(b, tokens, *self.recurrent_state.shape[1:])
        # the views a return to token i copies from, made here once: a speculative step's return then slices nothing
        self.snap_views = [(self.snap_conv[:, i], self.snap_recurrent[:, i]) for i in range(tokens)]

    def kept_states(self, tokens: int, step_tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The copies (state, its snapshot) that put the states as after the first ``tokens`` tokens of the last
        step, of ``step_tokens`` tokens (told, not remembered: a replayed CUDA graph runs no Python)."""
        capacity = 0 if self.snap_recurrent is None else self.snap_recurrent.shape[1]
        if not 1 <= tokens <= step_tokens <= capacity:
            raise ValueError(f"cannot keep the states after {tokens} of {step_tokens} tokens: snapshots are kept for "
                             f"steps of up to {capacity} (setup_snapshots)")
        if tokens == step_tokens:
            return []
        conv, recurrent = self.snap_views[tokens - 1]
        return [(self.conv_state, conv), (self.recurrent_state, recurrent)]

    def keep_states(self, tokens: int, step_tokens: int) -> None:
        """The states as after the first ``tokens`` tokens of the last step, of ``step_tokens`` tokens."""
        for state, snapshot in self.kept_states(tokens, step_tokens):
            state.copy_(snapshot)

    def b_a_in_conv(self, x: torch.Tensor) -> bool:
        """Whether this call computes b / a in the convolution's launch: where they are one float linear whose call
        would run its GEMV launch (the same bits, one launch fewer)."""
        return isinstance(self.in_proj_ba, DenseLinear) and self.in_proj_ba.takes_gemv(x)

    def forward(self, x: torch.Tensor, cos=None, sin=None, mask: torch.Tensor | None = None,
                input_pos: torch.Tensor | None = None, key_start=None, span=None) -> torch.Tensor:
        """x (b, t, hidden), the t tokens after those the states have seen -> (b, t, hidden). Of an attention
        layer's arguments only a left-padded batch's ``mask`` (b, 1, t, S) and ``input_pos`` are read, for which
        tokens are padding (their own slots masked): a padded token enters the convolution as zeros and neither
        decays nor writes the recurrent state, so a row's states after its padding are those of a fresh start.
        Where snapshots are set up for steps of at least t tokens, the states after each token are kept."""
        if self.recurrent_state is None or self.recurrent_state.shape[0] != x.shape[0]:
            raise RuntimeError(f"Gated DeltaNet state not set up for a batch of {x.shape[0]} (setup_state)")
        t = x.shape[1]
        valid = None
        if mask is not None and mask.dim() == 4:  # left padding: a token is valid where it may attend to itself
            valid = mask[:, 0, torch.arange(t, device=x.device), input_pos].to(x.dtype)
        qkv, z = _outputs(self.in_proj_qkvz, x, self.shape.conv_channels)
        in_conv = self.b_a_in_conv(x)
        if not in_conv:
            b_in, a_in = _outputs(self.in_proj_ba, x, self.shape.v_heads)
        if valid is not None:
            qkv = qkv * valid[..., None]
        record = self.snap_recurrent is not None and t <= self.snap_recurrent.shape[1]
        snap = self.snap_conv if record else None
        if in_conv:
            ba = self.in_proj_ba
            mixed, b_a = torch.ops.anyfp4.causal_conv_proj(qkv, self.conv_weight, self.conv_state, snap, x, ba.weight,
                                                           ba.bias)
            b_in, a_in = _split(b_a, self.shape.v_heads)
        else:
            mixed = torch.ops.anyfp4.causal_conv(qkv, self.conv_weight, self.conv_state, snap)
        o = torch.ops.anyfp4.gated_delta_step(mixed, a_in, b_in, z, self.neg_a, self.dt_bias, self.norm_weight,
                                              self.recurrent_state, self.eps, self.shape.k_heads, valid,
                                              self.snap_recurrent if record else None)
        return self.out_proj(o)


def _outputs(proj: nn.Module, x: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two projections of a pair (one fused linear, or a ModuleList of two), the first ``first`` wide."""
    if isinstance(proj, nn.ModuleList):
        return proj[0](x), proj[1](x)
    return _split(proj(x), first)


def _split(y: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused pair's output as its two projections', the first ``first`` wide."""
    return y[..., :first], y[..., first:]
