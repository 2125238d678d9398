"""The ops' GPU dispatch (``nvfp4_on_gpu``, ``fp8_on_gpu``) run on the CPU with the CUDA kernel's host build in
place of the GPU launch (an sm_90 with 132 multiprocessors as far as the launch tables know): M buckets, bias,
gated, float32 partials and chunked prefill against the ops' CPU reference, and rows whose bits do not depend on
the other rows of the call."""

import functools
import pytest
import torch

import host_cuda
from anyfp4.formats.fp8 import quantize_fp8
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.kernels import device
from anyfp4.kernels.cuda import weight_mma
from anyfp4.ops.fp8 import fp8_on_cpu, fp8_on_gpu
from anyfp4.ops.nvfp4 import nvfp4_on_gpu, nvfp4_reference
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated
from mma_checks import nvfp4_weight, rel_err

pytestmark = pytest.mark.skipif(not host_cuda.available(), reason="needs a host C++ compiler (g++)")
N, K = 200, 1040


@pytest.fixture
def emulated_gpu(monkeypatch):
    monkeypatch.setattr(device, "device_arch", lambda index=None: (90, 132))
    monkeypatch.setattr(weight_mma, "device_arch", lambda index=None: (90, 132))
    monkeypatch.setattr(weight_mma, "enabled", lambda sm, dtype=None: True)
    monkeypatch.setattr(weight_mma, "nvfp4_mma_gemm", host_cuda.gemm("nvfp4"))
    monkeypatch.setattr(weight_mma, "fp8_mma_gemm", host_cuda.gemm("fp8"))
    monkeypatch.setattr(weight_mma, "nvfp4_mma_gemm_chunks", host_cuda.gemm_chunks("nvfp4"))
    monkeypatch.setattr(weight_mma, "fp8_mma_gemm_chunks", host_cuda.gemm_chunks("fp8"))


def layers(fmt, gen):
    """(plain, gated) prepacks, and the op under test / its CPU reference for (x, prepack, bias, partial)."""
    if fmt == "nvfp4":
        w, gate, up = (nvfp4_weight(N, K, gen, torch.tensor(2e-3), device="cpu") for _ in range(3))
        return (prepack_nvfp4(w), prepack_nvfp4_gated(gate, up),
                lambda x, p, b, partial=False: nvfp4_on_gpu(x, p, b, partial=partial),
                lambda x, p, b, partial=False: nvfp4_reference(x, p, b, partial=partial))
    w, gate, up = (quantize_fp8(torch.randn(N, K, generator=gen), per_channel=True) for _ in range(3))

    return (prepack_fp8(w), prepack_fp8_gated(gate, up),
            lambda x, p, b, partial=False: fp8_on_gpu(x, p, b, partial, 0),
            lambda x, p, b, partial=False: fp8_on_cpu(x, p, b, partial=partial))


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_gpu_dispatch_against_the_cpu_reference(emulated_gpu, fmt):
    gen = torch.Generator().manual_seed(31)
    p, pg, gpu, ref = layers(fmt, gen)
    bias = torch.randn(N, generator=gen).to(torch.bfloat16)
    for m in (1, 9, 32):
        x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
        assert rel_err(gpu(x, p, bias), ref(x, p, bias).double()) < 4e-3, m
        assert rel_err(gpu(x, pg, None), ref(x, pg, None).double()) < 8e-3, m
        share = gpu(x, p, None, partial=True)
        assert share.dtype == torch.float32 and rel_err(share, ref(x, p, None, partial=True).double()) < 1e-5, m


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_rows_keep_their_bits_whatever_the_call(emulated_gpu, monkeypatch, fmt):
    """Each row of an M-row call has the bits of a one-row call, up to M = 32 and, with ANYFP4_PREFILL=chunked,
    beyond (a chunk of 64 rows, eight n8 tiles, and one of 6): what speculative verification and two-GPU prompts rely
    on."""
    gen = torch.Generator().manual_seed(32)
    p, pg, gpu, ref = layers(fmt, gen)
    x = torch.randn(70, K, generator=gen).to(torch.bfloat16)
    # compared as float32 sums (the partial): a bf16 rounding would hide most differences in summation order
    singles = {i: gpu(x[i:i + 1], p, None, partial=True) for i in (0, 1, 8, 16, 31, 32, 69)}
    for m in (2, 9, 17, 32):
        y = gpu(x[:m], p, None, partial=True)
        assert all(torch.equal(y[i:i + 1], singles[i]) for i in singles if i < m), m
    monkeypatch.setenv("ANYFP4_PREFILL", "chunked")
    y = gpu(x, p, None, partial=True)
    assert all(torch.equal(y[i:i + 1], s) for i, s in singles.items())
    assert rel_err(gpu(x, p, None), ref(x, p, None).double()) < 4e-3
    assert rel_err(gpu(x, pg, None), ref(x, pg, None).double()) < 8e-3


