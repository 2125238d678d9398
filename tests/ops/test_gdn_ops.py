"""The Gated DeltaNet ops (ops/gdn.py): torch.library's own checks (schema, fakes, in-place state), the result of
their pure-torch definitions, and a one-line error for shapes that disagree."""

import pytest
import torch
import torch.nn.functional as F

import anyfp4.ops  # noqa: F401
from anyfp4.kernels.gdn.reference import causal_conv, gated_delta_recurrent, gated_rms_norm


def gdn_inputs(t=3):
    gen = torch.Generator().manual_seed(40)
    q, k = (torch.randn(2, t, 2, 8, generator=gen) for _ in range(2))
    v = torch.randn(2, t, 4, 8, generator=gen)
    g = -F.softplus(torch.randn(2, t, 4, generator=gen))
    beta = torch.rand(2, t, 4, generator=gen)
    return q, k, v, g, beta, torch.randn(2, 4, 8, 8, generator=gen)


@pytest.mark.parametrize("chunk", [0, 2])
def test_gated_delta_op(chunk):
    q, k, v, g, beta, state = gdn_inputs()
    torch.library.opcheck(torch.ops.anyfp4.gated_delta, (q, k, v, g, beta, state.clone(), chunk))
    s1, s2 = state.clone(), state.clone()
    y = torch.ops.anyfp4.gated_delta(q, k, v, g, beta, s1, chunk)
    want = gated_delta_recurrent(q, k, v, g, beta, s2)
    assert torch.allclose(y, want, atol=1e-5) and torch.allclose(s1, s2, atol=1e-5)
    assert not torch.equal(s1, state)  # advanced in place
    with pytest.raises(ValueError, match="gated_delta: q .* disagree"):
        torch.ops.anyfp4.gated_delta(q, k[:, :2], v, g, beta, state, chunk)


def test_conv_and_norm_ops():
    gen = torch.Generator().manual_seed(41)
    x, w = torch.randn(2, 3, 6, generator=gen), torch.randn(6, 4, generator=gen)
    state = torch.randn(2, 6, 3, generator=gen)
    torch.library.opcheck(torch.ops.anyfp4.causal_conv, (x, w, state.clone(), None))
    s1, s2 = state.clone(), state.clone()
    y = torch.ops.anyfp4.causal_conv(x, w, s1, None)
    # Up to DECODE_ROWS tokens the CPU op runs the definition one token at a time (each token's bits those of a
    # decode step); over the whole sequence at once the definition's silu may round its vector lanes and scalar
    # tail differently, by the CPU's vector width.
    by_token = torch.cat([causal_conv(x[:, i:i + 1], w, s2) for i in range(x.shape[1])], 1)
    assert torch.equal(y, by_token) and torch.equal(s1, s2)
    assert torch.allclose(y, causal_conv(x, w, state.clone()), rtol=1e-6, atol=1e-6)
    z, nw = torch.randn(2, 3, 6, generator=gen), torch.randn(6, generator=gen)
    torch.library.opcheck(torch.ops.anyfp4.gated_rms_norm, (x, z, nw, 1e-6))
    assert torch.equal(torch.ops.anyfp4.gated_rms_norm(x, z, nw, 1e-6), gated_rms_norm(x, z, nw, 1e-6))
    with pytest.raises(ValueError, match="gated_rms_norm: x .* disagree"):
        torch.ops.anyfp4.gated_rms_norm(x, z[..., :5], nw, 1e-6)


def step_args(t=3, gen_seed=42):
    gen = torch.Generator().manual_seed(gen_seed)
    hk, hv, dk, dv = 2, 4, 8, 8
    return dict(mixed=torch.randn(2, t, 2 * hk * dk + hv * dv, generator=gen), a=torch.randn(2, t, hv, generator=gen),
                b=torch.randn(2, t, hv, generator=gen), z=torch.randn(2, t, hv * dv, generator=gen),
                neg_a=-torch.rand(hv, generator=gen), dt_bias=torch.randn(hv, generator=gen),
                norm_weight=torch.randn(dv, generator=gen), state=torch.randn(2, hv, dk, dv, generator=gen), eps=1e-6,
                k_heads=hk, valid=None, snapshots=None)


@pytest.mark.parametrize("bias", [False, True])
def test_conv_with_a_projection_op(bias):
    """causal_conv_proj: the convolution's outputs and state as causal_conv gives them, and the projection of h as
    its definition (F.linear in float32, rounded); a one-line error for a projection that does not fit."""
    gen = torch.Generator().manual_seed(43)
    x, w = torch.randn(2, 3, 6, generator=gen).bfloat16(), torch.randn(6, 4, generator=gen).bfloat16()
    state = torch.randn(2, 6, 3, generator=gen).bfloat16()
    h, pw = torch.randn(2, 3, 40, generator=gen).bfloat16(), torch.randn(10, 40, generator=gen).bfloat16()
    pb = torch.randn(10, generator=gen).bfloat16() if bias else None
    torch.library.opcheck(torch.ops.anyfp4.causal_conv_proj, (x, w, state.clone(), None, h, pw, pb))
    s1, s2 = state.clone(), state.clone()
    y, p = torch.ops.anyfp4.causal_conv_proj(x, w, s1, None, h, pw, pb)
    assert torch.equal(y, torch.ops.anyfp4.causal_conv(x, w, s2, None)) and torch.equal(s1, s2)
    want = F.linear(h.float(), pw.float(), None if pb is None else pb.float()).bfloat16()
    assert p.shape == (2, 3, 10) and torch.equal(p, want)
    with pytest.raises(ValueError, match="causal_conv_proj: h .* disagree"):
        torch.ops.anyfp4.causal_conv_proj(x, w, state, None, h, pw[:, :39], pb)
    with pytest.raises(ValueError, match="causal_conv: x .* disagree"):
        torch.ops.anyfp4.causal_conv_proj(x, w[:5], state, None, h, pw, pb)


def test_gated_delta_step_op_keeps_snapshots():
    """The op over t tokens with snapshots: opcheck, the last snapshot is the final state, each snapshot is the
    state a run over that prefix leaves, and snapshots too small for the step are refused by name."""
    args = step_args()
    snaps = torch.zeros(2, 4, 4, 8, 8)
    torch.library.opcheck(torch.ops.anyfp4.gated_delta_step, (), {**args, "state": args["state"].clone(),
                                                                  "snapshots": snaps.clone()})
    state = args["state"].clone()
    torch.ops.anyfp4.gated_delta_step(**{**args, "state": state, "snapshots": snaps})
    assert torch.equal(snaps[:, 2], state) and not snaps[:, 3].any()
    prefix = args["state"].clone()
    part = {k: args[k][:, :2] for k in ("mixed", "a", "b", "z")}
    torch.ops.anyfp4.gated_delta_step(**{**args, **part, "state": prefix})
    assert torch.equal(snaps[:, 1], prefix)
    with pytest.raises(ValueError, match=r"gated_delta_step: snapshots \(2, 2, 4, 8, 8\) .* do not hold 3 copies"):
        torch.ops.anyfp4.gated_delta_step(**{**args, "state": state, "snapshots": snaps[:, :2]})
    conv_snaps = torch.zeros(2, 3, 6, 3)
    x, w, cstate = torch.randn(2, 3, 6), torch.randn(6, 4), torch.randn(2, 6, 3)
    torch.ops.anyfp4.causal_conv(x, w, cstate, conv_snaps)
    assert torch.equal(conv_snaps[:, 2], cstate) and torch.equal(conv_snaps[:, 0, :, 2], x[:, 0])
