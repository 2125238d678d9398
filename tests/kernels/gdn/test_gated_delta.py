"""The Gated DeltaNet definitions (kernels/gdn/reference.py) on fresh random inputs: the token-by-token and chunked
forms against a float64 oracle written from the update rule, against each other, and against transformers' own
torch functions for Qwen3.5; the causal convolution streamed in pieces against one padded convolution; the gated
RMSNorm against its formula."""

import pytest
import torch
import torch.nn.functional as F

from anyfp4.kernels.gdn.reference import (causal_conv, gated_delta_chunked, gated_delta_recurrent, gated_rms_norm,
                                          l2_normalize)


def inputs(gen, b=2, t=9, hk=2, hv=4, dk=8, dv=16, dtype=torch.float32):
    q = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    k = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    v = torch.randn(b, t, hv, dv, generator=gen).to(dtype)
    g = -F.softplus(torch.randn(b, t, hv, generator=gen)) * 0.7  # log decays <= 0, some near 0, some far
    beta = torch.rand(b, t, hv, generator=gen)
    state = torch.randn(b, hv, dk, dv, generator=gen) * 0.3
    return q, k, v, g, beta, state


def oracle(q, k, v, g, beta, state):
    """The update rule per batch row, value head and token, in float64 with explicit vectors."""
    b, t, hk, dk = k.shape
    hv, dv = v.shape[2:]
    out = torch.zeros(b, t, hv, dv, dtype=torch.float64)
    s_all = state.double().clone()
    for r in range(b):
        for h in range(hv):
            s = s_all[r, h]
            kh = h // (hv // hk)
            for i in range(t):
                qi, ki = q[r, i, kh].double(), k[r, i, kh].double()
                qi = qi / torch.sqrt((qi * qi).sum() + 1e-6) / dk**0.5
                ki = ki / torch.sqrt((ki * ki).sum() + 1e-6)
                s = s * torch.exp(g[r, i, h].double())
                delta = beta[r, i, h].double() * (v[r, i, h].double() - s.t() @ ki)
                s = s + torch.outer(ki, delta)
                out[r, i, h] = s.t() @ qi
            s_all[r, h] = s
    return out, s_all


def close(a, b, tol):
    return ((a.double() - b.double()).norm() / b.double().norm()).item() < tol


@pytest.mark.parametrize("t, chunk", [(1, 64), (9, 4), (64, 16), (70, 64), (33, 1)])
def test_both_forms_follow_the_update_rule(t, chunk):
    gen = torch.Generator().manual_seed(t * 100 + chunk)
    q, k, v, g, beta, state = inputs(gen, t=t)
    want, want_state = oracle(q, k, v, g, beta, state)
    s1, s2 = state.clone(), state.clone()
    o1 = gated_delta_recurrent(q, k, v, g, beta, s1)
    o2 = gated_delta_chunked(q, k, v, g, beta, s2, chunk=chunk)
    for o, s in ((o1, s1), (o2, s2)):
        assert o.dtype == v.dtype and o.shape == v.shape
        assert close(o, want, 1e-5) and close(s, want_state, 1e-5)


