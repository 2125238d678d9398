"""One token of a Gated DeltaNet layer on the GPU, in three Triton launches instead of torch's chain of ~100 small
kernels: ``conv_step`` (the depthwise causal convolution and silu over the rolling state, programs over channel
blocks) and ``delta_step`` (per value head and block of its value dims: q / k L2-normalized, the gates from the
a / b projections, the delta rule on the float32 state; then per head the gated RMSNorm with z). The convolution is
its own launch because several value heads read one key head's convolved channels, which it owns and rewrites; the
norm is its own because it reads all of a head's value dims, which several programs produce.

Each program computes one batch row's channels or head alone, so a row's bits do not depend on the batch; a
verify pass runs its tokens one by one through the same two launches, giving the bits of single decode steps.
The definitions they are tested against: ``reference.causal_conv`` and ``reference.gated_delta_step``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from ..triton.common import round_to_output
from .reference import L2_EPS

_L2_EPS = tl.constexpr(L2_EPS)
STATE_BLOCK_V = 32  # value dims per program of a head's state: (DK, 32) float32 tiles, four programs a head at 128


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def conv_step_kernel(x_ptr, w_ptr, state_ptr, y_ptr, channels, stride_xb, stride_sb, stride_sc, stride_yb,
                     WIDTH: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    row, blk = tl.program_id(0), tl.program_id(1)
    ch = blk * BLOCK + tl.arange(0, BLOCK)
    inside = ch < channels
    x = tl.load(x_ptr + row * stride_xb + ch, mask=inside, other=0.0)
    state = state_ptr + row * stride_sb + ch * stride_sc
    y = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(WIDTH - 1):  # taps in order, oldest input first
        tap = tl.load(state + j, mask=inside, other=0.0)
        y += tap.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + j, mask=inside, other=0.0).to(tl.float32)
        if j > 0:
            tl.store(state + (j - 1), tap, mask=inside)
    y += x.to(tl.float32) * tl.load(w_ptr + ch * WIDTH + (WIDTH - 1), mask=inside, other=0.0).to(tl.float32)
    tl.store(state + (WIDTH - 2), x.to(state_ptr.dtype.element_ty), mask=inside)
    tl.store(y_ptr + row * stride_yb + ch, round_to_output(_silu(y), y_ptr.dtype.element_ty, INTERPRET), mask=inside)


@triton.jit
def delta_step_kernel(mixed_ptr, a_ptr, b_ptr, neg_a_ptr, dt_bias_ptr, state_ptr, out_ptr, valid_ptr, v_heads,
                      stride_mb, stride_ab, stride_bb, stride_ob, q_scale, K_HEADS: tl.constexpr, DK: tl.constexpr,
                      DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_VALID: tl.constexpr,
                      INTERPRET: tl.constexpr):
    """One program per (row, value head, block of BV value dims): the (DK, BV) state tile decayed and written, the
    head's outputs of those dims rounded into ``out`` (the gated norm follows in ``gated_norm_kernel``)."""
    pid, blk = tl.program_id(0), tl.program_id(1)
    row, head = pid // v_heads, pid % v_heads
    kh = head // (v_heads // K_HEADS)
    kk, vv = tl.arange(0, BK), blk * BV + tl.arange(0, BV)
    k_in, v_in = kk < DK, vv < DV
    base = mixed_ptr + row * stride_mb
    q = tl.load(base + kh * DK + kk, mask=k_in, other=0.0).to(tl.float32)
    k = tl.load(base + K_HEADS * DK + kh * DK + kk, mask=k_in, other=0.0).to(tl.float32)
    v = tl.load(base + 2 * K_HEADS * DK + head * DV + vv, mask=v_in, other=0.0).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q, axis=0) + _L2_EPS) * q_scale
    k = k / tl.sqrt(tl.sum(k * k, axis=0) + _L2_EPS)
    beta = 1.0 / (1.0 + tl.exp(-tl.load(b_ptr + row * stride_bb + head).to(tl.float32)))
    a = tl.load(a_ptr + row * stride_ab + head).to(tl.float32) + tl.load(dt_bias_ptr + head)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    g = tl.load(neg_a_ptr + head) * softplus
    if HAS_VALID:  # left padding neither decays nor writes the state
        keep = tl.load(valid_ptr + row)
        beta, g = beta * keep, g * keep
    tile = k_in[:, None] & v_in[None, :]
    s_ptrs = state_ptr + pid * DK * DV + kk[:, None] * DV + vv[None, :]
    s = tl.load(s_ptrs, mask=tile, other=0.0) * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s = s + k[:, None] * delta[None, :]
    tl.store(s_ptrs, s, mask=tile)
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(out_ptr + row * stride_ob + head * DV + vv, round_to_output(o, out_ptr.dtype.element_ty, INTERPRET),
             mask=v_in)


