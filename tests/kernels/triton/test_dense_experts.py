"""The grouped float expert kernel (kernels/triton/dense_experts.py) on fresh random stacked weights, outputs
poisoned first: each (token, expert) pair against the pure-torch definition (float32 products of its row and its
expert's weight), and a pair's bits the same whatever the other pairs."""

import pytest
import torch

import anyfp4.ops  # noqa: F401
from anyfp4.kernels.triton.dense_experts import dense_experts_gemv


@pytest.mark.parametrize("gated, n, k", [(True, 20, 528), (False, 36, 100)])  # K over and under one block
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_pairs_match_the_definition(device, gated, n, k, dtype):
    gen = torch.Generator().manual_seed(n + k)
    weights = (torch.randn(5, n * (2 if gated else 1), k, generator=gen) * k ** -0.5).to(device, dtype)
    x = torch.randn(3, k, generator=gen).to(device, dtype)
    ids = torch.tensor([4, 0, 2, 2, 0, 1], dtype=torch.int32, device=device)
    out = torch.full((6, n), float("nan"), dtype=dtype, device=device)
    got = dense_experts_gemv(x, ids, weights, gated, n, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    ref = torch.ops.anyfp4.dense_experts(x.cpu(), ids.cpu(), weights.cpu(), gated, n, k)
    err = ((got.cpu().double() - ref.double()).norm() / ref.double().norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err
    alone = dense_experts_gemv(x[2:3], ids[4:6], weights, gated, n)  # row 2's pairs by themselves
    assert torch.equal(alone, got[4:6])


def test_the_op_refuses_what_does_not_fit():
    op = torch.ops.anyfp4.dense_experts
    x, w = torch.randn(2, 16).bfloat16(), torch.randn(3, 8, 16).bfloat16()
    with pytest.raises(ValueError, match=r"weights must be \(E, 8, 16\) contiguous"):
        op(x, torch.zeros(2, dtype=torch.int32), w.transpose(1, 2).contiguous().transpose(1, 2), True, 4, 16)
    with pytest.raises(ValueError, match=r"weights must be \(E, 16, 16\)"):
        op(x, torch.zeros(2, dtype=torch.int32), w, True, 8, 16)
    with pytest.raises(ValueError, match="a multiple of the 2 rows"):
        op(x, torch.zeros(5, dtype=torch.int32), w, False, 8, 16)