def test_a_prefill_then_decode_steps_equal_one_pass():
    """Chunked prefill of the prompt, then token-by-token steps from its state: the outputs and the state of one
    recurrent pass over everything."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta, state = inputs(gen, t=40)
    whole_state = state.clone()
    whole = gated_delta_recurrent(q, k, v, g, beta, whole_state)
    s = state.clone()
    parts = [gated_delta_chunked(q[:, :37], k[:, :37], v[:, :37], g[:, :37], beta[:, :37], s, chunk=16)]
    for i in range(37, 40):
        sl = slice(i, i + 1)
        parts.append(gated_delta_recurrent(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], s))
    assert close(torch.cat(parts, 1), whole, 1e-5) and close(s, whole_state, 1e-5)


def test_a_decode_row_does_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(6)
    q, k, v, g, beta, state = inputs(gen, b=5, t=1, dtype=torch.bfloat16)
    s_all = state.clone()
    together = gated_delta_recurrent(q, k, v, g, beta, s_all)
    assert together.dtype == torch.bfloat16 and s_all.dtype == torch.float32
    assert gated_delta_chunked(q, k, v, g, beta, state.clone()).dtype == torch.bfloat16
    for r in range(5):
        s = state[r:r + 1].clone()
        alone = gated_delta_recurrent(q[r:r + 1], k[r:r + 1], v[r:r + 1], g[r:r + 1], beta[r:r + 1], s)
        assert torch.equal(alone, together[r:r + 1]) and torch.equal(s, s_all[r:r + 1]), r


def test_matches_transformers_qwen3_5_functions():
    """transformers' torch implementations of the same rule (Qwen3.5), from a zero and from a given state."""
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    gen = torch.Generator().manual_seed(7)
    q, k, v, g, beta, state = inputs(gen, t=50)
    # key heads repeated for the value heads that share them (older transformers take them so, newer ones
    # repeat them themselves)
    hq, hk = (t.repeat_interleave(v.shape[2] // k.shape[2], dim=2) for t in (q, k))
    for initial in (None, state):
        s = torch.zeros_like(state) if initial is None else initial.clone()
        mine = gated_delta_chunked(q, k, v, g, beta, s, chunk=16)
        theirs, their_state = hf.torch_chunk_gated_delta_rule(
            hq, hk, v, g=g, beta=beta, chunk_size=64, initial_state=initial, output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        assert close(mine, theirs, 1e-4) and close(s, their_state, 1e-4)
        one = slice(0, 1)
        s = torch.zeros_like(state) if initial is None else initial.clone()
        mine = gated_delta_recurrent(q[:, one], k[:, one], v[:, one], g[:, one], beta[:, one], s)
        theirs, their_state = hf.torch_recurrent_gated_delta_rule(
            hq[:, one], hk[:, one], v[:, one], g=g[:, one], beta=beta[:, one], initial_state=initial,
            output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert close(mine, theirs, 1e-5) and close(s, their_state, 1e-5)


def test_bad_state_names_its_shape():
    gen = torch.Generator().manual_seed(8)
    q, k, v, g, beta, state = inputs(gen)
    with pytest.raises(ValueError, match=r"recurrent state must be \(2, 4, 8, 16\) float32"):
        gated_delta_recurrent(q, k, v, g, beta, state[:, :2].clone())
    with pytest.raises(ValueError, match="float32"):
        gated_delta_chunked(q, k, v, g, beta, state.double())
    with pytest.raises(ValueError, match="value heads do not share"):
        gated_delta_recurrent(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3], state[:, :3].clone())


def test_causal_conv_streamed_equals_one_padded_pass():
    gen = torch.Generator().manual_seed(9)
    b, t, ch, width = 2, 12, 6, 4
    x = torch.randn(b, t, ch, generator=gen).to(torch.bfloat16)
    w = torch.randn(ch, width, generator=gen).to(torch.bfloat16)
    ref = F.silu(F.conv1d(x.double().transpose(1, 2), w.double()[:, None], padding=width - 1, groups=ch)[..., :t])
    state = torch.zeros(b, ch, width - 1, dtype=torch.bfloat16)
    pieces = [causal_conv(x[:, a:z], w, state) for a, z in ((0, 7), (7, 8), (8, 9), (9, 12))]
    y = torch.cat(pieces, 1)
    assert y.dtype == x.dtype
    assert close(y.transpose(1, 2), ref, 1e-2)
    assert torch.equal(state, x[:, -(width - 1):].transpose(1, 2))
    one = torch.zeros(b, ch, width - 1, dtype=torch.bfloat16)
    assert torch.equal(causal_conv(x, w, one), y)  # pieces and one pass round alike: float32 sums of the same terms


def test_gated_rms_norm_is_its_formula():
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(3, 5, 16, generator=gen).to(torch.bfloat16)
    z = torch.randn(3, 5, 16, generator=gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(16, generator=gen)).to(torch.bfloat16)
    xf = x.double()
    want = w.double() * xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * F.silu(z.double())
    got = gated_rms_norm(x, z, w, 1e-6)
    assert got.dtype == x.dtype and close(got, want, 1e-2)
    assert close(l2_normalize(x).norm(dim=-1), torch.ones(3, 5), 1e-5)
