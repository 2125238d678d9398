"""The CUDA decode kernel's warpgroup mmas (``MMAConfig.wgmma``, sm_90a): the activations staged in wgmma's K-major
layout and read by the tensor cores from shared memory, the decoded weight fragments given from registers. On the
CPU the host build runs it (``host_cuda.h`` computes each wgmma from the warpgroup's fragments and the shared memory
its descriptor names, as the PTX ISA lays that out); NVRTC compiles every variant for sm_90a; on an sm_90 GPU the
device runs it."""

from dataclasses import replace

import pytest
import torch

import host_cuda
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.formats.fp8 import dequantize_fp8, quantize_fp8
from anyfp4.formats.nvfp4 import dequantize_nvfp4
from anyfp4.kernels.cuda import nvrtc, weight_mma
from anyfp4.kernels.cuda.weight_mma_defines import source_defines
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated
from mma_checks import check_kernel, nvfp4_weight, rel_err

N, K = 200, 1040  # neither a row tile nor a K tile multiple: padded rows and a K tail
# (rows, config): n8 tiles 1, 2, 4 and 8; one and two warpgroups; two m16 tiles a warp; split-K; rings of 2 and 4
CASES = [(1, MMAConfig(1, 4, 1, 2, wgmma=1)), (7, MMAConfig(1, 8, 1, 4, wgmma=1)),
         (16, MMAConfig(2, 4, 3, 2, wgmma=1)), (32, MMAConfig(1, 8, 2, 2, wgmma=1)),
         (33, MMAConfig(1, 4, 1, 4, wgmma=2)), (64, MMAConfig(1, 8, 1, 2, wgmma=2))]
needs_host = pytest.mark.skipif(not host_cuda.available(), reason="needs a host C++ compiler (g++)")
needs_nvrtc = pytest.mark.skipif(not nvrtc.compiler_available(), reason="needs NVRTC")
needs_sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="needs an sm_90 GPU")


def layers(gen, fmt="nvfp4", device="cpu"):
    if fmt == "nvfp4":
        w, gate, up = (nvfp4_weight(N, K, gen, torch.tensor(2e-3), device=device) for _ in range(3))
        return prepack_nvfp4(w), prepack_nvfp4_gated(gate, up), [dequantize_nvfp4(t).double() for t in (w, gate, up)]
    w, gate, up = (quantize_fp8(torch.randn(N, K, generator=gen, device=device), per_channel=pc)
                   for pc in (True, False, True))
    return prepack_fp8(w), prepack_fp8_gated(gate, up), [dequantize_fp8(t).double() for t in (w, gate, up)]


@needs_host
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_warpgroup_mmas_give_the_mma_sync_sums(fmt, dtype):
    """The same float32 sums as the mma.sync launch of the same rows, ring and split, bit for bit (the host rounds
    each k16 product's exact sum once in both) — staged once or every pass, gated too — and the reference's values
    with poisoned outputs, bias, strided rows."""
    gen = torch.Generator().manual_seed(41)
    p, pg, (wd, gd, ud) = layers(gen, fmt)
    run, tight = host_cuda.gemm(fmt, sm=90), host_cuda.gemm(fmt, tight=True, sm=90)
    for m, cfg in CASES:
        x = torch.randn(m, K, generator=gen).to(dtype)
        sums = run(x, p, None, cfg, out_dtype=torch.float32)
        assert torch.equal(sums, run(x, p, None, replace(cfg, wgmma=0), out_dtype=torch.float32)), (m, cfg)
        assert torch.equal(tight(x, p, None, cfg, out_dtype=torch.float32), sums), (m, cfg)
        if m <= 32:
            assert torch.equal(run(x, pg, None, cfg), run(x, pg, None, replace(cfg, wgmma=0))), (m, cfg)
    bias = torch.randn(N, generator=gen).to(dtype)
    check_kernel(run, p, pg, wd, gd, ud, bias, CASES[:4], gen)


