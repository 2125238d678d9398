"""The Gated DeltaNet step kernels (kernels/gdn/step.py) against their pure-torch definitions, on fresh random
inputs, outputs poisoned first: Triton's CPU interpreter without a GPU (tiny sizes), natively with one."""

import pytest
import torch

from anyfp4.kernels.gdn import reference
from anyfp4.kernels.gdn.step import conv_step, delta_step

DTYPES = [torch.bfloat16, torch.float16]


def close(a, b, tol):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item() < tol


def step_inputs(gen, device, dtype, b=3, hk=2, hv=4, dk=8, dv=12):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    ch = 2 * hk * dk + hv * dv
    return dict(mixed=rnd(b, 1, ch).to(dtype), a=rnd(b, 1, hv).to(dtype), b=rnd(b, 1, hv).to(dtype),
                z=rnd(b, 1, hv * dv).to(dtype), neg_a=-rnd(hv).abs() - 0.1, dt_bias=rnd(hv),
                norm_weight=(1 + 0.2 * rnd(dv)).to(dtype), state=rnd(b, hv, dk, dv, scale=0.5), eps=1e-6, k_heads=hk)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [4, 2])
def test_conv_step_matches_the_reference(device, dtype, width):
    gen = torch.Generator().manual_seed(width)
    b, ch = 3, 80
    x = torch.randn(b, 1, ch, generator=gen).to(device, dtype)
    w = torch.randn(ch, width, generator=gen).to(device, dtype)
    state = torch.randn(b, ch, width - 1, generator=gen).to(device, dtype)
    want_state = state.clone()
    want = reference.causal_conv(x, w, want_state)
    out = torch.full_like(x, float("nan"))
    got = conv_step(x, w, state, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(state, want_state)
    assert close(got, want, 1e-2 if dtype == torch.bfloat16 else 2e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", [(2, 4, 8, 12), (2, 2, 16, 16), (1, 3, 32, 8), (1, 2, 16, 80)])  # 80: three blocks
def test_delta_step_matches_the_reference(device, dtype, dims):
    hk, hv, dk, dv = dims
    gen = torch.Generator().manual_seed(hv * dk + dv)
    args = step_inputs(gen, device, dtype, hk=hk, hv=hv, dk=dk, dv=dv)
    for valid in (None, torch.tensor([1.0, 0.0, 1.0], device=device)):
        want_state = args["state"].clone()
        want = reference.gated_delta_step(**{**args, "state": want_state},
                                          valid=None if valid is None else valid[:, None])
        state = args["state"].clone()
        out = torch.full((3, 1, hv * dv), float("nan"), dtype=dtype, device=device)
        got = delta_step(**{**args, "state": state}, valid=valid, out=out)
        assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
        assert close(state, want_state, 1e-5) and close(got, want, 2e-2 if dtype == torch.bfloat16 else 4e-3)
        if valid is not None:  # a padded token leaves its row's state as it was
            assert torch.equal(state[1], args["state"][1])


def test_rows_alone_equal_rows_in_a_batch(device):
    gen = torch.Generator().manual_seed(11)
    args = step_inputs(gen, device, torch.bfloat16, b=4)
    state = args["state"].clone()
    together = delta_step(**{**args, "state": state})
    for r in range(4):
        one = {k: (v[r:r + 1].clone() if k in ("mixed", "a", "b", "z", "state") else v) for k, v in args.items()}
        alone = delta_step(**one)
        assert torch.equal(alone, together[r:r + 1]) and torch.equal(one["state"], state[r:r + 1]), r
