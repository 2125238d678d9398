"""A Gated DeltaNet layer's mixer on the GPU over t tokens (a decode step, a verify pass, a prefill) in three Triton
launches instead of torch's chain of small kernels:

- ``conv``: the depthwise causal convolution and silu, programs over (row, channel block, token block) — every
  output reads only inputs, so tokens run in parallel; the rolling state (the last kernel - 1 inputs) is rewritten by
  the programs of the first token block, the only ones that read it; where asked, the same launch also runs a
  small projection of the layer's input (the bf16 a / b projections: ``dense_gemv``'s programs and bits) in
  programs of its own — one launch fewer a layer;
- ``delta_rule``: per (row, value head, block of 32 value dims) the float32 state tile in registers through the t
  tokens one after another: q / k L2-normalized, the gates from the a / b projections, decay, delta, update, output
  (rounded); optionally the state after each token into a snapshot buffer (speculation returns to any of them);
- ``gated_norm``: per (row, token, head) the RMSNorm of the head's outputs times the weight, times silu(z).

A token's arithmetic is the same whatever t is (the state stays in float32 registers between tokens instead of
going through memory: the same values), so a verify pass and a prefill give the bits of one-token steps; and each
program computes one batch row alone, so a row's bits do not depend on the batch. The definitions they are tested
against: ``reference.causal_conv`` and ``reference.gated_delta_step``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from ..triton.common import early_launch_args, round_to_output, wait_for_previous_kernel
from ..triton import dense_gemv as gemv
from ..triton.dense_gemv import gemv_rows
from .reference import L2_EPS

_L2_EPS = tl.constexpr(L2_EPS)
GEMV_BLOCK_N = tl.constexpr(gemv.BLOCK_N)  # a projection's rows in the convolution's launch: dense_gemv's tiles
GEMV_BLOCK_K = tl.constexpr(gemv.BLOCK_K)
CONV_WARPS = gemv.NUM_WARPS  # and its warps, so that those rows get dense_gemv's bits
STATE_BLOCK_V = 32  # value dims per program of a head's state: (DK, 32) float32 tiles, four programs a head at 128
CONV_BLOCK_T = 16  # tokens per convolution program at most (fewer for fewer tokens)


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _conv_input(x_ptr, state_ptr, src, ch, valid, stride_xt, stride_sc, WIDTH: tl.constexpr):
    """Input ``src`` (per token; < 0: from the rolling state) of channels ``ch``: (BLOCK_T, BLOCK_C)."""
    from_x = tl.load(x_ptr + src[:, None] * stride_xt + ch[None, :], mask=valid & (src[:, None] >= 0), other=0.0)
    old = tl.load(state_ptr + ch[None, :] * stride_sc + (src[:, None] + WIDTH - 1), mask=valid & (src[:, None] < 0),
                  other=0.0)
    return tl.where(src[:, None] >= 0, from_x, old.to(from_x.dtype))


@triton.jit
def conv_kernel(x_ptr, w_ptr, state_ptr, y_ptr, snap_ptr, T, channels, stride_xb, stride_xt, stride_sb, stride_sc,
                stride_yb, stride_yt, stride_pb, stride_pt, stride_pc, h_ptr, pw_ptr, pb_ptr, po_ptr, PN, PK,
                stride_hb, stride_ht, stride_pw, stride_qb, stride_qt, conv_blocks, WIDTH: tl.constexpr,
                SNAP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, PROJ: tl.constexpr,
                PROJ_BIAS: tl.constexpr, INTERPRET: tl.constexpr, EARLY: tl.constexpr):
    """Programs (row, channel block, token block); with PROJ, the channel blocks from ``conv_blocks`` on are a
    small projection's instead: output rows of h (row, token) for each token of the block, as ``dense_gemv``
    computes them (the same bits), in the convolution's launch."""
    wait_for_previous_kernel(EARLY)
    row, cb, tb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PROJ and cb >= conv_blocks:
        for tok in range(tb * BLOCK_T, tl.minimum(T, tb * BLOCK_T + BLOCK_T)):
            gemv_rows(h_ptr + row * stride_hb + tok * stride_ht, pw_ptr, pb_ptr,
                      po_ptr + row * stride_qb + tok * stride_qt, cb - conv_blocks, PN, PK, stride_pw,
                      GEMV_BLOCK_N, GEMV_BLOCK_K, PROJ_BIAS, INTERPRET)
    else:
        _conv_block(x_ptr, w_ptr, state_ptr, y_ptr, snap_ptr, T, channels, stride_xb, stride_xt, stride_sb,
                    stride_sc, stride_yb, stride_yt, stride_pb, stride_pt, stride_pc, row, cb, tb, WIDTH, SNAP,
                    BLOCK_T, BLOCK_C, INTERPRET)


