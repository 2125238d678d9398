"""The CUDA decode kernel's grouped expert launch (``weight_mma.plan_experts_launch`` / ``experts_mma``, EXPERTS in
weight_mma.cu) on fresh random stacked prepacks, outputs poisoned first: each (token, expert) pair gets the bits the
kernel gives that row with that expert's prepack alone (same config), and the values of the pure-torch definition
(the op on the CPU); NVFP4 and FP8, gated and plain, fp16 and bf16. Run by the kernel's source on the CPU (host
build) and, on a GPU, by the kernel itself through the ops."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import anyfp4.ops  # noqa: F401
import host_cuda
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.dispatch.tuning import experts_mma_config
from anyfp4.kernels.cuda import nvrtc, weight_mma
from anyfp4.packing.fp8 import FP8Prepacked, prepack_fp8, prepack_fp8_gated
from anyfp4.packing.layout import K_ALIGN, round_up
from anyfp4.packing.nvfp4 import NVFP4Prepacked, prepack_nvfp4, prepack_nvfp4_gated
from helpers import random_fp8
from mma_checks import nvfp4_weight

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
host = pytest.mark.skipif(not host_cuda.available(), reason="needs a host C++ compiler (g++)")
IDS = [4, 0, 2, 2, 0, 1]  # three rows, two pairs each: repeats, expert 3 unpicked


def stacked(fmt, experts, n, k, gated, gen):
    """Per-expert prepacks and their stacks (codes, NVFP4 block scales or None, global / row scales)."""
    packs = []
    for e in range(experts):
        if fmt == "nvfp4":
            gs = torch.tensor(float(torch.rand(1, generator=gen)) * 1e-3 + 1e-4)  # gate x up within fp16 at K = 2048
            gate, up = nvfp4_weight(n, k, gen, gs, device="cpu"), nvfp4_weight(n, k, gen, gs, device="cpu")
            packs.append(prepack_nvfp4_gated(gate, up) if gated else prepack_nvfp4(gate))
        else:
            gate, up = random_fp8(n, k, gen, e % 2 == 0, "cpu"), random_fp8(n, k, gen, True, "cpu")
            packs.append(prepack_fp8_gated(gate, up) if gated else prepack_fp8(gate))
    codes = torch.stack([p.codes for p in packs])
    if fmt == "nvfp4":
        return packs, (codes, torch.stack([p.scales for p in packs]), torch.cat([p.global_scale for p in packs]))
    return packs, (codes, None, torch.stack([p.scales for p in packs]))


def expert(fmt, stacks, e, n, k, up_offset):
    """Expert e's prepack as views of the stacks (what the grouped launch reads)."""
    codes, block_scales, gscale = stacks
    if fmt == "nvfp4":
        return NVFP4Prepacked(codes[e], block_scales[e], gscale[e:e + 1], n, k, up_offset)
    return FP8Prepacked(codes[e], gscale[e], n, k, up_offset)


def reference(fmt, x, ids, stacks, up_offset, n, k):
    codes, block_scales, gscale = (t.cpu() if t is not None else None for t in stacks)
    if fmt == "nvfp4":
        return torch.ops.anyfp4.nvfp4_experts(x.cpu(), ids.cpu(), codes, block_scales, gscale, up_offset, n, k)
    return torch.ops.anyfp4.fp8_experts(x.cpu(), ids.cpu(), codes, gscale, up_offset, n, k)


def host_grouped(fmt, x, ids, stacks, up_offset, n, config, out):
    codes, block_scales, gscale = stacks
    plan = weight_mma.plan_experts_launch(fmt, x, ids, codes, block_scales, gscale, n, up_offset, config, out,
                                          stage_bytes=weight_mma.STAGE_BYTES)
    return host_cuda.run(plan)