@needs_host
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_a_rows_sums_do_not_depend_on_the_other_rows(fmt):
    """Rows 0..M-1 of a wgmma launch (B operands of 8 to 64 columns) have the bits of the same rows alone."""
    gen = torch.Generator().manual_seed(42)
    p, _, _ = layers(gen, fmt)
    run = host_cuda.gemm(fmt, sm=90)
    x = torch.randn(64, K, generator=gen).to(torch.bfloat16)
    cfg = MMAConfig(1, 8, 2, 2, wgmma=1)
    alone = {i: run(x[i:i + 1], p, None, cfg, out_dtype=torch.float32) for i in (0, 9, 40, 63)}
    for m in (16, 33, 64):
        y = run(x[:m], p, None, cfg, out_dtype=torch.float32)
        assert all(torch.equal(y[i:i + 1], s) for i, s in alone.items() if i < m), m


@pytest.mark.parametrize("sm, fmt, cfg, match", [
    (80, "nvfp4", MMAConfig(1, 4, 1, 2, wgmma=1), "on sm_90"),
    (90, "nvfp4", MMAConfig(1, 8, 1, 2, kw=2, wgmma=1), "one K warp"),
    (90, "nvfp4", MMAConfig(1, 2, 1, 2, wgmma=1), "whole warpgroups"),
    (90, "nvfp4", MMAConfig(1, 4, 1, 2, shared_ring=1, wgmma=1), "register ring"),
    (90, "nvfp4", MMAConfig(1, 4, 1, 2, wgmma=3), "wgmma is 0"),
    (90, "nvfp4", MMAConfig(1, 8, 2, 2, wgmma=2), "wgmma 2"),
])
def test_warpgroup_mmas_are_refused_where_they_cannot_run(sm, fmt, cfg, match):
    gen = torch.Generator().manual_seed(43)
    x = torch.randn(4, 256, generator=gen).to(torch.bfloat16)
    codes = torch.zeros(128, 32 if fmt == "nvfp4" else 64, dtype=torch.int32)
    scales = torch.zeros(128, 16, dtype=torch.uint8) if fmt == "nvfp4" else None
    with pytest.raises(ValueError, match=match):
        weight_mma.plan_launch(fmt, x, codes, scales, torch.ones(1 if fmt == "nvfp4" else 128), None, 128, 0, cfg,
                               None, None, stage_bytes=65536, early=False, counters=None, sm=sm)


def test_the_staged_bytes_of_a_warpgroup_launch():
    """The B operand's rows (8 per n8 tile, unpadded) x the round's k, bf16 / fp16: what the kernel's wgmma_word
    addresses."""
    x = torch.randn(20, 1024).to(torch.bfloat16)
    codes, scales = torch.zeros(128, 128, dtype=torch.int32), torch.zeros(128, 64, dtype=torch.uint8)
    plan = weight_mma.plan_launch("nvfp4", x, codes, scales, torch.ones(1), None, 128, 0,
                                  MMAConfig(1, 4, 1, 2, wgmma=1), None, None, stage_bytes=65536, early=False,
                                  counters=None, sm=90)
    kc = plan.args[-6]  # the round's k (the last of the launch's integers before the expert ones)
    assert plan.defines["WGMMA"] == 1 and plan.defines["NT"] == 4 and kc == 1024
    assert plan.shared_bytes == 32 * kc * 2


