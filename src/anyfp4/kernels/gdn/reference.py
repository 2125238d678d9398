"""The Gated DeltaNet (GDN) token mixer of Qwen3.5-style hybrids in pure torch: the definitions its kernels are
tested against, and the CPU path.

Per value head, with a state S (key dim x value dim, float32), a decay a_t = exp(g_t) (g_t <= 0) and a write
strength beta_t in (0, 1), each token does

    S <- a_t S;   delta_t = beta_t (v_t - S^T k_t);   S <- S + k_t delta_t^T;   o_t = S^T q_t

with q and k L2-normalized and q also divided by sqrt(key dim). Several value heads share a key head (grouped
value attention: value head h reads key head h // (value heads / key heads)).

Two forms of the same recurrence: ``gated_delta_recurrent`` walks the tokens one by one (a decode step is one
token); ``gated_delta_chunked`` takes chunks of C tokens at once (prefill), with the delta rule inside a chunk
solved as one unit lower-triangular system:

    Gamma_i = g_1 + ... + g_i (within the chunk),  D_ij = exp(Gamma_i - Gamma_j) for j <= i
    (I + strictly_lower(diag(beta) D * K K^T)) Delta = diag(beta) (V - exp(Gamma) * K S0)
    O = exp(Gamma) * Q S0 + lower(D * Q K^T) Delta;   S_C = exp(Gamma_C) S0 + K^T (exp(Gamma_C - Gamma) * Delta)

Every exponent taken is of Gamma_i - Gamma_j with j <= i, or of Gamma_i, so none exceeds 1. The two forms agree to
float32 rounding, not bit for bit.

Also here: the causal depthwise convolution in front of the mixer, with its rolling state of the last kernel - 1
inputs, and the gated RMSNorm after it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # added to the squared norm before the square root, as the reference implementations do


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The sum over ``dim`` (kept, size 1) as a balanced tree of elementwise adds: the same order for every row
    however many there are (a CPU reduction over a short last dimension vectorizes across rows, and its bits then
    depend on the batch)."""
    while x.shape[dim] > 1:
        n = x.shape[dim]
        half = n // 2
        pair = x.narrow(dim, 0, half) + x.narrow(dim, half, half)
        x = torch.cat([pair, x.narrow(dim, 2 * half, 1)], dim) if n % 2 else pair
    return x


