import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anyfp4.formats.nvfp4 import (
    NVFP4Weight,
    dequantize_nvfp4,
    e2m1_decode,
    e2m1_encode,
    e2m1_values,
    nvfp4_block_scales,
    nvfp4_global_scale,
    pack_nibbles,
    quantize_nvfp4,
    shared_global_scale,
    unpack_nibbles,
)

ALL_CODES = torch.arange(16, dtype=torch.uint8)
EXPECTED = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def test_all_16_codes_decode():
    out = e2m1_decode(ALL_CODES)
    assert out.tolist() == EXPECTED
    assert torch.signbit(out[8]) and not torch.signbit(out[0])  # code 8 is -0
    assert torch.equal(out, e2m1_values())


def test_all_16_codes_encode_back():
    out = e2m1_encode(e2m1_decode(ALL_CODES))
    expected = ALL_CODES.clone()
    expected[8] = 0  # -0.0 is not negative: encodes as +0, as ModelOpt does
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    "value, code",
    [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6),  # ties to even
     (0.2500001, 1), (0.7499999, 1), (5.0000005, 7), (6.0, 7), (7.0, 7), (1e30, 7),  # nearest, saturation
     (-0.1, 8), (-0.25, 8), (-0.26, 9), (-5.0, 14), (-100.0, 15)],
)
def test_encode_rounding(value, code):
    assert e2m1_encode(torch.tensor([value])).item() == code


@settings(max_examples=300, deadline=None)
@given(st.floats(-8, 8, allow_nan=False, width=32))
def test_encode_is_nearest_with_saturation(x):
    q = e2m1_decode(e2m1_encode(torch.tensor([x]))).item()
    mags = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    best = (mags - min(abs(x), 6.0)).abs().min().item()
    assert abs(abs(q) - min(abs(x), 6.0)) == best
    assert q == 0 or (q < 0) == (x < 0)


def test_pack_layout_even_k_in_low_nibble():
    codes = torch.tensor([[0x1, 0x2, 0xA, 0xF]], dtype=torch.uint8)
    assert pack_nibbles(codes).tolist() == [[0x21, 0xFA]]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 15), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0))
def test_pack_unpack_round_trip(values):
    codes = torch.tensor(values, dtype=torch.uint8).reshape(1, -1)
    assert torch.equal(unpack_nibbles(pack_nibbles(codes)), codes)


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=1, max_size=64))
def test_unpack_pack_round_trip(raw):
    packed = torch.tensor(list(raw), dtype=torch.uint8).reshape(1, -1)
    assert torch.equal(pack_nibbles(unpack_nibbles(packed)), packed)


def test_scales_follow_modelopt_rules():
    w = torch.zeros(2, 48)
    w[0, :16] = torch.linspace(-3, 3, 16)  # block amax 3
    w[1, 16:32] = 1e-12  # tiny block: clamps to 2^-9
    gs = nvfp4_global_scale(w)
    assert gs.dtype == torch.float32 and gs.item() == pytest.approx(3 / 2688)
    bs = nvfp4_block_scales(w, gs).float()
    assert bs[0, 0].item() == 448.0  # the block holding amax gets the largest scale
    assert bs[0, 1].item() == 1.0 and bs[0, 2].item() == 1.0 and bs[1, 0].item() == 1.0  # all-zero blocks
    assert bs[1, 1].item() == 2.0**-9  # clamped from below


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_error_bound(dtype):
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(40, 96, generator=g) * torch.rand(40, 1, generator=g)).to(dtype)
    q = quantize_nvfp4(w)
    assert q.packed.shape == (40, 48) and q.block_scale.shape == (40, 6) and q.global_scale.shape == ()
    deq = dequantize_nvfp4(q)
    step = (q.block_scale.float() * q.global_scale).repeat_interleave(16, dim=1)
    # nearest E2M1 value: error at most half the largest gap (2 between 4 and 6) times the scale,
    # plus the E4M3 rounding of the block scale (relative 2^-4 of |w|).
    err = (deq - w.float()).abs()
    assert (err <= step * 1.0 + w.float().abs() * 2.0**-4 + 1e-12).all()
    rel = (deq - w.float()).norm() / w.float().norm()
    assert rel < 0.12


def test_quantize_is_idempotent_on_representable_weights():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(16, 64, generator=g)
    deq = dequantize_nvfp4(quantize_nvfp4(w))
    again = quantize_nvfp4(deq)
    assert torch.equal(dequantize_nvfp4(again), deq)


def test_shared_global_scale_uses_largest_amax():
    a, b = torch.randn(8, 32), torch.randn(4, 32) * 10
    gs = shared_global_scale([a, b])
    assert gs.item() == nvfp4_global_scale(b).item()
    qa = quantize_nvfp4(a, gs)
    assert qa.global_scale.item() == gs.item()


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.randn(4, 24))
    with pytest.raises(ValueError, match="NaN"):
        quantize_nvfp4(torch.full((4, 16), float("nan")))
    with pytest.raises(ValueError, match="finite and positive"):
        quantize_nvfp4(torch.randn(4, 16), torch.tensor(0.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_all_zero_weight_quantizes_to_exact_zeros(dtype):
    # amax 0 counts as the quantizer's maxbound 6 (ModelOpt's export_amax rule): global scale 6 / (6 * 448)
    q = quantize_nvfp4(torch.zeros(4, 32, dtype=dtype))
    assert q.global_scale.item() == torch.tensor(1 / 448, dtype=torch.float32).item()
    assert torch.equal(q.packed, torch.zeros(4, 16, dtype=torch.uint8))
    assert (q.block_scale.view(torch.uint8) == 0x38).all()  # E4M3 1.0, as for a zero block of a non-zero weight
    assert torch.equal(dequantize_nvfp4(q), torch.zeros(4, 32))
    assert shared_global_scale([torch.zeros(2, 16), torch.zeros(3, 16)]).item() == q.global_scale.item()


def test_dequantize_formula_by_hand():
    codes = torch.tensor([[1, 15] + [0] * 14], dtype=torch.uint8)  # 0.5 and -6
    q = NVFP4Weight(pack_nibbles(codes), torch.tensor([[3.0]]).to(torch.float8_e4m3fn), torch.tensor(0.25))
    out = dequantize_nvfp4(q)
    assert out[0, 0].item() == 0.5 * 3 * 0.25 and out[0, 1].item() == -6 * 3 * 0.25
    assert dequantize_nvfp4(q, torch.bfloat16).dtype == torch.bfloat16


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**31 - 1), st.floats(1e-3, 1e3))
def test_quantize_dequantize_round_trip_property(rows, blocks, seed, magnitude):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, blocks * 16, generator=g) * magnitude).to(torch.bfloat16)
    q = quantize_nvfp4(w)
    deq = dequantize_nvfp4(q)
    # representable values survive a second round trip exactly: same scales, same codes except
    # that a negative value rounded to -0 (code 8) comes back as +0 (code 0)
    q2 = quantize_nvfp4(deq, q.global_scale)
    codes, codes2 = unpack_nibbles(q.packed), unpack_nibbles(q2.packed)
    assert torch.equal(torch.where(codes == 8, 0, codes), codes2)
    assert torch.equal(dequantize_nvfp4(q2), deq)
    assert torch.equal(q2.block_scale.view(torch.uint8), q.block_scale.view(torch.uint8))
    # the block holding the tensor's largest magnitude reproduces it exactly (6 * 448 * global scale)
    assert deq.abs().max().item() == pytest.approx(w.float().abs().max().item(), rel=2**-20)
