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

    def forward(self, x: torch.Tensor, *positions) -> torch.Tensor:
        """x (b, t, hidden), the t tokens after those the states have seen -> (b, t, hidden). ``positions`` (an
        attention layer's cos, sin, mask and cache slots) are not needed: the states hold the sequence so far."""
        if self.recurrent_state is None or self.recurrent_state.shape[0] != x.shape[0]:
            raise RuntimeError(f"Gated DeltaNet state not set up for a batch of {x.shape[0]} (setup_state)")
        s = self.shape
        b, t, _ = x.shape
        mixed = torch.ops.anyfp4.causal_conv(self.in_proj_qkv(x), self.conv_weight, self.conv_state)
        kd = s.k_heads * s.k_dim
        q, k, v = mixed.split([kd, kd, s.v_heads * s.v_dim], dim=-1)
        q, k = q.reshape(b, t, s.k_heads, s.k_dim), k.reshape(b, t, s.k_heads, s.k_dim)
        v = v.reshape(b, t, s.v_heads, s.v_dim)
        beta = per_row(torch.sigmoid, self.in_proj_b(x).float())
        g = self.neg_a * per_row(F.softplus, self.in_proj_a(x).float() + self.dt_bias)
        chunk = 0 if t <= DECODE_ROWS else PREFILL_CHUNK
        o = torch.ops.anyfp4.gated_delta(q, k, v, g, beta, self.recurrent_state, chunk)
        z = self.in_proj_z(x).reshape(b, t, s.v_heads, s.v_dim)
        o = torch.ops.anyfp4.gated_rms_norm(o, z, self.norm_weight, self.eps)
        return self.out_proj(o.reshape(b, t, s.v_heads * s.v_dim))