@needs_nvrtc
@pytest.mark.parametrize("gated", [0, 1])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_every_warpgroup_variant_compiles_for_sm90a(fmt, gated):
    """n8 tiles 1, 2, 4, 8, bf16 and fp16, one and two m16 tiles a warp, waited for each step or a step later:
    compiled for sm_90a, no spills (but a gated launch of eight n8 tiles)."""
    import re

    src = weight_mma.source_text()
    for nt, mt, bf16, wgmma in ((1, 1, 1, 1), (2, 2, 0, 2), (4, 1, 1, 2), (8, 1, 0, 1)):
        defines = dict(source_defines(fmt, "bf16" if bf16 else "fp16"), FP8=int(fmt == "fp8"), NT=nt, MT=mt, WARPS=8,
                       DEPTH=2, BF16=bf16, GATED=gated, HAS_BIAS=1 - gated, OUT_F32=0, EARLY=1, VEC_X=1, SPLIT=2, KW=1,
                       SHARED_RING=0, WGMMA=wgmma, **weight_mma.arch_defines(90))
        log = nvrtc.ptxas_report(src, weight_mma.KERNEL, 90, defines)
        assert "for 'sm_90a'" in log and re.search(r"Used \d+ registers", log), log[-2000:]
        assert "0 bytes spill stores" in log or (gated and nt == 8), (nt, mt, bf16, log[-2000:])


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_warpgroup_mmas_on_the_gpu(fmt, dtype):
    """On the device: the reference's values, every output written, and the mma.sync launch's float32 sums bit for
    bit (if the hardware's warpgroup mma sums a k16 product otherwise, this is where it shows), bf16 and fp16."""
    from anyfp4.kernels.cuda import counters

    gen = torch.Generator(device="cuda").manual_seed(44)
    p, pg, (wd, gd, ud) = layers(gen, fmt, device="cuda")
    gemm = weight_mma.nvfp4_mma_gemm if fmt == "nvfp4" else weight_mma.fp8_mma_gemm
    counters.reserve_counters(torch.device("cuda"))
    for m, cfg in CASES:
        x = torch.randn(m, K, device="cuda", generator=gen).to(dtype)
        out = torch.full((m, N), float("nan"), dtype=dtype, device="cuda")
        y = gemm(x, p, None, cfg, out=out)
        assert not y.isnan().any() and rel_err(y, x.double() @ wd.t()) < 4e-3, (m, cfg)
        sums = gemm(x, p, None, cfg, out_dtype=torch.float32)
        assert torch.equal(sums, gemm(x, p, None, replace(cfg, wgmma=0), out_dtype=torch.float32)), (m, cfg)
        if m <= 32:
            g = gemm(x, pg, None, cfg)
            ref = torch.nn.functional.silu(x.double() @ gd.t()) * (x.double() @ ud.t())
            assert rel_err(g, ref) < 8e-3, (m, cfg)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [5, 8, 16, 32])
def test_warpgroup_split_k_slices_of_an_odd_step_count_on_the_gpu(m, dtype):
    """Slices of seven steps (K = 14336 in 16 split-K blocks, as Llama's down projection runs): a partial pass at the
    end of every slice, where wgmma 2 gave NaN sums on an H100. The launch table's wgmma 1 configs: mma.sync's sums,
    the same twice, and the last row's sums those of the row alone."""
    gen = torch.Generator(device="cuda").manual_seed(45)
    p = prepack_nvfp4(nvfp4_weight(256, 14336, gen, torch.tensor(2e-3), device="cuda"))
    x = torch.randn(m, 14336, device="cuda", generator=gen).to(dtype)
    for cfg in (MMAConfig(2, 8, 16, 2, wgmma=1), MMAConfig(1, 8, 16, 4, wgmma=1)):
        sums = weight_mma.nvfp4_mma_gemm(x, p, None, cfg, out_dtype=torch.float32)
        assert not sums.isnan().any(), cfg
        assert torch.equal(sums, weight_mma.nvfp4_mma_gemm(x, p, None, cfg, out_dtype=torch.float32)), cfg
        assert torch.equal(sums, weight_mma.nvfp4_mma_gemm(x, p, None, replace(cfg, wgmma=0),
                                                           out_dtype=torch.float32)), cfg
        alone = weight_mma.nvfp4_mma_gemm(x[-1:], p, None, replace(cfg, wgmma=0), out_dtype=torch.float32)
        assert torch.equal(sums[-1:], alone), cfg


def test_warpgroup_mmas_are_refused_by_an_nvrtc_without_sm90a(monkeypatch):
    """CUDA 11.8's NVRTC (torch's cu118 wheels) cannot compile for sm_90a: a wgmma config is refused in one line."""
    monkeypatch.setattr(nvrtc, "compiler_available", lambda: True)
    monkeypatch.setattr(nvrtc, "version", lambda: (11, 8))
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    codes, scales = torch.zeros(128, 32, dtype=torch.int32), torch.zeros(128, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="NVRTC 11.8 lacks"):
        weight_mma.plan_launch("nvfp4", x, codes, scales, torch.ones(1), None, 128, 0, MMAConfig(1, 4, 1, 2, wgmma=1),
                               None, None, stage_bytes=65536, early=False, counters=None, sm=90)
