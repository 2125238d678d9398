"""A Gated DeltaNet token mixer (the linear-attention layers of Qwen3.5-style hybrids), computed as transformers'
Qwen3.5 does: q/k/v from one projection through a depthwise causal convolution and silu, the gated delta rule over a
float32 recurrent state per value head (decay exp(-exp(A_log) * softplus(a + dt_bias)), write strength sigmoid(b)),
a gated RMSNorm per head with z, and the output projection. The four input projections and the output projection are
whatever linears the loader builds (any format); the states live in fixed buffers, like the KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops  # noqa: F401  (registers torch.ops.anyfp4)
from ..dispatch.limits import DECODE_ROWS
from ..kernels.gdn.reference import per_row
from .config import GDNShape

PREFILL_CHUNK = 64  # tokens per chunk of the gated delta rule beyond DECODE_ROWS (token by token up to it)


class GatedDeltaNet(nn.Module):
    def __init__(self, shape: GDNShape, in_proj_qkv: nn.Module, in_proj_z: nn.Module, in_proj_b: nn.Module,
                 in_proj_a: nn.Module, out_proj: nn.Module, conv_weight: torch.Tensor, a_log: torch.Tensor,
                 dt_bias: torch.Tensor, norm_weight: torch.Tensor, eps: float):
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
        self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a = in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
        self.out_proj = out_proj
        self.register_buffer("conv_weight", conv_weight)
        self.register_buffer("neg_a", -a_log.float().exp())  # the decay rate per value head, float32
        self.register_buffer("dt_bias", dt_bias.float())
        self.register_buffer("norm_weight", norm_weight)
        self.conv_state: torch.Tensor | None = None
        self.recurrent_state: torch.Tensor | None = None
        self.snap_conv: torch.Tensor | None = None  # (b, tokens, ...): the states after each token of a step
        self.snap_recurrent: torch.Tensor | None = None

    def state_tensors(self) -> list:
        """What a step reads and writes beside its inputs (a captured CUDA graph holds on to these tensors: new
        ones, snapshots included, mean a new capture)."""
        return [self.conv_state, self.recurrent_state, self.snap_conv, self.snap_recurrent]

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

    def setup_snapshots(self, tokens: int) -> None:
        """Keep the states after each token of a step of up to ``tokens`` tokens (0: none), so that
        ``keep_states`` can return to any of them (speculative decoding: the accepted prefix of a verify step).
        Needs ``setup_state`` first; fixed buffers, like the states."""
        if tokens <= 0:
            self.snap_conv = self.snap_recurrent = None
            return
        b = self.recurrent_state.shape[0]
        old = self.snap_recurrent
        if old is not None and old.shape[:2] == (b, tokens):  # the same tensors: graphs captured over them stay valid
            return
        self.snap_conv = self.conv_state.new_zeros(b, tokens, *self.conv_state.shape[1:])
        self.snap_recurrent = self.recurrent_state.new_zeros(b, tokens, *self.recurrent_state.shape[1:])

    def keep_states(self, tokens: int, step_tokens: int) -> None:
        """The states as after the first ``tokens`` tokens of the last step, of ``step_tokens`` tokens (told, not
        remembered: a replayed CUDA graph runs no Python)."""
        capacity = 0 if self.snap_recurrent is None else self.snap_recurrent.shape[1]
        if not 1 <= tokens <= step_tokens <= capacity:
            raise ValueError(f"cannot keep the states after {tokens} of {step_tokens} tokens: snapshots are kept for "
                             f"steps of up to {capacity} (setup_snapshots)")
        if tokens < step_tokens:
            self.conv_state.copy_(self.snap_conv[:, tokens - 1])
            self.recurrent_state.copy_(self.snap_recurrent[:, tokens - 1])

    def _mix(self, qkv, b_in, a_in, z, chunk: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        """The convolution, the delta rule (advancing the states) and the gated norm of t tokens -> (b, t, v dims).
        ``valid`` (b, t) False on left padding: a padded token enters the convolution as zeros and neither decays
        nor writes the recurrent state, so a row's states after its padding are those of a fresh start."""
        s = self.shape
        b, t, _ = qkv.shape
        if valid is not None:
            qkv = qkv * valid[..., None]
        mixed = torch.ops.anyfp4.causal_conv(qkv, self.conv_weight, self.conv_state)
        kd = s.k_heads * s.k_dim
        q, k, v = mixed.split([kd, kd, s.v_heads * s.v_dim], dim=-1)
        q, k = q.reshape(b, t, s.k_heads, s.k_dim), k.reshape(b, t, s.k_heads, s.k_dim)
        v = v.reshape(b, t, s.v_heads, s.v_dim)
        beta = per_row(torch.sigmoid, b_in.float())
        g = self.neg_a * per_row(F.softplus, a_in.float() + self.dt_bias)
        if valid is not None:
            beta, g = beta * valid[..., None], g * valid[..., None]
        o = torch.ops.anyfp4.gated_delta(q, k, v, g, beta, self.recurrent_state, chunk)
        o = torch.ops.anyfp4.gated_rms_norm(o, z.reshape(b, t, s.v_heads, s.v_dim), self.norm_weight, self.eps)
        return o.reshape(b, t, s.v_heads * s.v_dim)

    def forward(self, x: torch.Tensor, cos=None, sin=None, mask: torch.Tensor | None = None,
                input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """x (b, t, hidden), the t tokens after those the states have seen -> (b, t, hidden). Of an attention
        layer's arguments only a left-padded batch's ``mask`` (b, 1, t, S) and ``input_pos`` are read, for which
        tokens are padding (their own slots masked); the states hold the sequence so far.
        Up to DECODE_ROWS tokens (decode and verify steps) are mixed one token at a time, each as a one-token step
        mixes it, with the states after each kept where snapshots are set up; more (prefill) in chunks."""
        if self.recurrent_state is None or self.recurrent_state.shape[0] != x.shape[0]:
            raise RuntimeError(f"Gated DeltaNet state not set up for a batch of {x.shape[0]} (setup_state)")
        t = x.shape[1]
        valid = None
        if mask is not None and mask.dim() == 4:  # left padding: a token is valid where it may attend to itself
            valid = mask[:, 0, torch.arange(t, device=x.device), input_pos].to(x.dtype)
        parts = (self.in_proj_qkv(x), self.in_proj_b(x), self.in_proj_a(x), self.in_proj_z(x))
        if t > DECODE_ROWS:
            return self.out_proj(self._mix(*parts, chunk=PREFILL_CHUNK, valid=valid))
        record = self.snap_recurrent is not None and t <= self.snap_recurrent.shape[1]
        outs = []
        for i in range(t):
            outs.append(self._mix(*(p[:, i:i + 1] for p in parts), chunk=0,
                                  valid=None if valid is None else valid[:, i:i + 1]))
            if record:
                self.snap_conv[:, i].copy_(self.conv_state)
                self.snap_recurrent[:, i].copy_(self.recurrent_state)
        return self.out_proj(torch.cat(outs, 1) if t > 1 else outs[0])
