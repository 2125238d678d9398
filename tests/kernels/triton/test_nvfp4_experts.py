"""The grouped NVFP4 expert kernel (kernels/triton/nvfp4_experts.py) on fresh random stacked prepacks, outputs
poisoned first: each (token, expert) pair gets the bits the single-row GEMV gives that row with that expert's
weight (same tile sums, no split-K), and the pure-torch definition's values; the op's argument checks."""

import pytest
import torch

import anyfp4.ops  # noqa: F401
from anyfp4.bench.random_weights import random_nvfp4
from anyfp4.dispatch.configs import DecodeConfig
from anyfp4.kernels.triton.nvfp4_experts import BLOCK_K, nvfp4_experts_gemv
from anyfp4.kernels.triton.nvfp4_gemv import nvfp4_gemv
from anyfp4.packing.nvfp4 import NVFP4Prepacked, prepack_nvfp4, prepack_nvfp4_gated


def stacked(experts: int, n: int, k: int, gated: bool, device, gen):
    packs = []
    for _ in range(experts):
        gate = random_nvfp4(n, k, "cpu", gen, global_scale=float(torch.rand(1, generator=gen)) * 1e-2 + 1e-3)
        if gated:
            up = random_nvfp4(n, k, "cpu", gen, global_scale=float(gate.global_scale))
            packs.append(prepack_nvfp4_gated(gate, up, device))
        else:
            packs.append(prepack_nvfp4(gate, device))
    return (packs, torch.stack([p.codes for p in packs]), torch.stack([p.scales for p in packs]),
            torch.cat([p.global_scale for p in packs]))


@pytest.mark.parametrize("gated, n, k, dtype", [(True, 40, 272, torch.bfloat16),  # odd N, K not a multiple of 256
                                                 (False, 72, 48, torch.float16)])
def test_pairs_get_the_gemv_bits_of_their_expert(device, gated, n, k, dtype):
    gen = torch.Generator().manual_seed(n + k)
    packs, codes, scales, global_scales = stacked(5, n, k, gated, device, gen)
    rows, per_row = 3, 2
    x = torch.randn(rows, k, generator=gen).to(device, dtype)
    ids = torch.tensor([4, 0, 2, 2, 0, 1], dtype=torch.int32, device=device)  # repeats; expert 3 unpicked
    out = torch.full((rows * per_row, n), float("nan"), dtype=dtype, device=device)
    got = nvfp4_experts_gemv(x, ids, codes, scales, global_scales, packs[0].up_offset, n, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    one_row = DecodeConfig(block_n=8, block_k=BLOCK_K, split_k=1, num_warps=2, num_stages=1)
    for p, e in enumerate(ids.tolist()):
        alone = nvfp4_gemv(x[p // per_row:p // per_row + 1], packs[e], None, one_row)
        assert torch.equal(got[p], alone[0]), p
    ref = torch.ops.anyfp4.nvfp4_experts(x.cpu(), ids.cpu(), codes.cpu(), scales.cpu(), global_scales.cpu(),
                                         packs[0].up_offset, n, k)
    err = ((got.cpu().double() - ref.double()).norm() / ref.double().norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err


def test_the_op_refuses_what_does_not_fit():
    gen = torch.Generator().manual_seed(1)
    packs, codes, scales, global_scales = stacked(2, 16, 32, True, "cpu", gen)
    x = torch.randn(2, 32).bfloat16()
    op = torch.ops.anyfp4.nvfp4_experts
    with pytest.raises(ValueError, match="a multiple of the 2 rows"):
        op(x, torch.zeros(3, dtype=torch.int32), codes, scales, global_scales, packs[0].up_offset, 16, 32)
    with pytest.raises(ValueError, match="int32"):
        op(x, torch.zeros(2, dtype=torch.int64), codes, scales, global_scales, packs[0].up_offset, 16, 32)
    with pytest.raises(ValueError, match=r"x must be \(rows, 48\)"):
        op(x, torch.zeros(2, dtype=torch.int32), codes, scales, global_scales, packs[0].up_offset, 16, 48)
    with pytest.raises(ValueError, match="global scales"):
        op(x, torch.zeros(2, dtype=torch.int32), codes, scales, global_scales[:1], packs[0].up_offset, 16, 32)
    assert isinstance(packs[0], NVFP4Prepacked)
