"""A mixture of experts' routing in one launch (kernels/triton/route_topk.py) on fresh random logits, outputs poisoned
first: the experts and weights of the definition (softmax, top-k, renormalized in rank order; the op on the CPU), ties
to the lower index, a row's results the same alone as among other rows, and the op's refusals."""

import pytest
import torch

import anyfp4.ops  # noqa: F401
from anyfp4.kernels.triton import route_topk as kernel
from anyfp4.ops.routing import route_reference


def poisoned_launch(monkeypatch, logits, k, normalize):
    """The launcher with its outputs filled with NaN / -1 before the kernel writes them."""
    real = torch.empty

    def empty(*shape, dtype=None, device=None):
        t = real(*shape, dtype=dtype, device=device)
        return t.fill_(float("nan") if t.is_floating_point() else -1)

    monkeypatch.setattr(kernel.torch, "empty", empty)
    try:
        return kernel.route_topk(logits, k, normalize)
    finally:
        monkeypatch.setattr(kernel.torch, "empty", real)


@pytest.mark.parametrize("experts, k", [(128, 8), (8, 2), (60, 4), (3, 3)])  # Qwen3 MoE, Mixtral, odd counts, k = E
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_get_the_experts_and_weights_of_the_definition(device, monkeypatch, experts, k, normalize, dtype):
    gen = torch.Generator().manual_seed(experts * 10 + k)
    logits = (torch.randn(5, experts, generator=gen) * 3).to(device, dtype)
    ids, weights = poisoned_launch(monkeypatch, logits, k, normalize)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32 and ids.shape == weights.shape == (5, k)
    want_ids, want_weights = route_reference(logits.cpu(), k, normalize)
    assert torch.equal(ids.cpu(), want_ids)
    torch.testing.assert_close(weights.cpu(), want_weights, rtol=4e-6, atol=1e-7)
    assert (weights[:, :-1] >= weights[:, 1:]).all()  # highest first
    if normalize:
        torch.testing.assert_close(weights.double().sum(1).cpu(), torch.ones(5, dtype=torch.float64))
    for r in (0, 4):
        alone = kernel.route_topk(logits[r:r + 1], k, normalize)
        assert torch.equal(alone[0], ids[r:r + 1]) and torch.equal(alone[1], weights[r:r + 1]), r


def test_ties_go_to_the_lower_expert(device):
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, -1.0]], device=device)
    ids, weights = kernel.route_topk(logits, 4, False)
    assert ids.tolist() == [[1, 3, 4, 2]]
    assert weights[0, 0] == weights[0, 1] == weights[0, 2] > weights[0, 3]


def test_non_finite_logits_pick_experts_of_the_row(device):
    """A row that overflowed (NaN, +inf or all -inf logits) gets ids within its experts — the expert kernels read
    them as addresses — and NaN weights, as the definition gives them."""
    logits = torch.randn(4, 6, device=device)
    logits[0, 2] = float("nan")
    logits[1, 4] = float("inf")
    logits[2] = float("-inf")
    logits[3, 1] = float("inf")
    logits[3, 5] = float("-inf")
    ids, weights = kernel.route_topk(logits, 3, True)
    assert ((ids >= 0) & (ids < 6)).all() and (ids.sort(1).values.diff(1) > 0).all(), ids
    assert torch.isnan(weights[:3]).all()  # one NaN or infinite logit makes the whole softmax NaN
    want = route_reference(logits.cpu(), 3, True)[1]
    assert torch.equal(torch.isnan(weights.cpu()), torch.isnan(want))


def test_the_op_takes_strided_logits_and_refuses_what_does_not_fit(device):
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(4, 32, generator=gen).to(device)
    op = torch.ops.anyfp4.route_topk
    strided = op(wide[:, ::2], 2, True)
    dense = op(wide[:, ::2].contiguous(), 2, True)
    assert torch.equal(strided[0], dense[0]) and torch.equal(strided[1], dense[1])
    with pytest.raises(ValueError, match="k = 17 must be 1..16"):
        op(wide[:, ::2], 17, True)
    with pytest.raises(ValueError, match=r"logits must be \(rows, experts\)"):
        op(wide[0], 2, True)
    with pytest.raises(ValueError, match="fp16 / bf16 / fp32"):
        op(wide.to(torch.int32), 2, True)
    assert op(wide[:0], 2, True)[0].shape == (0, 2)
