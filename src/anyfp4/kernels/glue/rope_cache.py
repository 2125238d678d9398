"""Rotary embedding of q and k and the KV-cache write of k and v, in one launch (on CUDA replacing
torch's ~14 elementwise / copy kernels per layer, or ~12 of a partial rotary's).

One program per (sequence, position, head) over the q heads and then the KV heads: the first rd dims of a
head (rd = the tables' width, even, at most head_dim) become ``x * cos + rotate_half(x) * sin`` in float32
(HF's "rotate half" convention within them, rotate_half(x) = cat(-x2, x1)), rounded once to the cache dtype;
the dims past rd pass through. q's result goes to a new (b, t, h, hd) tensor, k's and v to the cache slots
``input_pos``. Elementwise, so a row does not depend on the others.

With per-head RMSNorm weights for q and k (Qwen3's q_norm / k_norm) each q and k head is first normalized as
``rms_norm`` normalizes it — the sum of squares over the whole head, ``w * (x * inv)`` rounded to q's dtype — and then
rotated: the two launches of the norms are gone. The rotated values are the bits of ``rms_norm``'s output rotated
(tests/kernels/glue/test_rope_cache.py, in the interpreter and on an H100); a head's bits depend on nothing but that
head. q's and k's weights may differ in dtype (a float32 and a bf16 weight: ``head_weight``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from ..triton.common import early_launch_args, round_to_output, wait_for_previous_kernel


@triton.jit
def head_weight(qw_ptr, kw_ptr, head, H, offs, mask):
    """The RMSNorm weight of head ``head`` (q's below H, k's from H on) at ``offs``, as float32: both weights are
    loaded under complementary masks, since the two may have different dtypes (a float32 and a bf16 weight are no one
    pointer type under a runtime condition)."""
    is_q = (offs * 0 + head) < H  # as a block: the interpreter takes no scalar in a load's mask
    wq = tl.load(qw_ptr + offs, mask=mask & is_q, other=0.0).to(tl.float32)
    wk = tl.load(kw_ptr + offs, mask=mask & (~is_q), other=0.0).to(tl.float32)
    return tl.where(is_q, wq, wk)


@triton.jit
def rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, qo_ptr, kc_ptr, vc_ptr,
    qw_ptr, kw_ptr, eps,
    T, H, HALF, HD,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sc_b, sc_t,
    sqo_b, sqo_t, sqo_h, skc_b, skc_h, skc_s, svc_b, svc_h, svc_s,
    BLOCK: tl.constexpr, BLOCK_HD: tl.constexpr, NORM: tl.constexpr, INTERPRET: tl.constexpr, EARLY: tl.constexpr,
):
    wait_for_previous_kernel(EARLY)
    bt = tl.program_id(0)
    head = tl.program_id(1)
    b, t = bt // T, bt % T
    d = tl.arange(0, BLOCK)
    inside = d < HALF
    c1 = tl.load(cos_ptr + b * sc_b + t * sc_t + d, mask=inside, other=0.0)
    c2 = tl.load(cos_ptr + b * sc_b + t * sc_t + HALF + d, mask=inside, other=0.0)
    s1 = tl.load(sin_ptr + b * sc_b + t * sc_t + d, mask=inside, other=0.0)
    s2 = tl.load(sin_ptr + b * sc_b + t * sc_t + HALF + d, mask=inside, other=0.0)
    out_ty = kc_ptr.dtype.element_ty
    if head < H:
        src = q_ptr + b * sq_b + t * sq_t + head * sq_h
        dst = qo_ptr + b * sqo_b + t * sqo_t + head * sqo_h
    else:
        kv = head - H
        slot = tl.load(pos_ptr + t)
        src = k_ptr + b * sk_b + t * sk_t + kv * sk_h
        dst = kc_ptr + b * skc_b + kv * skc_h + slot * skc_s
        vsrc = v_ptr + b * sv_b + t * sv_t + kv * sv_h
        vdst = vc_ptr + b * svc_b + kv * svc_h + slot * svc_s
        whole = tl.arange(0, BLOCK_HD)
        tl.store(vdst + whole, tl.load(vsrc + whole, mask=whole < HD).to(out_ty), mask=whole < HD)
    x1 = tl.load(src + d, mask=inside, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + d, mask=inside, other=0.0).to(tl.float32)
    rest = 2 * HALF + tl.arange(0, BLOCK_HD)
    xr = tl.load(src + rest, mask=rest < HD, other=0.0)
    if NORM:  # the head's RMSNorm first (q heads q's weight, k heads k's), as rms_norm_kernel computes it
        in_ty = q_ptr.dtype.element_ty
        whole = tl.arange(0, BLOCK_HD)
        xh = tl.load(src + whole, mask=whole < HD, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xh * xh, axis=0) / HD + eps)
        x1 = round_to_output(head_weight(qw_ptr, kw_ptr, head, H, d, inside) * (x1 * inv), in_ty,
                             INTERPRET).to(tl.float32)
        x2 = round_to_output(head_weight(qw_ptr, kw_ptr, head, H, HALF + d, inside) * (x2 * inv), in_ty,
                             INTERPRET).to(tl.float32)
        xr = round_to_output(head_weight(qw_ptr, kw_ptr, head, H, rest, rest < HD) * (xr.to(tl.float32) * inv), in_ty,
                             INTERPRET)
    tl.store(dst + d, round_to_output(x1 * c1 - x2 * s1, out_ty, INTERPRET), mask=inside)
    tl.store(dst + HALF + d, round_to_output(x2 * c2 + x1 * s2, out_ty, INTERPRET), mask=inside)
    if 2 * HALF < HD:  # partial rotary: the rest of the head as it is (normalized with NORM)
        tl.store(dst + rest, xr.to(out_ty), mask=rest < HD)


def rope_cache(q, k, v, cos, sin, k_cache, v_cache, input_pos, q_out=None, norms=None):
    """The launch of ``rope_cache_kernel`` (shapes as ``glue.reference.rope_cache_reference``; last dims contiguous).
    ``norms``: (q's RMSNorm weight, k's, eps), each weight (head_dim,) contiguous, applied before the rotation."""
    b, t, h, hd = q.shape
    kvh, rd = k.shape[2], cos.shape[-1]
    if rd % 2 or rd > hd or any(x.stride(-1) != 1 for x in (q, k, v, cos, sin, k_cache, v_cache)) \
            or cos.stride() != sin.stride():
        raise ValueError("rope_cache: the rotary width must be even and at most head_dim, every last dimension "
                         "contiguous, cos/sin alike")
    if q_out is None:
        q_out = torch.empty(b, t, h, hd, dtype=k_cache.dtype, device=q.device)
    if norms is not None and any(w.shape != (hd,) or w.stride(-1) != 1 for w in norms[:2]):
        raise ValueError(f"rope_cache: the q / k RMSNorm weights must be ({hd},) and contiguous")
    qw, kw, eps = norms if norms is not None else (q, q, 0.0)  # unused without NORM
    sc_b = cos.stride(0) if cos.shape[0] > 1 else 0
    rope_cache_kernel[(b * t, h + kvh)](
        q, k, v, cos, sin, input_pos, q_out, k_cache, v_cache, qw, kw, float(eps), t, h, rd // 2, hd,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), sc_b, cos.stride(1),
        q_out.stride(0), q_out.stride(1), q_out.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK=max(16, triton.next_power_of_2(rd // 2)), BLOCK_HD=max(16, triton.next_power_of_2(hd)),
        NORM=norms is not None, INTERPRET=triton_interpret(), num_warps=1, **early_launch_args(q.device))
    return q_out