@triton.jit
def gated_norm_kernel(x_ptr, z_ptr, w_ptr, out_ptr, heads, stride_xr, stride_zr, stride_or, eps,
                      D: tl.constexpr, BD: tl.constexpr, INTERPRET: tl.constexpr):
    """One program per (row, head): RMSNorm of the head's D values times the weight, times silu(z), rounded as
    ``reference.gated_rms_norm`` rounds it (``out`` may be ``x``)."""
    pid = tl.program_id(0)
    row, head = pid // heads, pid % heads
    d = tl.arange(0, BD)
    inside = d < D
    x = tl.load(x_ptr + row * stride_xr + head * D + d, mask=inside, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    normed = round_to_output(x / tl.sqrt(tl.sum(x * x, axis=0) / D + eps), dtype, INTERPRET).to(tl.float32)
    w = tl.load(w_ptr + d, mask=inside, other=0.0).to(tl.float32)
    weighted = round_to_output(w * normed, w_ptr.dtype.element_ty, INTERPRET).to(tl.float32)
    gate = tl.load(z_ptr + row * stride_zr + head * D + d, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_or + head * D + d, round_to_output(weighted * _silu(gate), dtype, INTERPRET),
             mask=inside)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """(b, 1, n) or (b, n) -> (b, n) with a contiguous last dimension."""
    x2 = x.reshape(x.shape[0], -1)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _valid(valid: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if valid is None:
        return like, False
    return valid.reshape(-1).to(torch.float32).contiguous(), True


def conv_step(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """One token: x (b, 1, channels), weight (channels, kernel), conv_state (b, channels, kernel - 1) advanced in
    place -> silu(conv) (b, 1, channels) in x's dtype (into ``out`` if given)."""
    b, ch, width = x.shape[0], weight.shape[0], weight.shape[1]
    x2 = _rows(x)
    if conv_state.stride(-1) != 1:
        raise ValueError("the convolution state must be contiguous in its last dimension")
    y = torch.empty_like(x2) if out is None else out.view(b, ch)
    block = min(1024, triton.next_power_of_2(ch))
    conv_step_kernel[(b, triton.cdiv(ch, block))](
        x2, weight.contiguous(), conv_state, y, ch, x2.stride(0), conv_state.stride(0), conv_state.stride(1),
        y.stride(0), WIDTH=width, BLOCK=block, INTERPRET=triton_interpret(), num_warps=4)
    return y.view(b, 1, ch)


def delta_step(mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor, z: torch.Tensor, neg_a: torch.Tensor,
               dt_bias: torch.Tensor, norm_weight: torch.Tensor, state: torch.Tensor, eps: float, k_heads: int,
               valid: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """One token of ``reference.gated_delta_step``: mixed (b, 1, 2 hk dk + hv dv) the convolved q | k | v,
    a / b (b, 1, hv), z (b, 1, hv dv), state (b, hv, dk, dv) float32 contiguous, advanced in place, ``valid``
    (b,) or None -> (b, 1, hv dv) in mixed's dtype (into ``out`` if given). Two launches: the delta rule over
    blocks of value dims, then the gated norm per head."""
    rows, v_heads, dk, dv = state.shape
    if not state.is_contiguous():
        raise ValueError("the recurrent state must be contiguous")
    m2, a2, b2, z2 = (_rows(t) for t in (mixed, a, b, z))
    out = torch.empty(rows, v_heads * dv, dtype=mixed.dtype, device=mixed.device) if out is None else out.view(
        rows, v_heads * dv)
    keep, has_valid = _valid(valid, m2)
    bk, bv = triton.next_power_of_2(dk), min(STATE_BLOCK_V, triton.next_power_of_2(dv))
    delta_step_kernel[(rows * v_heads, triton.cdiv(dv, bv))](
        m2, a2, b2, neg_a, dt_bias, state, out, keep, v_heads, m2.stride(0), a2.stride(0), b2.stride(0),
        out.stride(0), dk ** -0.5, K_HEADS=k_heads, DK=dk, DV=dv, BK=bk, BV=bv, HAS_VALID=has_valid,
        INTERPRET=triton_interpret(), num_warps=max(1, min(8, bk * bv // 1024)))
    gated_norm_kernel[(rows * v_heads,)](
        out, z2, norm_weight, out, v_heads, out.stride(0), z2.stride(0), out.stride(0), float(eps), D=dv,
        BD=triton.next_power_of_2(dv), INTERPRET=triton_interpret(), num_warps=1)
    return out.view(rows, 1, v_heads * dv)
