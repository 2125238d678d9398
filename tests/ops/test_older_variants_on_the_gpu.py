"""The CUDA kernel's sm_70 and sm_75 variants through the ops' GPU dispatch on this GPU, as a V100 (80
multiprocessors, CUDA 12's NVRTC) or a T4 (40) would take them: that architecture's dispatch and launch heuristics,
its variant of the source (sm_70: each quad pair's mma.sync m8n8k4; sm_75: two m16n8k8 per product) compiled for
this GPU, where both instructions are valid. fp16 activations, every M of the decode range on odd shapes."""

import pytest
import torch

from anyfp4.formats.fp8 import dequantize_fp8, quantize_fp8
from anyfp4.formats.nvfp4 import dequantize_nvfp4
from anyfp4.kernels import device
from anyfp4.kernels.cuda import nvrtc, weight_mma
from anyfp4.ops.fp8 import fp8_on_gpu
from anyfp4.ops.nvfp4 import nvfp4_on_gpu
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated
from mma_checks import nvfp4_weight, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not nvrtc.compiler_available(),
                                reason="needs a CUDA GPU and NVRTC")
N, K = 4120, 1536 + 16


@pytest.fixture
def older_gpu(monkeypatch, request):
    """This GPU dispatched as sm_``sm`` with ``sms`` multiprocessors (``ANYFP4_KERNELS=cuda``); yields the list of
    the architectures the CUDA kernel's launches were planned for."""
    sm, sms = request.param
    monkeypatch.setenv("ANYFP4_KERNELS", "cuda")
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 9))  # what a Volta user points ANYFP4_NVRTC at
    monkeypatch.setattr(device, "device_arch", lambda index=None: (sm, sms))
    monkeypatch.setattr(weight_mma, "device_arch", lambda index=None: (sm, sms))
    planned, plan = [], weight_mma.plan_launch

    def recording(*args, **kwargs):
        planned.append(kwargs["sm"])
        return plan(*args, **kwargs)

    monkeypatch.setattr(weight_mma, "plan_launch", recording)
    yield sm, planned


def layer(fmt, gen):
    """(plain prepack, gated prepack, float64 references of weight / gate / up, the op's GPU dispatch)."""
    if fmt == "nvfp4":
        w, gate, up = (nvfp4_weight(N, K, gen, torch.tensor(2e-3, device="cuda")) for _ in range(3))
        dense = [dequantize_nvfp4(t).double() for t in (w, gate, up)]
        return prepack_nvfp4(w), prepack_nvfp4_gated(gate, up), dense, nvfp4_on_gpu
    w, gate, up = (quantize_fp8(torch.randn(N, K, device="cuda", generator=gen), per_channel=pc)
                   for pc in (True, False, True))
    dense = [dequantize_fp8(t).double() for t in (w, gate, up)]
    return prepack_fp8(w), prepack_fp8_gated(gate, up), dense, lambda x, p, b, partial=False: fp8_on_gpu(
        x, p, b, partial, 0)


def poisoned_call(op, *args):
    """``op(*args)`` after NaN was left in the allocator's free blocks, so an output element it never writes shows."""
    torch.full((64 << 20,), float("nan"), device="cuda", dtype=torch.float16)
    return op(*args)


@pytest.mark.parametrize("older_gpu", [(70, 80), (75, 40)], ids=["volta", "turing"], indirect=True)
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_every_decode_m_against_the_reference_with_one_rows_bits(older_gpu, monkeypatch, fmt):
    sm, planned = older_gpu
    gen = torch.Generator(device="cuda").manual_seed(70 + sm)
    p, pg, (wd, gd, ud), op = layer(fmt, gen)
    bias = torch.randn(N, device="cuda", generator=gen).half()
    x = torch.randn(32, K, device="cuda", generator=gen).half()
    singles = [op(x[i:i + 1], p, None, True) for i in range(32)]
    for m in range(1, 33):
        rows = torch.randn(m, K, device="cuda", generator=gen).half()
        y = poisoned_call(op, rows, p, bias)
        assert not torch.isnan(y).any(), m
        assert rel_err(y, rows.double() @ wd.t() + bias.double()) < 5e-4, m
        assert torch.equal(y, op(rows, p, bias)), f"M = {m}: not the same bits run to run"
        yg = poisoned_call(op, rows, pg, None)
        gref = torch.nn.functional.silu(rows.double() @ gd.t()) * (rows.double() @ ud.t())
        assert rel_err(yg, gref) < 1e-3, m
        for pack in ("0", "1"):  # the activation block-pack is the Triton kernels' switch: no effect here
            monkeypatch.setenv("ANYFP4_ACT_PACK", pack)
            assert torch.equal(op(rows, p, bias), y), f"M = {m}: ANYFP4_ACT_PACK={pack} changed the bits"
        monkeypatch.delenv("ANYFP4_ACT_PACK")
        part = op(x[:m], p, None, True)
        assert all(torch.equal(part[i:i + 1], singles[i]) for i in range(m)), f"M = {m}: a row's bits moved"
    assert planned and set(planned) == {sm}