def check_pairs(fmt, grouped, alone, dtype, n, k, gated, config, device):
    gen = torch.Generator().manual_seed(n + k + (fmt == "fp8"))
    packs, stacks = stacked(fmt, 5, n, k, gated, gen)
    stacks = tuple(t.to(device) if t is not None else None for t in stacks)
    up_offset = packs[0].up_offset
    x = torch.randn(3, k, generator=gen).to(device, dtype)
    ids = torch.tensor(IDS, dtype=torch.int32, device=device)
    out = torch.full((len(IDS), n), float("nan"), dtype=dtype, device=device)
    got = grouped(fmt, x, ids, stacks, up_offset, n, config, out)
    assert torch.isfinite(got).all()
    for p, e in enumerate(IDS):
        row = alone(x[p // 2:p // 2 + 1], expert(fmt, stacks, e, n, k, up_offset), None, config)
        assert torch.equal(got[p], row[0]), f"pair {p} (expert {e})"
    ref = reference(fmt, x, ids, stacks, up_offset, n, k).double()
    err = ((got.cpu().double() - ref).norm() / ref.norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err


@host
@pytest.mark.parametrize("gated, n, k", [(True, 40, 272), (False, 72, 768)])  # K tails; a partial last pass
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_the_source_gives_each_pair_its_expert_alone(fmt, dtype, gated, n, k):
    config = experts_mma_config(round_up(k, K_ALIGN), fmt)

    alone = host_cuda.gemm(fmt)

    def grouped(fmt, x, ids, stacks, up_offset, n, c, out):
        y = host_grouped(fmt, x, ids, stacks, up_offset, n, c, out)
        assert y.data_ptr() == out.data_ptr()
        return y

    check_pairs(fmt, grouped, alone, dtype, n, k, gated, config, "cpu")


@host
def test_k_warps_and_a_deep_ring_too():
    check_pairs("nvfp4", host_grouped, host_cuda.gemm("nvfp4"), torch.bfloat16, 40, 1024, True, MMAConfig(1, 4, 1, 8, 2), "cpu")


def test_the_plan_refuses_what_it_cannot_run():
    gen = torch.Generator().manual_seed(5)
    packs, (codes, scales, gscale) = stacked("nvfp4", 2, 16, 256, False, gen)
    x = torch.randn(2, 256, generator=gen).half()
    plan = weight_mma.plan_experts_launch
    kw = dict(stage_bytes=weight_mma.STAGE_BYTES)
    with pytest.raises(ValueError, match="no split-K"):
        plan("nvfp4", x, torch.zeros(2, dtype=torch.int32), codes, scales, gscale, 16, 0, MMAConfig(split_k=2), None,
             **kw)
    with pytest.raises(ValueError, match="a multiple of the 2 rows"):
        plan("nvfp4", x, torch.zeros(3, dtype=torch.int32), codes, scales, gscale, 16, 0, MMAConfig(), None, **kw)
    with pytest.raises(ValueError, match=r"out must be \(2, 16\)"):
        plan("nvfp4", x, torch.zeros(2, dtype=torch.int32), codes, scales, gscale, 16, 0, MMAConfig(),
             torch.empty(2, 17, dtype=torch.float16), **kw)


@pytest.mark.skipif(not nvrtc.compiler_available(), reason="needs NVRTC")
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_an_early_grouped_launch_compiles_and_waits_before_its_ids(fmt):
    """``ANYFP4_EXPERTS_EARLY``: the early variant compiles for sm_90, and its blocks wait for the kernel before
    (``griddepcontrol.wait``) before they read the ids (the source's order: the wait comes first)."""
    gen = torch.Generator().manual_seed(6)
    packs, (codes, scales, gscale) = stacked(fmt, 2, 16, 256, False, gen)
    x = torch.randn(1, 256, generator=gen).to(torch.bfloat16)
    plan = weight_mma.plan_experts_launch(fmt, x, torch.zeros(2, dtype=torch.int32), codes,
                                          scales if fmt == "nvfp4" else None, gscale, 16, 0,
                                          experts_mma_config(256, fmt), None, stage_bytes=weight_mma.STAGE_BYTES,
                                          sm=90, early=True)
    assert plan.defines["EARLY"] == 1 and plan.defines["EXPERTS"] == 1
    source = weight_mma.source_text()
    assert nvrtc.compile_cubin(source, weight_mma.KERNEL, 90, plan.defines)
    block = source[source.index("#if EXPERTS\n    {"):]
    assert block.index("griddepcontrol.wait") < block.index("ids + pair")


@pytest.mark.parametrize("fmt, k_pad", [("nvfp4", 2048), ("nvfp4", 768), ("nvfp4", 256), ("fp8", 768)])
def test_the_config_runs_every_shape_without_split_k(fmt, k_pad):
    c = experts_mma_config(k_pad, fmt)
    assert c.split_k == 1 and weight_mma.k_warps_refusal(c, k_pad // weight_mma.STEP_K[fmt]) is None


@gpu
@pytest.mark.parametrize("gated, n, k", [(True, 40, 272), (False, 72, 768), (True, 768, 2048)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("early", ["0", "1"])
def test_the_gpu_gives_each_pair_its_expert_alone(fmt, dtype, gated, n, k, early, monkeypatch):
    """Through the op (the policy's grouped launch; in stream order and, ``ANYFP4_EXPERTS_EARLY=1``, early) against
    the kernel's own launch of each pair alone."""
    if not weight_mma.enabled(torch.cuda.get_device_capability()[0] * 10, dtype):
        pytest.skip("the CUDA decode kernel does not serve this GPU")
    monkeypatch.setenv("ANYFP4_EXPERTS_EARLY", early)
    config = experts_mma_config(round_up(k, K_ALIGN), fmt)
    alone = weight_mma.nvfp4_mma_gemm if fmt == "nvfp4" else weight_mma.fp8_mma_gemm

    def grouped(fmt, x, ids, stacks, up_offset, n, c, out):
        codes, block_scales, gscale = stacks
        if fmt == "nvfp4":
            return torch.ops.anyfp4.nvfp4_experts(x, ids, codes, block_scales, gscale, up_offset, n, k)
        return torch.ops.anyfp4.fp8_experts(x, ids, codes, gscale, up_offset, n, k)

    check_pairs(fmt, grouped, alone, dtype, n, k, gated, config, "cuda")


@host
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="guard pages through Linux's mmap / mprotect")
@pytest.mark.parametrize("fmt, n, k, gated", [("nvfp4", 128, 128, True), ("fp8", 128, 128, True),
                                              ("fp8", 72, 768, False), ("nvfp4", 40, 272, False)])
@pytest.mark.parametrize("where", ["end", "start"])
def test_the_source_reads_nothing_past_its_tensors(fmt, n, k, gated, where):
    """Every input against a PROT_NONE page (support/guard_pages.py): the launch runs; routed to an expert past the
    stack, it dies — so the guard would catch a stray read."""
    script = Path(__file__).parents[2] / "support" / "guard_pages.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    args = [sys.executable, str(script), fmt, str(n), str(k), "1" if gated else "0", where, "8", "2", "2"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    if where == "end":
        stray = subprocess.run(args + ["8"], capture_output=True, text=True, env=env, timeout=600)
        assert stray.returncode == -signal.SIGSEGV, (stray.returncode, stray.stderr[-2000:])