def test_auto_prefill_counts_both_halves_of_a_gated_weight(emulated_gpu, monkeypatch):
    """ANYFP4_PREFILL=auto (the default) with the fused GEMM's size threshold above 64 rows at twice this test's
    weight: 70 rows of the gated weight (both halves) take the fused GEMM, of the plain weight dequantize + cuBLAS;
    decode-sized calls the decode kernel. (Both Triton paths are stood in for by the reference: on a machine with
    a GPU, CPU tensors do not run Triton kernels.)"""
    from anyfp4.dispatch import policy
    from anyfp4.kernels.triton import nvfp4_decode, nvfp4_dequant

    gen = torch.Generator().manual_seed(33)
    p, pg, gpu, ref = layers("nvfp4", gen)
    taken = []
    monkeypatch.setattr(nvfp4_decode, "nvfp4_fused_gemm", lambda x, w, *a, **kw: taken.append(("fused", w.gated))
                        or nvfp4_reference(x, w, None))
    monkeypatch.setattr(nvfp4_dequant, "nvfp4_prefill_gemm", lambda x, w, *a, **kw:
                        taken.append(("cublas", w.gated)) or nvfp4_reference(x, w, None))
    monkeypatch.delenv("ANYFP4_PREFILL", raising=False)
    monkeypatch.setattr(policy, "AUTO_FUSED_MIN_ELEMENTS", 2 * N * K)
    x = torch.randn(70, K, generator=gen).to(torch.bfloat16)
    gpu(x, pg, None)
    assert rel_err(gpu(x[:32], pg, None), ref(x[:32], pg, None).double()) < 8e-3  # the decode kernel (host build)
    gpu(x, p, None)
    assert taken == [("fused", True), ("cublas", False)]


@pytest.mark.parametrize("sm, sms", [(75, 40), (70, 80)], ids=["turing", "volta"])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_an_emulated_turing_or_volta_runs_its_own_variant(monkeypatch, fmt, sm, sms):
    """sm_75 (40 multiprocessors) and sm_70 (80, with CUDA 12's NVRTC): fp16 decode calls take the CUDA kernel's
    variant for that architecture (sm_75: two m16n8k8 mmas per product; sm_70: each quad pair's m8n8k4 products;
    both staging through registers; the host build with the defines its launch plans) and match the CPU reference,
    each row with the bits of a one-row call; bf16 activations are left to the Triton kernels."""
    from anyfp4.kernels.cuda import nvrtc

    monkeypatch.setattr(nvrtc, "available", lambda: True)
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 9))
    assert weight_mma.enabled(sm, torch.float16) and not weight_mma.enabled(sm, torch.bfloat16)
    assert not weight_mma.enabled(61, torch.float16) and weight_mma.enabled(80, torch.bfloat16)
    calls = []

    def emulated(kind):
        run = host_cuda.gemm(kind, sm=sm)
        return lambda *a, **kw: calls.append(kind) or run(*a, **kw)

    monkeypatch.setattr(device, "device_arch", lambda index=None: (sm, sms))
    monkeypatch.setattr(weight_mma, "device_arch", lambda index=None: (sm, sms))
    monkeypatch.setattr(weight_mma, "nvfp4_mma_gemm", emulated("nvfp4"))
    monkeypatch.setattr(weight_mma, "fp8_mma_gemm", emulated("fp8"))
    gen = torch.Generator().manual_seed(33)
    p, pg, gpu, ref = layers(fmt, gen)
    bias = torch.randn(N, generator=gen).to(torch.float16)
    x = torch.randn(32, K, generator=gen).to(torch.float16)
    singles = [gpu(x[i:i + 1], p, None, partial=True) for i in (0, 8)]
    for m in (1, 9, 32):
        assert rel_err(gpu(x[:m], p, bias), ref(x[:m], p, bias).double()) < 1e-3, m
        assert rel_err(gpu(x[:m], pg, None), ref(x[:m], pg, None).double()) < 2e-3, m
        y = gpu(x[:m], p, None, partial=True)
        assert all(torch.equal(y[i:i + 1], s) for i, s in zip((0, 8), singles) if i < m), m
    assert calls and set(calls) == {fmt}
    with pytest.raises(ValueError, match="bf16 activations on sm_80"):
        host_cuda.gemm(fmt, sm=sm)(x[:1].bfloat16(), p, None, MMAConfig())


def test_volta_with_cuda_13s_nvrtc_keeps_the_triton_kernels(monkeypatch):
    """CUDA 13's NVRTC no longer compiles for sm_70: auto falls back to the Triton kernels with a warning that names
    the fix (ANYFP4_NVRTC), ANYFP4_KERNELS=cuda refuses with it; Turing is not affected."""
    from anyfp4.kernels.cuda import nvrtc

    monkeypatch.setattr(nvrtc, "available", lambda: True)
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    monkeypatch.setattr(weight_mma, "_warn_once", functools.cache(weight_mma._warn_once.__wrapped__))
    with pytest.warns(RuntimeWarning, match="ANYFP4_NVRTC"):
        assert not weight_mma.enabled(70, torch.float16)
    assert weight_mma.enabled(75, torch.float16)
    monkeypatch.setenv("ANYFP4_KERNELS", "cuda")
    with pytest.raises(RuntimeError, match="NVRTC 13.0 no longer compiles for sm_70: point ANYFP4_NVRTC"):
        weight_mma.enabled(70, torch.float16)