@triton.jit
def _conv_block(x_ptr, w_ptr, state_ptr, y_ptr, snap_ptr, T, channels, stride_xb, stride_xt, stride_sb, stride_sc,
                stride_yb, stride_yt, stride_pb, stride_pt, stride_pc, row, cb, tb, WIDTH: tl.constexpr,
                SNAP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, INTERPRET: tl.constexpr):
    ch = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    tok = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = (tok[:, None] < T) & (ch[None, :] < channels)
    x_row, state = x_ptr + row * stride_xb, state_ptr + row * stride_sb
    y = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(WIDTH):  # taps in order, oldest input first
        tap = _conv_input(x_row, state, tok - (WIDTH - 1) + j, ch, valid, stride_xt, stride_sc, WIDTH)
        w = tl.load(w_ptr + ch * WIDTH + j, mask=ch < channels, other=0.0).to(tl.float32)
        y += tap.to(tl.float32) * w[None, :]
    tl.store(y_ptr + row * stride_yb + tok[:, None] * stride_yt + ch[None, :],
             round_to_output(_silu(y), y_ptr.dtype.element_ty, INTERPRET), mask=valid)
    if SNAP:  # the window after each token: its last WIDTH - 1 inputs
        for j in tl.static_range(WIDTH - 1):
            kept = _conv_input(x_row, state, tok - (WIDTH - 2) + j, ch, valid, stride_xt, stride_sc, WIDTH)
            tl.store(snap_ptr + row * stride_pb + tok[:, None] * stride_pt + ch[None, :] * stride_pc + j,
                     kept.to(snap_ptr.dtype.element_ty), mask=valid)
    if tb == 0:  # the new state: the last WIDTH - 1 inputs; slot j reads slot T + j > j (not yet rewritten)
        tl.debug_barrier()  # every thread of the program has read the old state
        for j in tl.static_range(WIDTH - 1):
            src = tl.zeros([BLOCK_C], dtype=tl.int32) + (T - (WIDTH - 1) + j)  # per channel (masks of one shape)
            inside = ch < channels
            from_x = tl.load(x_row + src * stride_xt + ch, mask=inside & (src >= 0), other=0.0)
            old = tl.load(state + ch * stride_sc + (src + WIDTH - 1), mask=inside & (src < 0), other=0.0)
            newest = tl.where(src >= 0, from_x, old.to(from_x.dtype))
            tl.store(state + ch * stride_sc + j, newest.to(state_ptr.dtype.element_ty), mask=inside)


@triton.jit
def delta_rule_kernel(mixed_ptr, a_ptr, b_ptr, neg_a_ptr, dt_bias_ptr, state_ptr, out_ptr, valid_ptr, snap_ptr, T,
                      v_heads, stride_mb, stride_mt, stride_ab, stride_at, stride_bb, stride_bt, stride_ob, stride_ot,
                      stride_vb, stride_pb, stride_pt, q_scale, K_HEADS: tl.constexpr, DK: tl.constexpr,
                      DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_VALID: tl.constexpr,
                      SNAP: tl.constexpr, INTERPRET: tl.constexpr, EARLY: tl.constexpr):
    """One program per (row, value head, block of BV value dims): the (DK, BV) state tile through the T tokens."""
    wait_for_previous_kernel(EARLY)
    pid, blk = tl.program_id(0), tl.program_id(1)
    row, head = pid // v_heads, pid % v_heads
    kh = head // (v_heads // K_HEADS)
    kk, vv = tl.arange(0, BK), blk * BV + tl.arange(0, BV)
    k_in, v_in = kk < DK, vv < DV
    tile = k_in[:, None] & v_in[None, :]
    s_off = pid * DK * DV + kk[:, None] * DV + vv[None, :]
    s = tl.load(state_ptr + s_off, mask=tile, other=0.0)
    neg_a, dt_bias = tl.load(neg_a_ptr + head), tl.load(dt_bias_ptr + head)
    for t in range(T):
        base = mixed_ptr + row * stride_mb + t * stride_mt
        q = tl.load(base + kh * DK + kk, mask=k_in, other=0.0).to(tl.float32)
        k = tl.load(base + K_HEADS * DK + kh * DK + kk, mask=k_in, other=0.0).to(tl.float32)
        v = tl.load(base + 2 * K_HEADS * DK + head * DV + vv, mask=v_in, other=0.0).to(tl.float32)
        b_in = tl.load(b_ptr + row * stride_bb + t * stride_bt + head).to(tl.float32)  # before the sums below:
        a_in = tl.load(a_ptr + row * stride_ab + t * stride_at + head).to(tl.float32)  # one wait, not two
        if HAS_VALID:
            keep = tl.load(valid_ptr + row * stride_vb + t)
        q = q / tl.sqrt(tl.sum(q * q, axis=0) + _L2_EPS) * q_scale
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + _L2_EPS)
        beta = 1.0 / (1.0 + tl.exp(-b_in))
        a = a_in + dt_bias
        softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
        g = neg_a * softplus
        if HAS_VALID:  # left padding neither decays nor writes the state
            beta, g = beta * keep, g * keep
        s = s * tl.exp(g)
        delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
        s = s + k[:, None] * delta[None, :]
        o = tl.sum(s * q[:, None], axis=0)
        tl.store(out_ptr + row * stride_ob + t * stride_ot + head * DV + vv,
                 round_to_output(o, out_ptr.dtype.element_ty, INTERPRET), mask=v_in)
        if SNAP:
            tl.store(snap_ptr + row * stride_pb + t * stride_pt + head * DK * DV + kk[:, None] * DV + vv[None, :], s,
                     mask=tile)
    tl.store(state_ptr + s_off, s, mask=tile)


