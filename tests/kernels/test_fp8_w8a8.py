"""The opt-in W8A8 prefill of FP8 layers (kernels/fp8_w8a8.py, ``ANYFP4_FP8_PREFILL=w8a8``): the raw-weight kernel
bit for bit, the ops against an independent W8A8 reference, and the calls the switch leaves weight-only."""

import pytest
import torch

import anyfp4.ops  # noqa: F401  (registers torch.ops.anyfp4)
from anyfp4.formats.fp8 import dequantize_fp8, e4m3_decode, e4m3_encode
from anyfp4.kernels.triton.fp8_linear import fp8_raw_kernel
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.kernels.fp8_w8a8 import raw_weight
from helpers import random_fp8

N, K = 130, 272  # padded to 256 x 512


def needs_fp8_matmul(device):
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] * 10 + \
            torch.cuda.get_device_capability(device)[1] < 89:
        pytest.skip("W8A8 needs FP8 tensor cores (sm_89+)")


def test_raw_kernel_gives_the_checkpoint_bytes(device):
    gen = torch.Generator().manual_seed(0)
    gate, up = random_fp8(N, K, gen, True, device), random_fp8(N, K, gen, False, device)
    p = prepack_fp8_gated(gate, up)
    half, words = p.up_offset, p.codes.shape[1]
    for row0, w in ((0, gate), (half, up)):
        out = torch.full((half, words), -1, dtype=torch.int32, device=device)  # poisoned
        fp8_raw_kernel[(half // 32, words // 64)](p.codes, out, row0, words, words, BLOCK_N=32, BLOCK_W=64)
        raw = out.view(torch.uint8)
        assert torch.equal(raw[:N, :K], w.weight.view(torch.uint8))
        assert not raw[N:].any() and not raw[:, K:].any()
        assert torch.equal(raw_weight(p, row0).view(torch.uint8), raw)


def w8a8_reference(x, w, input_scale):
    """float64: activations rounded to E4M3 through formats/ (saturating), times the dequantized weight."""
    xq = e4m3_decode(e4m3_encode(x.float() / input_scale)).double() * input_scale
    return xq @ dequantize_fp8(w).double().t()


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_w8a8_linear_and_gated_match_the_reference(device, dtype, per_channel, monkeypatch):
    needs_fp8_matmul(device)
    monkeypatch.setenv("ANYFP4_FP8_PREFILL", "w8a8")
    gen = torch.Generator().manual_seed(1)
    w, gate, up = (random_fp8(N, K, gen, per_channel, device) for _ in range(3))
    s = 0.02
    input_scale = torch.tensor([s], device=device)
    x = (torch.randn(40, K, generator=gen) * 2).to(device)
    x[0, :4] = torch.tensor([50.0, -50.0, 1e-4, -3e-3])  # saturated at +-448 * s; below the E4M3 range
    x = x.to(dtype)
    bias = torch.randn(N, generator=gen).to(dtype).to(device)
    p, pg = prepack_fp8(w), prepack_fp8_gated(gate, up)
    tol = 2e-3 if dtype == torch.float16 else 8e-3

    y = torch.ops.anyfp4.fp8_linear(x, p.codes, p.scales, bias, N, K, 0, input_scale)
    ref = w8a8_reference(x, w, s) + bias.double()
    weight_only = x.double() @ dequantize_fp8(w).double().t() + bias.double()
    assert y.dtype == dtype and not torch.isnan(y).any()
    assert rel(y, ref) < tol
    assert rel(y, weight_only) > 3 * rel(y, ref)  # the activations were quantized: W8A8 ran

    yg = torch.ops.anyfp4.fp8_gated(x, pg.codes, pg.scales, pg.up_offset, N, K, 0, input_scale)
    gref = torch.nn.functional.silu(w8a8_reference(x, gate, s)) * w8a8_reference(x, up, s)
    assert rel(yg, gref) < 2 * tol


def test_the_switch_applies_to_prefill_with_an_input_scale_only(device, monkeypatch):
    needs_fp8_matmul(device)
    gen = torch.Generator().manual_seed(2)
    w = random_fp8(N, K, gen, True, device)
    p = prepack_fp8(w)
    scale = torch.tensor([0.02], device=device)
    x40, x8 = (torch.randn(m, K, generator=gen).to(torch.bfloat16).to(device) for m in (40, 8))

    def run(x, input_scale):
        return torch.ops.anyfp4.fp8_linear(x, p.codes, p.scales, None, N, K, 0, input_scale)

    weight_only = {m: run(x, None) for m, x in ((40, x40), (8, x8))}
    assert torch.equal(run(x40, scale), weight_only[40])  # default: weight-only, input scale or not
    monkeypatch.setenv("ANYFP4_FP8_PREFILL", "w8a8")
    assert torch.equal(run(x8, scale), weight_only[8])  # decode-sized calls stay weight-only
    assert torch.equal(run(x40, None), weight_only[40])  # no input scale: weight-only
    assert not torch.equal(run(x40, scale), weight_only[40])
    monkeypatch.setenv("ANYFP4_FP8_PREFILL", "int8")
    with pytest.raises(ValueError, match="ANYFP4_FP8_PREFILL must be one of weight-only, w8a8"):
        run(x40, scale)


def test_bad_input_scale_is_refused(device):
    w = random_fp8(N, K, torch.Generator().manual_seed(3), False, device)
    p = prepack_fp8(w)
    x = torch.randn(40, K).to(torch.bfloat16).to(device)
    for bad in (torch.tensor([0.1, 0.2], device=device), torch.tensor([1], device=device)):
        with pytest.raises(ValueError, match="input_scale must be one float32 value"):
            torch.ops.anyfp4.fp8_linear(x, p.codes, p.scales, None, N, K, 0, bad)


def test_opcheck_with_input_scale(device):
    w = random_fp8(N, K, torch.Generator().manual_seed(4), False, device)
    p = prepack_fp8(w)
    x = torch.randn(40, K).to(torch.bfloat16).to(device)
    torch.library.opcheck(torch.ops.anyfp4.fp8_linear, (x, p.codes, p.scales, None, N, K, 0,
                                                        torch.tensor([0.02], device=device)))


def test_layers_carry_the_largest_input_scale(monkeypatch):
    from anyfp4.formats.fp8 import FP8Weight
    from anyfp4.nn.linear import FP8Linear, fused_linear

    gen = torch.Generator().manual_seed(5)
    base = [random_fp8(64, K, gen, False, "cpu") for _ in range(3)]
    ws = [FP8Weight(w.weight, w.scale, torch.tensor(s)) for w, s in zip(base, (0.01, 0.03, 0.02))]
    fused = fused_linear(ws, [None] * 3, "cpu", torch.bfloat16)
    assert torch.equal(fused.input_scale, torch.tensor([0.03]))
    assert fused_linear([ws[0], base[1]], [None] * 2, "cpu", torch.bfloat16).input_scale is None
    gated = FP8Linear(ws[0], None, "cpu", gated_up=ws[1])
    assert torch.equal(gated.input_scale, torch.tensor([0.03]))
    x = torch.randn(40, K, generator=gen).to(torch.bfloat16)
    monkeypatch.setenv("ANYFP4_FP8_PREFILL", "w8a8")
    want = torch.ops.anyfp4.fp8_gated(x, gated.codes, gated.scales, gated.up_offset, 64, K, 0,
                                      torch.tensor([0.03]))
    assert torch.equal(gated(x), want)
    monkeypatch.delenv("ANYFP4_FP8_PREFILL")
    assert not torch.equal(gated(x), want)
