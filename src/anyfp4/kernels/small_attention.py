"""Attention of a few new query positions (a decode step, t = 1, or a speculative verify pass,
t = k + 1 <= 32) over the static KV cache, grouped-query, in one Triton launch.

One program per (sequence, KV head, block of 16 query rows); the rows of a KV head are its g query
heads times t positions, ordered (head, position). Keys are visited in chunks of 64 from slot 0 up
to the last slot any row of the call may see, with an online softmax in float32; a chunk a row
cannot see leaves that row's running max, sum and output bit for bit unchanged. So a row's output
depends only on its own query, mask and the cache — not on how many rows share the call, nor on
the cache's length: a verify pass gives the bits one-token decode steps give. No split over keys:
fine for the contexts of a few thousand tokens the runner is measured at.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..env import triton_interpret

ROWS = 16  # query rows per program (the tensor-core M)
KEYS = 64  # keys per chunk


def small_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q (b, h, t, hd), k/v (b, kvh, S, hd), mask (t, S) or (b, 1, t, S) bool -> (b, t, h, hd) in float32.
    A row that may see no key gets zeros."""
    b, h, t, hd = q.shape
    g = h // k.shape[1]
    kr, vr = (c.float().repeat_interleave(g, dim=1) for c in (k, v))
    s = (q.float() @ kr.transpose(-1, -2)) * hd**-0.5
    m = mask if mask.dim() == 4 else mask[None, None]
    s = s.masked_fill(~m, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ vr).transpose(1, 2)


@triton.jit
def small_attention_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, pos_ptr, out_ptr,
    T, G, KVH, HD, scale,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b, sm_t, so_b, so_t, so_h,
    BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr,
):
    bh = tl.program_id(0)
    b, kvh = bh // KVH, bh % KVH
    rows = tl.program_id(1) * 16 + tl.arange(0, 16)
    live = rows < G * T
    head = kvh * G + rows // T
    pos = rows % T
    d = tl.arange(0, BLOCK_D)
    dmask = d < HD
    q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + pos[:, None] * sq_t + d[None, :],
                mask=live[:, None] & dmask[None, :], other=0.0)
    m_i = tl.full((16,), -1.0e30, tl.float32)
    l_i = tl.zeros((16,), tl.float32)
    acc = tl.zeros((16, BLOCK_D), tl.float32)
    end = tl.load(pos_ptr + T - 1) + 1  # no row of this call sees a slot past its last position
    for s0 in range(0, end, 64):
        keys = s0 + tl.arange(0, 64)
        kmask = keys < end
        kt = tl.load(k_ptr + b * sk_b + kvh * sk_h + keys[None, :] * sk_s + d[:, None],
                     mask=kmask[None, :] & dmask[:, None], other=0.0)  # (BLOCK_D, 64)
        if INTERPRET:
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32))
        else:
            s = tl.dot(q, kt)
        seen = tl.load(mask_ptr + b * sm_b + pos[:, None] * sm_t + keys[None, :],
                       mask=live[:, None] & kmask[None, :], other=0) != 0
        s = tl.where(seen, s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vv = tl.load(v_ptr + b * sv_b + kvh * sv_h + keys[:, None] * sv_s + d[None, :],
                     mask=kmask[:, None] & dmask[None, :], other=0.0)  # (64, BLOCK_D)
        if INTERPRET:
            pv = tl.dot(p.to(vv.dtype).to(tl.float32), vv.to(tl.float32))
        else:
            pv = tl.dot(p.to(vv.dtype), vv)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + b * so_b + pos[:, None] * so_t + head[:, None] * so_h + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=live[:, None] & dmask[None, :])


def small_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    input_pos: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """q (b, h, t, hd) any strides (last dim contiguous), k/v caches (b, kvh, S, hd), mask (t, S) or
    (b, 1, t, S) bool, input_pos (t,) ascending cache slots of the t rows -> (b, t, h, hd) in q's dtype."""
    b, h, t, hd = q.shape
    kvh = k.shape[1]
    if h % kvh or t > 32 or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError(f"small_attention: unsupported shapes/strides q {tuple(q.shape)} k {tuple(k.shape)}")
    g = h // kvh
    m = mask
    sm_b, sm_t = (m.stride(0), m.stride(2)) if m.dim() == 4 else (0, m.stride(0))
    if out is None:
        out = torch.empty(b, t, h, hd, dtype=q.dtype, device=q.device)
    grid = (b * kvh, triton.cdiv(g * t, ROWS))
    small_attention_kernel[grid](
        q, k, v, m, input_pos, out, t, g, kvh, hd, hd**-0.5,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), sm_b, sm_t, out.stride(0), out.stride(1), out.stride(2),
        BLOCK_D=max(16, triton.next_power_of_2(hd)), INTERPRET=triton_interpret(), num_warps=4)
    return out