@triton.jit
def gated_norm_kernel(x_ptr, z_ptr, w_ptr, out_ptr, heads, stride_xr, stride_zr, stride_or, eps,
                      D: tl.constexpr, BD: tl.constexpr, INTERPRET: tl.constexpr, EARLY: tl.constexpr):
    """One program per (row, head): RMSNorm of the head's D values times the weight, times silu(z), rounded as
    ``reference.gated_rms_norm`` rounds it (``out`` may be ``x``)."""
    wait_for_previous_kernel(EARLY)
    pid = tl.program_id(0)
    row, head = pid // heads, pid % heads
    d = tl.arange(0, BD)
    inside = d < D
    x = tl.load(x_ptr + row * stride_xr + head * D + d, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + d, mask=inside, other=0.0).to(tl.float32)  # all loads before the sum: one wait, not three
    gate = tl.load(z_ptr + row * stride_zr + head * D + d, mask=inside, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    normed = round_to_output(x / tl.sqrt(tl.sum(x * x, axis=0) / D + eps), dtype, INTERPRET).to(tl.float32)
    weighted = round_to_output(w * normed, w_ptr.dtype.element_ty, INTERPRET).to(tl.float32)
    tl.store(out_ptr + row * stride_or + head * D + d, round_to_output(weighted * _silu(gate), dtype, INTERPRET),
             mask=inside)


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def conv(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, snapshots: torch.Tensor | None = None,
         out: torch.Tensor | None = None, proj: tuple | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x (b, t, channels), weight (channels, kernel), conv_state (b, channels, kernel - 1) advanced in place ->
    silu(conv) (b, t, channels) in x's dtype (into ``out`` if given); ``snapshots`` (b, >= t, channels, kernel - 1):
    the state after each token. ``proj`` (h (b, t, K), W (N, K), bias (N,) or None): also ``dense_gemv(h, W,
    bias)`` in the same launch (its bits), returned second."""
    b, t, ch = x.shape
    width = weight.shape[1]
    x = _last_contiguous(x)
    if conv_state.stride(-1) != 1:
        raise ValueError("the convolution state must be contiguous in its last dimension")
    y = torch.empty(b, t, ch, dtype=x.dtype, device=x.device) if out is None else out
    snap = snapshots if snapshots is not None else conv_state
    block_c = min(256, triton.next_power_of_2(ch))
    block_t = min(CONV_BLOCK_T, triton.next_power_of_2(t))  # a decode step: one token, no masked rows
    conv_blocks = triton.cdiv(ch, block_c)
    if proj is not None:
        h, pw, pb = proj
        if h.shape[:2] != (b, t) or pw.dim() != 2 or h.shape[-1] != pw.shape[1] or (
                pb is not None and pb.shape != (pw.shape[0],)):
            raise ValueError(f"conv: projection input {tuple(h.shape)}, weight {tuple(pw.shape)} and bias "
                             f"{None if pb is None else tuple(pb.shape)} disagree with x {tuple(x.shape)}")
        h, pw = _last_contiguous(h), pw.contiguous()
        po = torch.empty(b, t, pw.shape[0], dtype=h.dtype, device=h.device)
        proj_args = (h, pw, pb if pb is not None else pw, po, pw.shape[0], pw.shape[1], h.stride(0), h.stride(1),
                     pw.stride(0), po.stride(0), po.stride(1))
        proj_blocks = triton.cdiv(pw.shape[0], gemv.BLOCK_N)
    else:
        proj_args, proj_blocks = (x, x, x, x, 0, 0, 0, 0, 0, 0, 0), 0
    conv_kernel[(b, conv_blocks + proj_blocks, triton.cdiv(t, block_t))](
        x, weight.contiguous(), conv_state, y, snap, t, ch, x.stride(0), x.stride(1), conv_state.stride(0),
        conv_state.stride(1), y.stride(0), y.stride(1), snap.stride(0), snap.stride(1) if snapshots is not None else 0,
        snap.stride(2) if snapshots is not None else 0, *proj_args, conv_blocks, WIDTH=width,
        SNAP=snapshots is not None, BLOCK_T=block_t, BLOCK_C=block_c, PROJ=proj is not None,
        PROJ_BIAS=proj is not None and proj[2] is not None, INTERPRET=triton_interpret(), num_warps=CONV_WARPS,
        **early_launch_args(x.device))
    return y if proj is None else (y, proj_args[3])


def delta_rule(mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor, z: torch.Tensor, neg_a: torch.Tensor,
               dt_bias: torch.Tensor, norm_weight: torch.Tensor, state: torch.Tensor, eps: float, k_heads: int,
               valid: torch.Tensor | None = None, snapshots: torch.Tensor | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """``reference.gated_delta_step`` over t tokens: mixed (b, t, 2 hk dk + hv dv) the convolved q | k | v,
    a / b (b, t, hv), z (b, t, hv dv), state (b, hv, dk, dv) float32 contiguous, advanced in place, ``valid``
    (b, t) or None, ``snapshots`` (b, >= t, hv, dk, dv) float32 contiguous: the state after each token ->
    (b, t, hv dv) in mixed's dtype (into ``out`` if given). Two launches: the delta rule over blocks of value dims,
    then the gated norm per token and head."""
    rows, v_heads, dk, dv = state.shape
    t = mixed.shape[1]
    if not state.is_contiguous() or (snapshots is not None and not snapshots.is_contiguous()):
        raise ValueError("the recurrent state and its snapshots must be contiguous")
    mixed, a, b, z = (_last_contiguous(x) for x in (mixed, a, b, z))
    y = torch.empty(rows, t, v_heads * dv, dtype=mixed.dtype, device=mixed.device) if out is None else out
    keep = valid.to(torch.float32).contiguous() if valid is not None else state
    snap = snapshots if snapshots is not None else state
    early = early_launch_args(mixed.device)
    bk, bv = triton.next_power_of_2(dk), min(STATE_BLOCK_V, triton.next_power_of_2(dv))
    delta_rule_kernel[(rows * v_heads, triton.cdiv(dv, bv))](
        mixed, a, b, neg_a, dt_bias, state, y, keep, snap, t, v_heads, mixed.stride(0), mixed.stride(1), a.stride(0),
        a.stride(1), b.stride(0), b.stride(1), y.stride(0), y.stride(1), keep.stride(0) if valid is not None else 0,
        snap.stride(0) if snapshots is not None else 0, snap.stride(1) if snapshots is not None else 0, dk ** -0.5,
        K_HEADS=k_heads, DK=dk, DV=dv, BK=bk, BV=bv, HAS_VALID=valid is not None, SNAP=snapshots is not None,
        INTERPRET=triton_interpret(), num_warps=max(1, min(8, bk * bv // 1024)), **early)
    return gated_norm(y, z, norm_weight, eps)


def gated_norm(y: torch.Tensor, z: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """In place: each head's dv values of y (b, t, hv dv), contiguous, RMS-normalized times ``norm_weight`` (dv,),
    times silu(z) (b, t, hv dv) -> y."""
    rows, t, width = y.shape
    dv = norm_weight.shape[0]
    v_heads = width // dv
    y2, z2 = y.view(rows * t, width), _last_contiguous(z).reshape(rows * t, width)
    gated_norm_kernel[(rows * t * v_heads,)](
        y2, z2, norm_weight, y2, v_heads, y2.stride(0), z2.stride(0), y2.stride(0), float(eps), D=dv,
        BD=triton.next_power_of_2(dv), INTERPRET=triton_interpret(), num_warps=1, **early_launch_args(y.device))
    return y
