"""Attention of a few new query positions (a decode step, t = 1, or a speculative verify pass,
t = k + 1 <= 32) over the static KV cache, grouped-query, split over keys (flash-decoding).

Pass 1, one program per (sequence, KV head, position and block of 16 of its g query heads, segment of keys):
a tile holds the query heads of one position only, each in the row it has for t = 1 (head i of a block at row
i), so a row's products come out of the same place of the same tensor-core tile whatever the number of positions;
the program visits its segment's keys in chunks of 64, up to the last slot its position may see, with an online
softmax in float32, and writes the segment's running max, sum and unnormalised output. Pass 2 merges the segments
of each row at once (a reduction of one shape per cache). A chunk a row cannot see leaves that row's max, sum and
output bit for bit unchanged, a segment it cannot see adds exact zeros, so a row's output depends only on its own
query, mask and the cache — not on how many rows share the call: a verify pass gives the bits one-token decode
steps give.
Segments are 64 keys for caches of up to 4096 slots and grow with longer caches (at most 64 segments),
so the cache's length matters only past 4096 slots. Segments past the last visible slot do no work.
A left-padded batch passes each sequence's first valid slot (``key_start``): its segments and chunks then begin
there, so a padded row sums its keys in the groups the same prompt alone sums them in (slots before it are
padding, which the mask hides anyway) and gets the bits it gets alone. A call without one reads zeros, so calls
with and without compile to one kernel: with a compile-time 0 in its place they were two variants, and in a
model's calls (Llama-3.1-8B's shapes, 256-slot caches, an H200) a row's sums came out in other last bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...dispatch.limits import DECODE_ROWS
from ...env import triton_interpret
from ..triton.common import early_launch_args, round_to_output, wait_for_previous_kernel

ROWS = 16  # query rows per program (the tensor-core M)
KEYS = 64  # keys per chunk
MAX_SEGMENTS = 64  # segments of one cache; a segment is KEYS slots until the cache outgrows this


def segment_keys(cache_len: int) -> int:
    """Keys per segment for a cache of ``cache_len`` slots: KEYS, doubled until at most MAX_SEGMENTS."""
    seg = KEYS
    while triton.cdiv(cache_len, seg) > MAX_SEGMENTS:
        seg *= 2
    return seg


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
    q_ptr, k_ptr, v_ptr, mask_ptr, pos_ptr, start_ptr, part_ptr, stat_ptr,
    T, G, KVH, HD, SEG, scale,
    sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b, sm_t,
    BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr, EARLY: tl.constexpr,
):
    """Pass 1: one segment of keys for the 16 query heads of block rb (position rb // cdiv(G, 16)) -> part
    (16, BLOCK_D) unnormalised, stat (16, 2) max / sum."""
    wait_for_previous_kernel(EARLY)
    bh, rb, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, kvh = bh // KVH, bh % KVH
    head_blocks = tl.cdiv(G, 16)
    pos = rb // head_blocks
    gi = (rb % head_blocks) * 16 + tl.arange(0, 16)  # query heads of the KV head's group
    live = gi < G
    head = kvh * G + gi
    d = tl.arange(0, BLOCK_D)
    dmask = d < HD
    q = tl.load(q_ptr + b * sq_b + head[:, None] * sq_h + pos * sq_t + d[None, :],
                mask=live[:, None] & dmask[None, :], other=0.0)
    m_i = tl.full((16,), -1.0e30, tl.float32)
    l_i = tl.zeros((16,), tl.float32)
    acc = tl.zeros((16, BLOCK_D), tl.float32)
    end = tl.load(pos_ptr + pos) + 1  # a causal row sees no slot past its own position
    first = tl.load(start_ptr + b)
    lo = first + seg * SEG
    hi = tl.minimum(lo + SEG, end)
    for s0 in range(lo, hi, 64):
        keys = s0 + tl.arange(0, 64)
        kmask = keys < hi
        kt = tl.load(k_ptr + b * sk_b + kvh * sk_h + keys[None, :] * sk_s + d[:, None],
                     mask=kmask[None, :] & dmask[:, None], other=0.0)  # (BLOCK_D, 64)
        if INTERPRET:
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32))
        else:
            s = tl.dot(q, kt)
        seen = tl.load(mask_ptr + b * sm_b + pos * sm_t + keys[None, :] + 0 * gi[:, None],
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
    nseg = tl.num_programs(2)
    base = ((bh * tl.num_programs(1) + rb) * nseg + seg) * 16
    r = tl.arange(0, 16)
    tl.store(part_ptr + (base + r[:, None]) * BLOCK_D + d[None, :], acc)
    tl.store(stat_ptr + (base + r) * 2, m_i)
    tl.store(stat_ptr + (base + r) * 2 + 1, l_i)


@triton.jit
def small_attention_merge_kernel(
    part_ptr, stat_ptr, pos_ptr, start_ptr, out_ptr, gate_ptr, T, G, KVH, HD, SEG, NSEG, so_b, so_t, so_h, sg_b, sg_t,
    sg_h, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, GATE: tl.constexpr, INTERPRET: tl.constexpr,
    EARLY: tl.constexpr,
):
    """Pass 2, one program per query row (the grid is exactly the G * T rows: every program stores): its
    segments merged at once — the segments no row of the call may see load as (max -1e30, sum 0, output 0),
    so the reduction has one shape and adds exact zeros for them. With GATE, the rounded output times
    sigmoid(gate) (rounded), rounded: what the model's output gate computes after the attention."""
    wait_for_previous_kernel(EARLY)
    bh, row = tl.program_id(0), tl.program_id(1)
    b, kvh = bh // KVH, bh % KVH
    gi, pos = row // T, row % T
    head_blocks = tl.cdiv(G, 16)
    rb, r = pos * head_blocks + gi // 16, gi % 16
    head = kvh * G + gi
    d = tl.arange(0, BLOCK_D)
    sg = tl.arange(0, BLOCK_S)
    end = tl.load(pos_ptr + pos) + 1
    first = tl.load(start_ptr + b)
    seen = sg < tl.cdiv(end - first, SEG)
    base = ((bh * T * head_blocks + rb) * NSEG + sg) * 16 + r  # (BLOCK_S,) rows of this query row
    m_s = tl.load(stat_ptr + base * 2, mask=seen, other=-1.0e30)
    l_s = tl.load(stat_ptr + base * 2 + 1, mask=seen, other=0.0)
    part = tl.load(part_ptr + base[:, None] * BLOCK_D + d[None, :], mask=seen[:, None], other=0.0)
    if GATE:  # loaded with the rest, before the reductions: one wait for memory
        g = tl.load(gate_ptr + b * sg_b + pos * sg_t + head * sg_h + d, mask=d < HD, other=0.0).to(tl.float32)
    m = tl.max(m_s, axis=0)
    w = tl.exp(m_s - m)
    l = tl.sum(l_s * w, axis=0)
    acc = tl.sum(part * w[:, None], axis=0)
    out = acc / tl.where(l > 0, l, 1.0)
    dtype = out_ptr.dtype.element_ty
    if GATE:
        sig = round_to_output(1.0 / (1.0 + tl.exp(-g)), dtype, INTERPRET).to(tl.float32)
        out = round_to_output(out, dtype, INTERPRET).to(tl.float32) * sig
    tl.store(out_ptr + b * so_b + pos * so_t + head * so_h + d, round_to_output(out, dtype, INTERPRET), mask=d < HD)


def small_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    input_pos: torch.Tensor, key_start: torch.Tensor | None = None,
                    out: torch.Tensor | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    """q (b, h, t, hd) any strides (last dim contiguous), k/v caches (b, kvh, S, hd), mask (t, S) or
    (b, 1, t, S) bool, input_pos (t,) ascending cache slots of the t rows, key_start (b,) int: each sequence's
    first slot the mask may show (no slot before it is read) -> (b, t, h, hd) in q's dtype; ``gate`` (b, t, h, hd)
    any strides (last dim contiguous): the output times sigmoid(gate), each rounded as torch rounds them."""
    b, h, t, hd = q.shape
    kvh, cache_len = k.shape[1], k.shape[2]
    if h % kvh or t > DECODE_ROWS or q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError(f"small_attention: unsupported shapes/strides q {tuple(q.shape)} k {tuple(k.shape)}")
    if gate is not None and (gate.shape != (b, t, h, hd) or gate.stride(-1) != 1 or gate.dtype != q.dtype):
        raise ValueError(f"small_attention: gate {tuple(gate.shape)} {gate.dtype} must be (b, t, h, hd) = "
                         f"{(b, t, h, hd)} {q.dtype} with a contiguous last dimension")
    g = h // kvh
    m = mask
    sm_b, sm_t = (m.stride(0), m.stride(2)) if m.dim() == 4 else (0, m.stride(0))
    if out is None:
        out = torch.empty(b, t, h, hd, dtype=q.dtype, device=q.device)
    seg = segment_keys(cache_len)
    nseg = triton.cdiv(cache_len, seg)
    row_blocks = t * triton.cdiv(g, ROWS)  # each position's query heads in tiles of their own
    block_d = max(16, triton.next_power_of_2(hd))
    early = early_launch_args(q.device)
    part = torch.empty(b * kvh * row_blocks * nseg * ROWS, block_d, dtype=torch.float32, device=q.device)
    stat = torch.empty(b * kvh * row_blocks * nseg * ROWS, 2, dtype=torch.float32, device=q.device)
    if key_start is None:  # a start is always read: one compiled variant, whatever the caller passes
        key_start = torch.zeros(b, dtype=torch.int64, device=q.device)
    elif key_start.shape != (b,) or key_start.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"small_attention: key_start must be ({b},) int32/int64, got {tuple(key_start.shape)} "
                         f"{key_start.dtype}")
    small_attention_kernel[(b * kvh, row_blocks, nseg)](
        q, k, v, m, input_pos, key_start, part, stat, t, g, kvh, hd, seg, hd**-0.5,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), sm_b, sm_t,
        BLOCK_D=block_d, INTERPRET=triton_interpret(), num_warps=4, **early)
    gs = gate.stride()[:3] if gate is not None else (0, 0, 0)
    small_attention_merge_kernel[(b * kvh, g * t)](
        part, stat, input_pos, key_start, out, gate if gate is not None else out, t, g, kvh, hd, seg, nseg,
        out.stride(0), out.stride(1), out.stride(2), *gs, BLOCK_D=block_d,
        BLOCK_S=max(16, triton.next_power_of_2(nseg)), GATE=gate is not None, INTERPRET=triton_interpret(),
        num_warps=4, **early)
    return out
