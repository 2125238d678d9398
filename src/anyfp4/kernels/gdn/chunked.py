"""A Gated DeltaNet layer's delta rule over a prompt on the GPU in chunks of CHUNK (or SHORT_CHUNK) tokens (``reference.
gated_delta_chunked``'s algebra), as two Triton launches plus the gated norm of ``step``:

- ``chunk_prep_kernel``, one program per (row, value head, chunk), all chunks at once: the gates, the chunk's
  cumulative log decay Gamma, the unit lower-triangular system of its delta rule inverted by forward substitution
  (T = (I + A)^-1, A_ij = beta_i exp(Gamma_i - Gamma_j) k_i . k_j for j < i), and what the pass over the chunks needs
  from it: W = T (beta exp(Gamma) K), U = T (beta V) and P = exp(Gamma_i - Gamma_j) q_i . k_j for j <= i, so that a
  chunk starting from state S has Delta = U - W S;
- ``chunk_pass_kernel``, one program per (row, value head, block of BV value dims), the chunks one after another
  with the (DK, BV) state tile in registers: Delta = U - W S, O = exp(Gamma) Q S + P Delta,
  S <- exp(Gamma_C) S + (exp(Gamma_C - Gamma) K)^T Delta.

The sequential part is four matrix products a chunk instead of a token's update per token. Its values agree with
the token-by-token form to float32 rounding, not bit for bit (a prompt's rows then depend on the chunking: the
prefill modes of ``env.gdn_prefill_mode`` say which form runs). Each program reads one batch row: a row's bits do
not depend on the batch. The products run in full float32 (``input_precision="ieee"``): the definition's
precision.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...env import triton_interpret
from ..triton.common import early_launch_args, round_to_output, wait_for_previous_kernel
from .reference import L2_EPS
from .step import gated_norm

_L2_EPS = tl.constexpr(L2_EPS)
CHUNK = 64  # tokens per chunk, or SHORT_CHUNK where a block's shared memory is less than CHUNK_SHARED_MEMORY
SHORT_CHUNK = 32
CHUNK_SHARED_MEMORY = 96 << 10  # bytes: the 64-token kernels stage up to 80 KiB of float32 operands (sm_75: 64)
PASS_BLOCK_V = 32  # value dims per program of the pass over the chunks (the state tile: DK x 32 float32)
PREP_WARPS, PASS_WARPS = 8, 4


def chunk_tokens(shared_memory: int) -> int:
    """The chunk length for a GPU whose blocks may use ``shared_memory`` bytes."""
    return CHUNK if shared_memory >= CHUNK_SHARED_MEMORY else SHORT_CHUNK


def _device_chunk(device: torch.device) -> int:
    if device.type != "cuda":
        return CHUNK
    return chunk_tokens(torch.cuda.get_device_properties(device).shared_memory_per_block_optin)


@triton.jit
def _unit_rows(x_ptr, tok, inside, stride_t, col0, cols, col_in):
    """Rows ``tok`` of columns col0 + cols, float32, L2-normalized (zeros outside): (CHUNK, BK)."""
    x = tl.load(x_ptr + tok[:, None] * stride_t + col0 + cols[None, :], mask=inside[:, None] & col_in[None, :],
                other=0.0).to(tl.float32)
    return x / tl.sqrt(tl.sum(x * x, axis=1) + _L2_EPS)[:, None]


@triton.jit
def chunk_prep_kernel(mixed_ptr, a_ptr, b_ptr, neg_a_ptr, dt_bias_ptr, valid_ptr, w_ptr, u_ptr, p_ptr, gamma_ptr,
                      T, v_heads, stride_mb, stride_mt, stride_ab, stride_at, stride_bb, stride_bt, stride_vb, q_scale,
                      K_HEADS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
                      BDV: tl.constexpr, C: tl.constexpr, HAS_VALID: tl.constexpr, EARLY: tl.constexpr):
    """One program per (row x value head, chunk). Writes, per (row, head): W (T_pad, BK), U (T_pad, BDV),
    P (chunks, C, C), Gamma (T_pad), float32 contiguous."""
    wait_for_previous_kernel(EARLY)
    pid, chunk = tl.program_id(0), tl.program_id(1)
    row, head = pid // v_heads, pid % v_heads
    kh = head // (v_heads // K_HEADS)
    i = tl.arange(0, C)
    tok = chunk * C + i
    inside = tok < T
    kk, vv = tl.arange(0, BK), tl.arange(0, BDV)
    base = mixed_ptr + row * stride_mb
    q = _unit_rows(base, tok, inside, stride_mt, kh * DK, kk, kk < DK) * q_scale
    k = _unit_rows(base, tok, inside, stride_mt, K_HEADS * DK + kh * DK, kk, kk < DK)
    v = tl.load(base + tok[:, None] * stride_mt + 2 * K_HEADS * DK + head * DV + vv[None, :],
                mask=inside[:, None] & (vv[None, :] < DV), other=0.0).to(tl.float32)
    bv = tl.load(b_ptr + row * stride_bb + tok * stride_bt + head, mask=inside, other=0.0).to(tl.float32)
    beta = 1.0 / (1.0 + tl.exp(-bv))
    a = tl.load(a_ptr + row * stride_ab + tok * stride_at + head, mask=inside, other=0.0).to(tl.float32)
    a = a + tl.load(dt_bias_ptr + head)
    g = tl.load(neg_a_ptr + head) * tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))
    if HAS_VALID:  # left padding neither decays nor writes the state
        keep = tl.load(valid_ptr + row * stride_vb + tok, mask=inside, other=0.0)
        beta, g = beta * keep, g * keep
    beta, g = tl.where(inside, beta, 0.0), tl.where(inside, g, 0.0)  # tokens past the prompt: no decay, no write
    gamma = tl.cumsum(g, axis=0)
    # (r, c) = (row, column): decay exp(Gamma_r - Gamma_c) where c <= r, else 0 (every exponent taken is <= 0)
    r, c = i[:, None], i[None, :]
    decay = tl.exp(tl.where(c <= r, gamma[:, None] - gamma[None, :], float("-inf")))
    # A transposed: At[j, i] = A[i, j] = beta_i decay[i, j] k_i . k_j for j < i (k k^T is symmetric)
    kkt = tl.dot(k, tl.trans(k), input_precision="ieee")
    at = tl.where(r < c, tl.trans(decay) * beta[None, :] * kkt, 0.0)
    # forward substitution, row i of T = e_i - sum_{j < i} A_ij T_j (rows j >= i of column i of At are 0)
    t_inv = tl.where(r == c, 1.0, 0.0)
    for row_i in range(1, C):
        a_i = tl.sum(tl.where(c == row_i, at, 0.0), axis=1)  # A[row_i, j] over j
        t_inv = tl.where(r == row_i, t_inv - tl.sum(a_i[:, None] * t_inv, axis=0)[None, :], t_inv)
    w = tl.dot(t_inv, k * (beta * tl.exp(gamma))[:, None], input_precision="ieee")
    u = tl.dot(t_inv, v * beta[:, None], input_precision="ieee")
    p = tl.dot(q, tl.trans(k), input_precision="ieee") * decay
    t_pad = tl.num_programs(1) * C
    tl.store(w_ptr + pid * t_pad * BK + tok[:, None] * BK + kk[None, :], w)
    tl.store(u_ptr + pid * t_pad * BDV + tok[:, None] * BDV + vv[None, :], u)
    tl.store(p_ptr + (pid * tl.num_programs(1) + chunk) * C * C + r * C + c, p)
    tl.store(gamma_ptr + pid * t_pad + tok, gamma)


@triton.jit
def chunk_pass_kernel(mixed_ptr, w_ptr, u_ptr, p_ptr, gamma_ptr, state_ptr, out_ptr, T, CHUNKS, v_heads, stride_mb,
                      stride_mt, stride_ob, stride_ot, q_scale, K_HEADS: tl.constexpr, DK: tl.constexpr,
                      DV: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
                      INTERPRET: tl.constexpr, EARLY: tl.constexpr):
    """One program per (row x value head, block of BV value dims): the (DK, BV) state tile through the chunks,
    the delta rule's outputs (before the gated norm) into ``out`` (b, t, hv dv), the last state into ``state``."""
    wait_for_previous_kernel(EARLY)
    pid, blk = tl.program_id(0), tl.program_id(1)
    row, head = pid // v_heads, pid % v_heads
    kh = head // (v_heads // K_HEADS)
    i = tl.arange(0, C)
    kk, vv = tl.arange(0, BK), blk * BV + tl.arange(0, BV)
    k_in, v_in = kk < DK, vv < DV
    s_off = pid * DK * DV + kk[:, None] * DV + vv[None, :]
    s = tl.load(state_ptr + s_off, mask=k_in[:, None] & v_in[None, :], other=0.0)
    t_pad = CHUNKS * C
    base = mixed_ptr + row * stride_mb
    for chunk in range(CHUNKS):
        tok = chunk * C + i
        inside = tok < T
        q = _unit_rows(base, tok, inside, stride_mt, kh * DK, kk, k_in) * q_scale
        k = _unit_rows(base, tok, inside, stride_mt, K_HEADS * DK + kh * DK, kk, k_in)
        w = tl.load(w_ptr + pid * t_pad * BK + tok[:, None] * BK + kk[None, :])
        u = tl.load(u_ptr + pid * t_pad * BDV + tok[:, None] * BDV + vv[None, :])
        p = tl.load(p_ptr + (pid * CHUNKS + chunk) * C * C + i[:, None] * C + i[None, :])
        gamma = tl.load(gamma_ptr + pid * t_pad + tok)
        last = tl.sum(tl.where(i == C - 1, gamma, 0.0), axis=0)  # Gamma at the chunk's end (later tokens: g = 0)
        delta = u - tl.dot(w, s, input_precision="ieee")
        o = tl.exp(gamma)[:, None] * tl.dot(q, s, input_precision="ieee") + tl.dot(p, delta, input_precision="ieee")
        tl.store(out_ptr + row * stride_ob + tok[:, None] * stride_ot + head * DV + vv[None, :],
                 round_to_output(o, out_ptr.dtype.element_ty, INTERPRET), mask=inside[:, None] & v_in[None, :])
        s = tl.exp(last) * s + tl.dot(tl.trans(k * tl.exp(last - gamma)[:, None]), delta, input_precision="ieee")
    tl.store(state_ptr + s_off, s, mask=k_in[:, None] & v_in[None, :])


