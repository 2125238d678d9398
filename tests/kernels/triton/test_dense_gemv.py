"""The small dense GEMV (kernels/triton/dense_gemv.py) against F.linear in float64, on fresh random inputs, outputs
poisoned first; rows alone give the bits they give in a batch. Triton's CPU interpreter without a GPU."""

import pytest
import torch
import torch.nn.functional as F

from anyfp4.kernels.triton.dense_gemv import dense_gemv


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k, bias", [(1, 64, 5120, False), (3, 30, 1000, True), (32, 7, 2048, False)])
def test_matches_f_linear(device, dtype, m, n, k, bias):
    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype) if bias else None
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    got = dense_gemv(x, w, b, out=out)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    assert ((got.double() - want).norm() / want.norm()).item() < (8e-3 if dtype == torch.bfloat16 else 2e-3)


def test_rows_alone_equal_rows_in_a_batch(device):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 5, 640, generator=gen).to(device, torch.bfloat16)
    w = torch.randn(48, 640, generator=gen).to(device, torch.bfloat16)
    together = dense_gemv(x, w)
    assert together.shape == (1, 5, 48)
    for r in range(5):
        assert torch.equal(dense_gemv(x[:, r:r + 1], w), together[:, r:r + 1]), r


def test_more_rows_than_a_launch_takes_run_in_slices(device, monkeypatch):
    """A call of more rows than one launch's grid holds runs in slices, every row written with its bits alone."""
    import anyfp4.kernels.triton.dense_gemv as module

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(7, 256, generator=gen).to(device, torch.bfloat16)
    w = torch.randn(6, 256, generator=gen).to(device, torch.bfloat16)
    whole = dense_gemv(x, w)
    monkeypatch.setattr(module, "GRID_ROWS", 3)
    out = torch.full((7, 6), float("nan"), dtype=torch.bfloat16, device=device)
    assert torch.equal(dense_gemv(x, w, out=out), whole) and torch.equal(out, whole)
