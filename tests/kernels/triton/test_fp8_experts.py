"""The grouped FP8 expert kernel (kernels/triton/fp8_experts.py) on fresh random stacked prepacks, outputs poisoned
first: each (token, expert) pair gets the bits the FP8 GEMV gives that row with that expert's weight, and the
pure-torch definition's values; the op's argument checks."""

import pytest
import torch

import anyfp4.ops  # noqa: F401
from anyfp4.kernels.triton.fp8_experts import fp8_experts_gemv
from anyfp4.kernels.triton.fp8_linear import fp8_gemv
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from helpers import random_fp8


def stacked(experts, n, k, gated, device, gen):
    packs = []
    for _ in range(experts):
        gate = random_fp8(n, k, gen, True, "cpu")
        packs.append(prepack_fp8_gated(gate, random_fp8(n, k, gen, True, "cpu"), device) if gated
                     else prepack_fp8(gate, device))
    return packs, torch.stack([p.codes for p in packs]), torch.stack([p.scales for p in packs])


@pytest.mark.parametrize("gated, n, k, dtype", [(True, 24, 528, torch.bfloat16), (False, 40, 64, torch.float16)])
def test_pairs_get_the_gemv_bits_of_their_expert(device, gated, n, k, dtype):
    gen = torch.Generator().manual_seed(n + k)
    packs, codes, scales = stacked(4, n, k, gated, device, gen)
    x = torch.randn(2, k, generator=gen).to(device, dtype)
    ids = torch.tensor([3, 1, 1, 0, 3, 3], dtype=torch.int32, device=device)  # 3 pairs a row; expert 2 unpicked
    out = torch.full((6, n), float("nan"), dtype=dtype, device=device)
    got = fp8_experts_gemv(x, ids, codes, scales, packs[0].up_offset, n, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    for p, e in enumerate(ids.tolist()):
        assert torch.equal(got[p], fp8_gemv(x[p // 3:p // 3 + 1], packs[e], None)[0]), p
    ref = torch.ops.anyfp4.fp8_experts(x.cpu(), ids.cpu(), codes.cpu(), scales.cpu(), packs[0].up_offset, n, k)
    err = ((got.cpu().double() - ref.double()).norm() / ref.double().norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err


def test_the_op_refuses_what_does_not_fit():
    gen = torch.Generator().manual_seed(2)
    packs, codes, scales = stacked(2, 16, 32, True, "cpu", gen)
    op, x = torch.ops.anyfp4.fp8_experts, torch.randn(2, 32).bfloat16()
    with pytest.raises(ValueError, match=r"scales \(E, N_pad\) float32"):
        op(x, torch.zeros(2, dtype=torch.int32), codes, scales[:, :4], packs[0].up_offset, 16, 32)
    with pytest.raises(ValueError, match="do not hold 300 outputs"):
        op(x, torch.zeros(2, dtype=torch.int32), codes, scales, 0, 300, 32)