def chunked_delta_rule(mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor, z: torch.Tensor, neg_a: torch.Tensor,
                       dt_bias: torch.Tensor, norm_weight: torch.Tensor, state: torch.Tensor, eps: float,
                       k_heads: int, valid: torch.Tensor | None = None, out: torch.Tensor | None = None,
                       chunk: int | None = None) -> torch.Tensor:
    """``reference.gated_delta_step`` over t tokens in chunks (no snapshots): mixed (b, t, 2 hk dk + hv dv) the
    convolved q | k | v, a / b (b, t, hv), z (b, t, hv dv), state (b, hv, dk, dv) float32 contiguous, advanced in
    place, ``valid`` (b, t) or None -> (b, t, hv dv) in mixed's dtype (into ``out`` if given); ``chunk``: tokens per
    chunk (a power of 2, >= 16), by default what the device's shared memory allows. Workspace: float32
    W, U (t rounded up to the chunk, by dk and dv) and P (chunk x chunk per chunk) per row and head."""
    rows, v_heads, dk, dv = state.shape
    t = mixed.shape[1]
    if not state.is_contiguous():
        raise ValueError("the recurrent state must be contiguous")
    mixed, a, b = (x if x.stride(-1) == 1 else x.contiguous() for x in (mixed, a, b))
    y = torch.empty(rows, t, v_heads * dv, dtype=mixed.dtype, device=mixed.device) if out is None else out
    keep = valid.to(torch.float32).contiguous() if valid is not None else state
    chunk = chunk or _device_chunk(mixed.device)
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"chunks of {chunk} tokens: want a power of 2, at least 16 (the matrix products' minimum)")
    chunks = triton.cdiv(t, chunk)
    bk, bdv = max(16, triton.next_power_of_2(dk)), max(16, triton.next_power_of_2(dv))
    bv = min(PASS_BLOCK_V, bdv)
    f32 = dict(dtype=torch.float32, device=mixed.device)
    w = torch.empty(rows * v_heads, chunks * chunk, bk, **f32)
    u = torch.empty(rows * v_heads, chunks * chunk, bdv, **f32)
    p = torch.empty(rows * v_heads, chunks, chunk, chunk, **f32)
    gamma = torch.empty(rows * v_heads, chunks * chunk, **f32)
    early = early_launch_args(mixed.device)
    q_scale = dk ** -0.5
    chunk_prep_kernel[(rows * v_heads, chunks)](
        mixed, a, b, neg_a, dt_bias, keep, w, u, p, gamma, t, v_heads, mixed.stride(0), mixed.stride(1), a.stride(0),
        a.stride(1), b.stride(0), b.stride(1), keep.stride(0) if valid is not None else 0, q_scale, K_HEADS=k_heads,
        DK=dk, DV=dv, BK=bk, BDV=bdv, C=chunk, HAS_VALID=valid is not None, num_warps=PREP_WARPS, num_stages=1,
        **early)
    chunk_pass_kernel[(rows * v_heads, triton.cdiv(dv, bv))](
        mixed, w, u, p, gamma, state, y, t, chunks, v_heads, mixed.stride(0), mixed.stride(1), y.stride(0),
        y.stride(1), q_scale, K_HEADS=k_heads, DK=dk, DV=dv, BK=bk, BDV=bdv, BV=bv, C=chunk,
        INTERPRET=triton_interpret(), num_warps=PASS_WARPS, num_stages=1, **early)
    return gated_norm(y, z, norm_weight, eps)
