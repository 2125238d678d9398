"""The weighted sum of each token's k expert outputs (kernels/triton/weighted_slots.py, ``weighted_slots``) on fresh
random inputs, the output poisoned first: the float32 sum of the definition (the op on the CPU), a row's bits the same
alone as among other rows, and the op's refusals."""

import pytest
import torch

import anyfp4.ops  # noqa: F401
from anyfp4.kernels.triton.weighted_slots import BLOCK, weighted_slots


@pytest.mark.parametrize("k, hidden", [(8, BLOCK + 40), (2, 96), (1, 20)])  # two column blocks; top-2; one slot
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rows_match_the_definition(device, k, hidden, dtype):
    gen = torch.Generator().manual_seed(k * hidden)
    picked = torch.randn(5, k, hidden, generator=gen).to(device, dtype)
    weights = torch.rand(5, k, generator=gen).to(device)
    out = torch.full((5, hidden), float("nan"), device=device)
    got = weighted_slots(picked, weights, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    want = (picked.cpu().double() * weights.cpu().double()[..., None]).sum(1)
    assert ((got.cpu().double() - want).norm() / want.norm()).item() < 1e-6
    cpu = torch.ops.anyfp4.weighted_slots(picked.cpu(), weights.cpu())  # the op's CPU form: slot by slot
    assert ((cpu.double() - want).norm() / want.norm()).item() < 1e-6
    for r in (0, 3):
        assert torch.equal(weighted_slots(picked[r:r + 1], weights[r:r + 1]), got[r:r + 1]), r


def test_the_op_takes_strided_slots_and_refuses_what_does_not_fit(device):
    gen = torch.Generator().manual_seed(2)
    picked = torch.randn(3, 4, 64, generator=gen).to(device, torch.bfloat16)
    weights = torch.rand(3, 4, generator=gen).to(device)
    op = torch.ops.anyfp4.weighted_slots
    wide = torch.randn(3, 4, 128, generator=gen).to(device, torch.bfloat16)[..., ::2]  # hidden at stride 2
    assert torch.equal(op(wide, weights), op(wide.contiguous(), weights))
    with pytest.raises(ValueError, match=r"weights \(rows, k\) float32"):
        op(picked, weights.half())
    with pytest.raises(ValueError, match=r"picked must be \(rows, k, hidden\)"):
        op(picked[:, 0], weights)
    with pytest.raises(ValueError, match="with k >= 1"):
        op(picked[:, :0], weights[:, :0])
