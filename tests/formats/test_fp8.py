import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anyfp4.formats.fp8 import (
    E4M3_MAX,
    FP8Weight,
    dequantize_fp8,
    e4m3_decode,
    e4m3_encode,
    fp8_weight_scale,
    quantize_fp8,
)


def test_all_256_bytes_decode_like_torch():
    b = torch.arange(256, dtype=torch.uint8)
    ours = e4m3_decode(b)
    ref = b.view(torch.float8_e4m3fn).float()
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    assert torch.isnan(ours).sum() == 2  # 0x7F and 0xFF
    finite = ~torch.isnan(ref)
    assert torch.equal(ours[finite], ref[finite])
    # signed zeros keep their sign
    assert torch.signbit(ours[0x80]) and not torch.signbit(ours[0x00])


def test_edge_values():
    assert e4m3_decode(torch.tensor([0x7E], dtype=torch.uint8)).item() == 448.0
    assert e4m3_decode(torch.tensor([0x01], dtype=torch.uint8)).item() == 2.0**-9  # smallest subnormal
    assert e4m3_decode(torch.tensor([0x07], dtype=torch.uint8)).item() == 7 * 2.0**-9  # largest subnormal
    assert e4m3_decode(torch.tensor([0x08], dtype=torch.uint8)).item() == 2.0**-6  # smallest normal


def test_encode_matches_torch_on_random_and_edge_values():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200_000, generator=g) * torch.exp(torch.randn(200_000, generator=g) * 4)
    edges = torch.tensor([448.0, 463.9, 464.0, 500.0, 1e9, float("inf"), -float("inf"), float("nan"), -0.0, 0.0,
                          2.0**-10, 2.0**-10 * 1.0001, 3 * 2.0**-11, 2.0**-11, 2.0**-6, 2.0**-6 * (1 - 2**-5)])
    x = torch.cat([x, edges, -edges])
    # torch's own cast is the reference where it rounds to a finite value (beyond, its versions disagree)
    rounds = x.abs() < 464
    assert rounds.sum() > 150_000
    assert torch.equal(e4m3_encode(x[rounds]), x[rounds].to(torch.float8_e4m3fn).view(torch.uint8))
    over = x[(x.abs() >= 464) & ~x.isnan()]
    assert len(over) > 1000 and torch.equal(e4m3_encode(over), torch.where(over > 0, 0x7E, 0xFE).to(torch.uint8))
    assert e4m3_encode(torch.tensor([float("nan")])).item() == 0x7F


def test_encode_ties_go_to_even():
    # 1.0625 is halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1): to even -> 1.0
    # 1.1875 is halfway between 1.125 (m=1) and 1.25 (m=2): to even -> 1.25
    out = e4m3_decode(e4m3_encode(torch.tensor([1.0625, 1.1875, -1.0625, 2.0**-10, 3 * 2.0**-10])))
    assert out.tolist() == [1.0, 1.25, -1.0, 0.0, 2 * 2.0**-9]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 255))
def test_byte_round_trip(byte):
    b = torch.tensor([byte], dtype=torch.uint8)
    if (byte & 0x7F) == 0x7F:
        assert torch.isnan(e4m3_decode(b)).all()
        return
    assert e4m3_encode(e4m3_decode(b)).item() == byte


@settings(max_examples=200, deadline=None)
@given(st.floats(-448, 448, allow_nan=False, width=32))
def test_encode_is_nearest(x):
    t = torch.tensor([x], dtype=torch.float32)
    q = e4m3_decode(e4m3_encode(t)).item()
    grid = e4m3_decode(torch.arange(0, 127, dtype=torch.uint8))
    best = (grid - abs(x)).abs().min().item()
    assert abs(abs(q) - abs(x)) == best


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_dequantize_error_bound(dtype, per_channel):
    g = torch.Generator().manual_seed(2)
    w = (torch.randn(48, 80, generator=g) * 0.1).to(dtype)
    q = quantize_fp8(w, per_channel=per_channel)
    assert q.weight.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float32
    assert q.scale.shape == ((48,) if per_channel else ())
    deq = dequantize_fp8(q)
    scale = q.scale[:, None] if per_channel else q.scale
    # E4M3 has 3 mantissa bits: relative error <= 2^-4 for normals, absolute 2^-10 * scale for subnormals
    err = (deq - w.float()).abs()
    bound = torch.maximum(w.float().abs() * 2.0**-4, scale * 2.0**-10) * 1.01
    assert (err <= bound).all()
    # the largest magnitude maps to exactly 448 * scale
    amax = w.float().abs().amax(dim=-1) if per_channel else w.float().abs().amax()
    assert torch.allclose(deq.abs().amax(dim=-1) if per_channel else deq.abs().amax(), amax, rtol=2**-7)


def test_per_tensor_scale_is_amax_over_448():
    w = torch.tensor([[1.0, -896.0], [3.0, 4.0]])
    assert fp8_weight_scale(w).item() == 2.0
    assert quantize_fp8(w).weight.float().tolist() == [[0.5, -448.0], [1.5, 2.0]]


@pytest.mark.parametrize("per_channel", [False, True])
def test_all_zero_weight_quantizes_to_exact_zeros(per_channel):
    # amax 0 counts as the quantizer's maxbound 448 (ModelOpt's export_amax rule): scale 1, codes 0
    w = torch.randn(4, 16, dtype=torch.bfloat16)
    w[1 if per_channel else slice(None)] = 0
    q = quantize_fp8(w, per_channel=per_channel)
    scale = q.scale[1] if per_channel else q.scale
    assert scale.item() == 1.0
    assert (q.weight[1].view(torch.uint8) == 0).all() and (dequantize_fp8(q)[1] == 0).all()


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_quantize_rejects_bad_scale(scale):
    with pytest.raises(ValueError, match="finite and positive"):
        quantize_fp8(torch.randn(4, 16), torch.tensor(scale))
    with pytest.raises(ValueError, match="finite and positive .does the weight hold NaN or Inf"):
        quantize_fp8(torch.full((4, 16), float("nan")))


def test_dequantize_accepts_n_by_1_scale():
    w = torch.randn(8, 32)
    q = quantize_fp8(w, per_channel=True)
    col = FP8Weight(q.weight, q.scale[:, None])
    assert torch.equal(dequantize_fp8(col), dequantize_fp8(q))
    assert float(E4M3_MAX) == 448.0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(0, 2**31 - 1), st.booleans())
def test_fp8_round_trip_property(rows, cols, seed, per_channel):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 10
    q = quantize_fp8(w, per_channel=per_channel)
    deq = dequantize_fp8(q)
    again = quantize_fp8(deq, q.scale, per_channel=per_channel)
    assert torch.equal(again.weight.view(torch.uint8), q.weight.view(torch.uint8))
