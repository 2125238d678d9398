"""The CUDA decode kernel's own source (kernels/cuda/weight_mma.cu) run on the CPU through a host build
(host_cuda.h: fibers for threads, the mma from its fragment layouts): NVFP4 and FP8, fp16 and bf16, every
launch family, split-K, gated, bias, float32 output, staging every pass, and the two-rank bits. The GPU tests
(test_weight_mma.py) check the same on the device itself."""

from dataclasses import replace

import pytest
import torch

import host_cuda
from anyfp4.kernels.cuda import weight_mma, weight_mma_geometry
from anyfp4.formats.fp8 import dequantize_fp8, quantize_fp8
from anyfp4.formats.nvfp4 import dequantize_nvfp4
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated
from anyfp4.dispatch.configs import MMAConfig
from mma_checks import CONFIGS, check_kernel, nvfp4_weight

pytestmark = pytest.mark.skipif(not host_cuda.available(), reason="needs a host C++ compiler (g++)")

N, K = 200, 1040  # neither a row tile nor a K tile multiple: padded rows and a K tail
# one case per launch family: (M, config); split-K 1..8, depth 2..8, MT 1, 2, 4, every n8-tile count
CASES = [(1, CONFIGS[0]), (7, CONFIGS[1]), (16, CONFIGS[2]), (32, CONFIGS[3]), (17, CONFIGS[4])]


def weights(fmt, gen):
    if fmt == "nvfp4":
        w, gate, up = (nvfp4_weight(N, K, gen, torch.tensor(2e-3), device="cpu") for _ in range(3))
        return prepack_nvfp4(w), prepack_nvfp4_gated(gate, up), [dequantize_nvfp4(t).double() for t in (w, gate, up)]
    w, gate, up = (quantize_fp8(torch.randn(N, K, generator=gen), per_channel=pc) for pc in (True, False, True))
    return prepack_fp8(w), prepack_fp8_gated(gate, up), [dequantize_fp8(t).double() for t in (w, gate, up)]


@pytest.mark.parametrize("tight", [False, True], ids=["staged-once", "staged-every-pass"])
@pytest.mark.parametrize("dtype, sm", [(torch.float16, 80), (torch.bfloat16, 80), (torch.float16, 75),
                                       (torch.float16, 70)], ids=["fp16", "bf16", "fp16-sm75", "fp16-sm70"])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_kernel_source_against_reference(fmt, dtype, sm, tight):
    """sm_75's variant (two m16n8k8 mmas per product, staging copies through registers) and sm_70's (each quad
    pair's m8n8k4 products over its k slots, the quad pairs' sums added and moved into the m16n8k16 C layout)
    pass the same checks."""
    gen = torch.Generator().manual_seed(21)
    p, pg, (wd, gd, ud) = weights(fmt, gen)
    bias = torch.randn(N, generator=gen).to(dtype)
    cases = [(m, c) for m, c in CASES if weight_mma.fits_arch(sm, c.mt, weight_mma.n_tiles_for(m), True)]
    assert len(cases) >= 4  # sm_70 leaves out only M = 17 with 4 m16 tiles a warp (192 sums a thread)
    check_kernel(host_cuda.gemm(fmt, tight, sm), p, pg, wd, gd, ud, bias, cases, gen)


