"""The Gated DeltaNet kernels (kernels/gdn/step.py) against their pure-torch definitions, on fresh random inputs,
outputs and snapshots poisoned first: Triton's CPU interpreter without a GPU (tiny sizes), natively with one. A
t-token call gives the bits of t one-token calls, and a batch row the bits it has alone."""

import pytest
import torch

from anyfp4.kernels.gdn import reference
from anyfp4.kernels.gdn.step import conv, delta_rule

DTYPES = [torch.bfloat16, torch.float16]


def close(a, b, tol):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item() < tol


def conv_inputs(gen, device, dtype, b=3, t=5, ch=80, width=4):
    x = torch.randn(b, t, ch, generator=gen).to(device, dtype)
    w = torch.randn(ch, width, generator=gen).to(device, dtype)
    state = torch.randn(b, ch, width - 1, generator=gen).to(device, dtype)
    return x, w, state


def step_inputs(gen, device, dtype, b=3, t=1, hk=2, hv=4, dk=8, dv=12):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    ch = 2 * hk * dk + hv * dv
    return dict(mixed=rnd(b, t, ch).to(dtype), a=rnd(b, t, hv).to(dtype), b=rnd(b, t, hv).to(dtype),
                z=rnd(b, t, hv * dv).to(dtype), neg_a=-rnd(hv).abs() - 0.1, dt_bias=rnd(hv),
                norm_weight=(1 + 0.2 * rnd(dv)).to(dtype), state=rnd(b, hv, dk, dv, scale=0.5), eps=1e-6, k_heads=hk)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width, t", [(4, 1), (4, 2), (4, 37), (2, 5)])
def test_conv_matches_the_reference(device, dtype, width, t):
    gen = torch.Generator().manual_seed(width * 100 + t)
    x, w, state = conv_inputs(gen, device, dtype, t=t, width=width)
    want_state, want_snaps = state.clone(), torch.zeros(3, t, 80, width - 1, dtype=dtype, device=device)
    want = reference.causal_conv(x, w, want_state, want_snaps)
    out = torch.full_like(x, float("nan"))
    snaps = torch.full((3, t + 2, 80, width - 1), float("nan"), dtype=dtype, device=device)
    got = conv(x, w, state, snaps, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(state, want_state)
    assert torch.equal(snaps[:, :t], want_snaps) and snaps[:, t:].isnan().all()  # exact copies; only t written
    assert close(got, want, 1e-2 if dtype == torch.bfloat16 else 2e-3)


def test_conv_over_t_tokens_is_t_one_token_calls(device):
    gen = torch.Generator().manual_seed(5)
    x, w, state = conv_inputs(gen, device, torch.bfloat16, t=20)
    one_state = state.clone()
    together = conv(x, w, state)
    alone = torch.cat([conv(x[:, i:i + 1], w, one_state) for i in range(20)], 1)
    assert torch.equal(together, alone) and torch.equal(state, one_state)


@pytest.mark.parametrize("t, bias", [(1, False), (3, True), (20, False)])
def test_conv_with_a_projection_gives_both_bits(device, t, bias):
    """The convolution's launch with a projection's programs: the convolution, its state and snapshots as without
    them, and the projection with dense_gemv's bits (its rows from the same helper, tiles and warps); outputs
    poisoned first."""
    from anyfp4.kernels.triton.dense_gemv import dense_gemv

    gen = torch.Generator().manual_seed(30 + t)
    x, w, state = conv_inputs(gen, device, torch.bfloat16, t=t)
    h = torch.randn(3, t, 1500, generator=gen).to(device, torch.bfloat16)  # K past one 1024-wide chunk
    pw = (torch.randn(9, 1500, generator=gen) * 0.03).to(device, torch.bfloat16)  # odd rows: a half-masked tile
    pb = torch.randn(9, generator=gen).to(device, torch.bfloat16) if bias else None
    alone_state = state.clone()
    alone_snaps = torch.full((3, t, 80, 3), float("nan"), dtype=torch.bfloat16, device=device)
    alone = conv(x, w, alone_state, alone_snaps)
    out = torch.full_like(x, float("nan"))
    snaps = torch.full((3, t, 80, 3), float("nan"), dtype=torch.bfloat16, device=device)
    got, proj = conv(x, w, state, snaps, out=out, proj=(h, pw, pb))
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, alone)
    assert torch.equal(state, alone_state) and torch.equal(snaps, alone_snaps)
    assert proj.shape == (3, t, 9) and torch.equal(proj, dense_gemv(h, pw, pb))
    want = torch.nn.functional.linear(h.double(), pw.double(), None if pb is None else pb.double())
    assert close(proj, want, 1e-2)
    with pytest.raises(ValueError, match="projection input"):
        conv(x, w, state, proj=(h[:, :1] if t > 1 else h[:2], pw, pb))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", [(2, 4, 8, 12), (2, 2, 16, 16), (1, 3, 32, 8), (1, 2, 16, 80)])  # 80: three blocks
@pytest.mark.parametrize("t", [1, 3])
def test_delta_rule_matches_the_reference(device, dtype, dims, t):
    hk, hv, dk, dv = dims
    gen = torch.Generator().manual_seed(hv * dk + dv + t)
    args = step_inputs(gen, device, dtype, t=t, hk=hk, hv=hv, dk=dk, dv=dv)
    for valid in (None, torch.tensor([[1.0] * t, [0.0] * t, [1.0] * t], device=device)):
        want_state = args["state"].clone()
        want_snaps = torch.zeros(3, t, hv, dk, dv, device=device)
        want = reference.gated_delta_step(**{**args, "state": want_state}, valid=valid, snapshots=want_snaps)
        state = args["state"].clone()
        out = torch.full((3, t, hv * dv), float("nan"), dtype=dtype, device=device)
        snaps = torch.full((3, t + 1, hv, dk, dv), float("nan"), device=device)
        got = delta_rule(**{**args, "state": state}, valid=valid, snapshots=snaps, out=out)
        assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all() and snaps[:, t:].isnan().all()
        assert close(state, want_state, 1e-5) and close(snaps[:, :t], want_snaps, 1e-5)
        assert torch.equal(snaps[:, t - 1], state)
        assert close(got, want, 2e-2 if dtype == torch.bfloat16 else 4e-3)
        if valid is not None:  # padded tokens leave their row's state as it was
            assert torch.equal(state[1], args["state"][1])


def test_delta_rule_over_t_tokens_is_t_one_token_calls(device):
    gen = torch.Generator().manual_seed(9)
    args = step_inputs(gen, device, torch.bfloat16, b=2, t=6)
    state = args["state"].clone()
    together = delta_rule(**{**args, "state": state})
    one_state = args["state"].clone()
    alone = torch.cat([delta_rule(**{**args, **{k: args[k][:, i:i + 1] for k in ("mixed", "a", "b", "z")},
                                     "state": one_state}) for i in range(6)], 1)
    assert torch.equal(together, alone) and torch.equal(state, one_state)


def test_rows_alone_equal_rows_in_a_batch(device):
    gen = torch.Generator().manual_seed(11)
    args = step_inputs(gen, device, torch.bfloat16, b=4, t=2)
    state = args["state"].clone()
    together = delta_rule(**{**args, "state": state})
    for r in range(4):
        one = {k: (v[r:r + 1].clone() if k in ("mixed", "a", "b", "z", "state") else v) for k, v in args.items()}
        alone = delta_rule(**one)
        assert torch.equal(alone, together[r:r + 1]) and torch.equal(one["state"], state[r:r + 1]), r