def per_row(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn`` (an elementwise transcendental function: exp, rsqrt, silu, ...) on each batch row of x alone: torch's
    CPU kernels compute a tensor's elements partly in vector lanes and partly in a scalar tail, with different
    bits, so the same value can round differently in a larger batch. Its CUDA kernels apply one per-element function
    whatever the size (vector loads only), so there x goes whole: no launch per row on the decode path."""
    if x.shape[0] == 1 or x.is_cuda:
        return fn(x)
    return torch.stack([fn(row) for row in x.unbind(0)])


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dimension, in float32."""
    xf = x.float()
    return xf * per_row(torch.rsqrt, tree_sum(xf * xf, -1) + L2_EPS)


def _heads(q, k, v, g, beta):
    """(b, t, hk, dk) q / k, (b, t, hv, dv) v, (b, t, hv) g / beta -> float32 per value head (b, hv, t, .), q and k
    normalized, q scaled by dk^-1/2."""
    hk, hv = k.shape[2], v.shape[2]
    if hv % hk:
        raise ValueError(f"{hv} value heads do not share {hk} key heads evenly")
    q, k = l2_normalize(q), l2_normalize(k)
    q = q * q.shape[-1] ** -0.5
    if hv != hk:
        q, k = (t.repeat_interleave(hv // hk, dim=2) for t in (q, k))
    return [t.float().transpose(1, 2) for t in (q, k, v, g, beta)]


def _per_head(q, k, v, g, beta, state: torch.Tensor):
    """Both forms' start: the state checked against the shapes; q, k, v, g, beta per value head (``_heads``) and
    a float32 output buffer (b, hv, t, dv)."""
    b, t, hv, dv = v.shape
    dk = k.shape[-1]
    if state.shape != (b, hv, dk, dv) or state.dtype != torch.float32:
        raise ValueError(f"the recurrent state must be ({b}, {hv}, {dk}, {dv}) float32, got {tuple(state.shape)} "
                         f"{state.dtype}")
    return (*_heads(q, k, v, g, beta), torch.empty(b, hv, t, dv, dtype=torch.float32, device=v.device))


def _finish(out: torch.Tensor, state: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Both forms' end: the final state into ``state``, the outputs (b, t, hv, dv) in ``dtype``."""
    state.copy_(s)
    return out.transpose(1, 2).to(dtype)


def gated_delta_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          state: torch.Tensor, snapshots: torch.Tensor | None = None) -> torch.Tensor:
    """Token by token: q, k (b, t, hk, dk), v (b, t, hv, dv), g, beta (b, t, hv) -> o (b, t, hv, dv) in v's dtype;
    ``state`` (b, hv, dk, dv) float32 is read and left as after the last token; ``snapshots`` (b, >= t, hv, dk, dv)
    receives the state after each token. Each batch row on its own (no matrix products across rows): a row's bits do
    not depend on the batch."""
    dtype, t = v.dtype, v.shape[1]
    q, k, v, g, beta, out = _per_head(q, k, v, g, beta, state)
    s = state.clone()
    decay = per_row(torch.exp, g)
    for i in range(t):
        s = s * decay[:, :, i, None, None]
        kt = k[:, :, i, :, None]  # (b, hv, dk, 1)
        delta = (v[:, :, i] - tree_sum(s * kt, -2)[:, :, 0]) * beta[:, :, i, None]
        s = s + kt * delta[:, :, None, :]
        out[:, :, i] = tree_sum(s * q[:, :, i, :, None], -2)[:, :, 0]
        if snapshots is not None:
            snapshots[:, i].copy_(s)
    return _finish(out, state, s, dtype)


def gated_delta_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        state: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Chunks of ``chunk`` tokens at once (the last one shorter): same arguments and result as
    ``gated_delta_recurrent``, to float32 rounding."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    dtype, t = v.dtype, v.shape[1]
    q, k, v, g, beta, out = _per_head(q, k, v, g, beta, state)
    s = state.clone()
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        qc, kc, vc, bc = q[:, :, c0:c1], k[:, :, c0:c1], v[:, :, c0:c1], beta[:, :, c0:c1]
        gamma = g[:, :, c0:c1].cumsum(-1)  # (b, hv, C)
        n = c1 - c0
        lower = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
        diff = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf"))
        decay = diff.exp()  # D_ij for j <= i, 0 above the diagonal
        a = (bc[..., None] * decay * (kc @ kc.transpose(-1, -2))).tril(-1)
        eye = torch.eye(n, dtype=torch.float32, device=v.device)
        rhs = bc[..., None] * (vc - gamma.exp()[..., None] * (kc @ s))
        delta = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        out[:, :, c0:c1] = gamma.exp()[..., None] * (qc @ s) + (decay * (qc @ kc.transpose(-1, -2))) @ delta
        last = gamma[..., -1:]  # (b, hv, 1)
        s = last.exp()[..., None] * s + kc.transpose(-1, -2) @ ((last - gamma).exp()[..., None] * delta)
    return _finish(out, state, s, dtype)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                snapshots: torch.Tensor | None = None) -> torch.Tensor:
    """The depthwise causal convolution over time, then silu: x (b, t, channels), weight (channels, kernel), and
    ``conv_state`` (b, channels, kernel - 1) the inputs before x (zeros at the start), left as the last kernel - 1
    inputs; ``snapshots`` (b, >= t, channels, kernel - 1) receives that state after each token. Sums in float32
    (taps in order), the result in x's dtype."""
    b, t, ch = x.shape
    width = weight.shape[-1]
    if weight.shape != (ch, width) or conv_state.shape != (b, ch, width - 1):
        raise ValueError(f"conv weight must be ({ch}, kernel) and its state ({b}, {ch}, kernel - 1); got "
                         f"{tuple(weight.shape)} and {tuple(conv_state.shape)}")
    seq = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=-1)  # (b, ch, width - 1 + t)
    conv_state.copy_(seq[..., seq.shape[-1] - (width - 1):])
    if snapshots is not None:
        for i in range(t):
            snapshots[:, i].copy_(seq[..., i + 1:i + width])
    sf, wf = seq.float(), weight.float()
    y = sf[..., 0:t] * wf[:, 0:1]  # (b, ch, t): taps added in order, elementwise (the same bits for any batch)
    for j in range(1, width):
        y = y + sf[..., j:j + t] * wf[:, j:j + 1]
    return per_row(F.silu, y).transpose(1, 2).to(x.dtype)


def gates(a: torch.Tensor, b: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor,
          valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The log decay g = -exp(A_log) * softplus(a + dt_bias) (``neg_a`` = -exp(A_log)) and the write strength
    beta = sigmoid(b), float32, from the a / b projections (b, t, hv); ``valid`` (b, t) 0 on left padding, where a
    token neither decays nor writes the state."""
    beta = per_row(torch.sigmoid, b.float())
    g = neg_a * per_row(F.softplus, a.float() + dt_bias)
    if valid is not None:
        beta, g = beta * valid[..., None], g * valid[..., None]
    return g, beta


def split_heads(mixed: torch.Tensor, k_heads: int, k_dim: int, v_heads: int, v_dim: int):
    """The convolved q | k | v (b, t, 2 hk dk + hv dv) -> q, k (b, t, hk, dk), v (b, t, hv, dv)."""
    b, t, _ = mixed.shape
    q, k, v = mixed.split([k_heads * k_dim, k_heads * k_dim, v_heads * v_dim], dim=-1)
    return q.reshape(b, t, k_heads, k_dim), k.reshape(b, t, k_heads, k_dim), v.reshape(b, t, v_heads, v_dim)


def gated_delta_step(mixed: torch.Tensor, a: torch.Tensor, b: torch.Tensor, z: torch.Tensor, neg_a: torch.Tensor,
                     dt_bias: torch.Tensor, norm_weight: torch.Tensor, state: torch.Tensor, eps: float, k_heads: int,
                     valid: torch.Tensor | None = None, snapshots: torch.Tensor | None = None,
                     chunk: int = 0) -> torch.Tensor:
    """The tokens after the convolution: mixed (b, t, 2 hk dk + hv dv), a / b (b, t, hv), z (b, t, hv dv) -> the
    gated RMSNorm of the delta rule's outputs (b, t, hv dv) in mixed's dtype; ``state`` (b, hv, dk, dv) float32
    advanced over the t tokens, one by one (``snapshots``: the state after each) or, with ``chunk`` > 0 and no
    snapshots, in chunks of that many."""
    bsz, t, _ = mixed.shape
    hv, dk, dv = state.shape[1:]
    q, k, v = split_heads(mixed, k_heads, dk, hv, dv)
    g, beta = gates(a, b, neg_a, dt_bias, valid)
    if chunk and snapshots is None:
        o = gated_delta_chunked(q, k, v, g, beta, state, chunk)
    else:
        o = gated_delta_recurrent(q, k, v, g, beta, state, snapshots)
    return gated_rms_norm(o, z.reshape(bsz, t, hv, dv), norm_weight, eps).reshape(bsz, t, hv * dv)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each head (last dimension) times ``weight``, rounded to x's dtype, then times silu(gate) in float32,
    rounded once more."""
    xf = x.float()
    normed = (xf * per_row(torch.rsqrt, tree_sum(xf * xf, -1) / xf.shape[-1] + eps)).to(x.dtype)
    return ((weight * normed).float() * per_row(F.silu, gate.float())).to(x.dtype)
