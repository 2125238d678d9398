"""The chunked Gated DeltaNet kernels (kernels/gdn/chunked.py) against the pure-torch definitions on fresh random
inputs, outputs poisoned first: Triton's CPU interpreter without a GPU (tiny sizes), natively with one. Prompts
shorter than a chunk, a chunk exactly, several with a short last one; odd head sizes (padded to the products'
16); left padding; a row's bits the same alone as in a batch, and a left-padded prompt's rows through the op as
alone."""

import pytest
import torch

from anyfp4.kernels.gdn import reference
from anyfp4.kernels.gdn.chunked import CHUNK, SHORT_CHUNK, chunked_delta_rule

from test_step_kernels import close, step_inputs


def reference_run(args, valid, chunk):
    """The definition's outputs and its state after the tokens: token by token (chunk 0) or in chunks."""
    state = args["state"].clone()
    out = reference.gated_delta_step(**{**args, "state": state}, valid=valid, chunk=chunk)
    return out, state


@pytest.mark.parametrize("dims, t, dtype, chunk", [
    ((2, 4, 8, 12), 37, torch.bfloat16, CHUNK),  # one short chunk; dk 8 and dv 12 padded to 16
    ((1, 2, 16, 80), CHUNK, torch.float16, CHUNK),  # exactly one chunk; dv 80: three value blocks
    ((1, 2, 32, 16), 2 * CHUNK + 5, torch.bfloat16, CHUNK),  # three chunks, the last of 5 tokens
    ((1, 2, 16, 16), 2 * SHORT_CHUNK + 7, torch.float16, SHORT_CHUNK),  # the chunks of GPUs short of shared memory
])
def test_matches_the_definitions(device, dims, t, dtype, chunk):
    hk, hv, dk, dv = dims
    gen = torch.Generator().manual_seed(hv * dk + dv + t)
    args = step_inputs(gen, device, dtype, t=t, hk=hk, hv=hv, dk=dk, dv=dv)
    valid = torch.ones(3, t, device=device)
    valid[1, : t // 3] = 0  # row 1 left-padded
    for v in (None, valid):
        want, want_state = reference_run(args, v, 0)
        chunked, chunked_state = reference_run(args, v, CHUNK)
        state = args["state"].clone()
        out = torch.full((3, t, hv * dv), float("nan"), dtype=dtype, device=device)
        got = chunked_delta_rule(**{**args, "state": state}, valid=v, out=out, chunk=chunk)
        assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
        assert close(state, want_state, 1e-5) and close(state, chunked_state, 1e-5)
        tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
        assert close(got, want, tol) and close(got, chunked, tol)
        if v is not None:  # row 1's padding neither decays nor writes: its state is that of its real tokens
            alone, alone_state = reference_run({**{k: (x[1:2, t // 3:] if k in ("mixed", "a", "b", "z") else x)
                                                   for k, x in args.items()}, "state": args["state"][1:2]}, None, 0)
            assert close(state[1:2], alone_state, 1e-5) and close(got[1:2, t // 3:], alone, tol)


def test_a_row_alone_has_its_bits_in_a_batch(device):
    gen = torch.Generator().manual_seed(3)
    args = step_inputs(gen, device, torch.bfloat16, b=3, t=CHUNK + 9, hk=1, hv=1, dk=16, dv=16)
    state = args["state"].clone()
    together = chunked_delta_rule(**{**args, "state": state})
    again_state = args["state"].clone()
    assert torch.equal(chunked_delta_rule(**{**args, "state": again_state}), together)  # run to run
    assert torch.equal(again_state, state)
    for r in (0, 2):
        one = {k: (v[r:r + 1].clone() if k in ("mixed", "a", "b", "z", "state") else v) for k, v in args.items()}
        alone = chunked_delta_rule(**one)
        assert torch.equal(alone, together[r:r + 1]) and torch.equal(one["state"], state[r:r + 1]), r


def test_a_long_decay_free_prompt_stays_finite(device):
    """No decay (g = 0) and full writes (beta -> 1) over many chunks: the triangular systems at their most
    ill-conditioned for unit keys; outputs finite and still the definition's. Chunk lengths not a power of 2 are
    refused."""
    gen = torch.Generator().manual_seed(4)
    args = step_inputs(gen, device, torch.float16, b=1, t=3 * CHUNK, hk=1, hv=1, dk=16, dv=16)
    args["a"] = torch.full_like(args["a"], -30.0)  # softplus(-30 + dt_bias) ~ 0: no decay
    args["b"] = torch.full_like(args["b"], 12.0)  # sigmoid(12) ~ 1
    args["dt_bias"] = torch.zeros_like(args["dt_bias"])
    want, want_state = reference_run(args, None, 0)
    state = args["state"].clone()
    got = chunked_delta_rule(**{**args, "state": state})
    assert torch.isfinite(got).all() and torch.isfinite(state).all()
    assert close(state, want_state, 1e-4) and close(got, want, 4e-3)
    with pytest.raises(ValueError, match="power of 2"):
        chunked_delta_rule(**{**args, "state": state}, chunk=48)


def test_a_left_padded_prompt_runs_each_row_as_alone(device, monkeypatch):
    """Through the op with ``ANYFP4_GDN_PREFILL=chunked``: each row of a left-padded prompt gives the outputs and
    state of the row alone — its chunks start at its own first token, not at the batch's first slot, and a row of
    at most DECODE_ROWS tokens runs token by token as it does alone; padding's outputs are zeros."""
    import anyfp4.ops  # noqa: F401  (registers the ops)
    from anyfp4.dispatch.limits import DECODE_ROWS
    from anyfp4.ops import gdn as gdn_ops

    monkeypatch.setenv("ANYFP4_GDN_PREFILL", "chunked")
    if device.type == "cpu":  # the interpreter: the paths a GPU takes
        monkeypatch.setattr(gdn_ops, "_gpu_path", lambda x, snapshots: "step" if x.shape[1] <= DECODE_ROWS or
                            snapshots is not None else "chunked")
    gen = torch.Generator().manual_seed(8)
    t = CHUNK + 9
    args = step_inputs(gen, device, torch.bfloat16, b=3, t=t, hk=1, hv=2, dk=16, dv=16)
    firsts = (0, 30, t - 9)  # rows of 73, 43 and 9 tokens
    valid = torch.ones(3, t, device=device)
    for r, first in enumerate(firsts):
        valid[r, :first] = 0
    order = ("mixed", "a", "b", "z", "neg_a", "dt_bias", "norm_weight", "state", "eps", "k_heads")
    state = args["state"].clone()
    out = torch.ops.anyfp4.gated_delta_step(*[state if k == "state" else args[k] for k in order], valid, None)
    for r, first in enumerate(firsts):
        one = {k: (v[r:r + 1, first:] if k in ("mixed", "a", "b", "z") else v) for k, v in args.items()}
        one["state"] = args["state"][r:r + 1].clone()
        alone = torch.ops.anyfp4.gated_delta_step(*[one[k] for k in order], torch.ones(1, t - first, device=device),
                                                  None)
        assert torch.equal(out[r:r + 1, first:], alone), r
        assert torch.equal(state[r:r + 1], one["state"]), r
        assert not out[r, :first].any(), r