def test_a_launch_too_large_for_sm70s_sums_is_refused():
    gen = torch.Generator().manual_seed(23)
    p = prepack_nvfp4(nvfp4_weight(64, 256, gen, torch.tensor(1e-3), device="cpu"))
    x = torch.randn(17, 256, generator=gen).to(torch.float16)
    with pytest.raises(ValueError, match="on sm_70 a launch of 4 m16 tiles per warp for 17 rows keeps more than 128"):
        host_cuda.gemm("nvfp4", sm=70)(x, p, None, MMAConfig(4, 2, 1, 2))


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_two_halves_of_k_add_up_to_the_whole_layers_bits(fmt):
    """Tensor parallelism's row-parallel exactness, from the source: the float32 sums of K's two halves, each
    with half the split, added, are the whole layer's float32 sums bit for bit; a column-parallel half of the
    rows has the whole layer's bits."""
    from anyfp4.parallel.sharding import shard_cols, shard_rows

    gen = torch.Generator().manual_seed(22)
    n, k, split = 256, 1024, 4
    w = (nvfp4_weight(n, k, gen, torch.tensor(1e-3), device="cpu") if fmt == "nvfp4"
         else quantize_fp8(torch.randn(n, k, generator=gen), per_channel=True))
    pack = prepack_nvfp4 if fmt == "nvfp4" else prepack_fp8
    run = host_cuda.gemm(fmt)
    full, top = pack(w), pack(shard_rows(w, 0, n // 2))
    left, right = pack(shard_cols(w, 0, k // 2)), pack(shard_cols(w, k // 2, k))
    for m in (1, 5):
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        whole = run(x, full, None, MMAConfig(split_k=split), out_dtype=torch.float32)
        halves = (run(x[:, : k // 2].contiguous(), left, None, MMAConfig(split_k=split // 2), out_dtype=torch.float32)
                  + run(x[:, k // 2:].contiguous(), right, None, MMAConfig(split_k=split // 2), out_dtype=torch.float32))
        assert torch.equal(halves, whole), m
        y = run(x, full, None, MMAConfig(split_k=split))
        assert torch.equal(run(x, top, None, MMAConfig(split_k=split)), y[:, : n // 2]), m


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_unaligned_activations_take_the_scalar_loads(fmt):
    """Rows that are not 16-byte aligned (a view one element in; for FP8 also K % 8 != 0) are staged element by
    element; the bits equal the 16-byte path's. The host build reports a misaligned 16-byte load as a fault."""
    gen = torch.Generator().manual_seed(23)
    p, _, (wd, _, _) = weights(fmt, gen)
    run = host_cuda.gemm(fmt)
    for m, cfg in CASES[:3]:
        x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
        shifted = torch.empty(m, K + 8, dtype=torch.bfloat16)
        shifted[:, 1:K + 1] = x
        assert shifted[:, 1:K + 1].data_ptr() % 16 != 0
        assert torch.equal(run(shifted[:, 1:K + 1], p, None, cfg), run(x, p, None, cfg)), (m, cfg)
    if fmt == "fp8":
        k = K - 4
        w = quantize_fp8(torch.randn(N, k, generator=gen), per_channel=True)
        x = torch.randn(5, k, generator=gen).to(torch.bfloat16)
        y = run(x, prepack_fp8(w), None, CONFIGS[1])
        ref = x.double() @ dequantize_fp8(w).double().t()
        assert ((y.double() - ref).norm() / ref.norm()).item() < 4e-3


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_k_warps_add_up_as_split_k_does(fmt):
    """K warps meet in shared memory and add their slices in split-K's order: split S / kw over kw K warps gives
    the bits of split S alone — plain and gated, one to four n8 tiles, staged once or every pass — and the
    reference's values with poisoned outputs."""
    gen = torch.Generator().manual_seed(24)
    n, k = 200, 1024  # 8 NVFP4 / 16 FP8 steps
    if fmt == "nvfp4":
        w, g, u = (nvfp4_weight(n, k, gen, torch.tensor(2e-3), device="cpu") for _ in range(3))
        p, pg, wd = prepack_nvfp4(w), prepack_nvfp4_gated(g, u), dequantize_nvfp4(w).double()
    else:
        w, g, u = (quantize_fp8(torch.randn(n, k, generator=gen), per_channel=True) for _ in range(3))
        p, pg, wd = prepack_fp8(w), prepack_fp8_gated(g, u), dequantize_fp8(w).double()
    run, tight = host_cuda.gemm(fmt), host_cuda.gemm(fmt, tight=True)
    for m, (slices, kw, warps, depth) in [(1, (8, 8, 8, 2)), (13, (4, 2, 4, 2)), (32, (2, 2, 2, 4)), (5, (8, 4, 8, 2))]:
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        alone, spread = MMAConfig(1, warps, slices, depth), MMAConfig(1, warps, slices // kw, depth, kw)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
        y = run(x, p, None, spread, out=out)
        ref = x.double() @ wd.t()
        assert ((y.double() - ref).norm() / ref.norm()).item() < 4e-3, (m, spread)
        sums = run(x, p, None, spread, out_dtype=torch.float32)  # the float32 sums: bf16 would hide their last bits
        assert torch.equal(sums, run(x, p, None, alone, out_dtype=torch.float32)), (m, spread)
        assert torch.equal(tight(x, p, None, spread, out_dtype=torch.float32), sums), (m, spread)
        assert torch.equal(run(x, pg, None, spread), run(x, pg, None, alone)), (m, spread)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_a_shared_ring_gives_the_register_rings_bits(fmt):
    """The ring of code words in shared memory (cp.async, one commit group a step) instead of registers: the same
    float32 sums bit for bit — every launch family, split-K, K warps, gated, staged once or every pass — and the
    reference's values with poisoned outputs."""
    gen = torch.Generator().manual_seed(31)
    p, pg, (wd, gd, ud) = weights(fmt, gen)
    run, tight = host_cuda.gemm(fmt), host_cuda.gemm(fmt, tight=True)
    ran = 0
    steps = p.codes.shape[1] * weight_mma.K_PER_WORD[fmt] // weight_mma.STEP_K[fmt]
    k_warps = [c for c in (MMAConfig(1, 4, 1, 2, 2), MMAConfig(1, 8, 1, 2, 8)) if not weight_mma.k_warps_refusal(c, steps)]
    for m, cfg in CASES + [(m, c) for m, c in zip((5, 9), k_warps)]:
        ring = replace(cfg, shared_ring=1)
        if weight_mma_geometry.least_shared_bytes(ring, m, True, fmt) > weight_mma.STAGE_BYTES:
            continue  # 32 rows staged beside 8 warps' rings of 8 steps: more than a block gets (refused)
        ran += 1
        x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
        sums = run(x, p, None, ring, out_dtype=torch.float32)  # the float32 sums: bf16 would hide their last bits
        assert torch.equal(sums, run(x, p, None, cfg, out_dtype=torch.float32)), (m, ring)
        assert torch.equal(tight(x, p, None, ring, out_dtype=torch.float32), sums), (m, ring)
        if cfg.mt * weight_mma.n_tiles_for(m) <= 2:
            gated = replace(ring, mt=1, depth=min(cfg.depth, 4))
            assert torch.equal(run(x, pg, None, gated), run(x, pg, None, replace(gated, shared_ring=0))), (m, gated)
    assert ran >= 5 and k_warps
    bias = torch.randn(N, generator=gen).to(torch.bfloat16)
    fits = [(m, replace(c, shared_ring=1)) for m, c in CASES
            if weight_mma_geometry.least_shared_bytes(replace(c, shared_ring=1), m, True, fmt) <= weight_mma.STAGE_BYTES]
    check_kernel(run, p, pg, wd, gd, ud, bias, fits, gen)


def test_a_shared_ring_needs_cp_async():
    gen = torch.Generator().manual_seed(32)
    p = prepack_nvfp4(nvfp4_weight(64, 256, gen, torch.tensor(1e-3), device="cpu"))
    x = torch.randn(1, 256, generator=gen).to(torch.float16)
    with pytest.raises(ValueError, match="a shared ring sm_80"):
        host_cuda.gemm("nvfp4", sm=75)(x, p, None, MMAConfig(1, 4, 1, 2, shared_ring=1))
    ring, plain = (weight_mma.plan_launch("nvfp4", x.to(torch.bfloat16), p.codes, p.scales, p.global_scale, None, 64,
                                          0, MMAConfig(1, 4, 1, 2, shared_ring=r), None, None, stage_bytes=65536,
                                          early=False, counters=None) for r in (1, 0))
    assert ring.defines["SHARED_RING"] == 1 and plain.defines["SHARED_RING"] == 0
    assert ring.shared_bytes == -(-plain.shared_bytes // 16) * 16 + 4 * 2 * 32 * 36  # 4 warps, 2 steps: 36 B a lane
