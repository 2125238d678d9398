"""The benchmarks' random weights: shapes, value ranges, never NaN, reproducible from a seeded generator."""

import pytest
import torch

from anyfp4.bench.random_weights import random_bf16, random_fp8, random_nvfp4
from anyfp4.formats.fp8 import dequantize_fp8
from anyfp4.formats.nvfp4 import dequantize_nvfp4


def test_nvfp4_codes_scales_and_global_scale():
    w = random_nvfp4(64, 512, "cpu", torch.Generator().manual_seed(1))
    assert w.packed.shape == (64, 256) and w.packed.dtype == torch.uint8
    assert w.block_scale.shape == (64, 32) and w.block_scale.dtype == torch.float8_e4m3fn
    codes = torch.cat([w.packed & 0xF, w.packed >> 4])
    assert torch.equal(codes.unique(), torch.arange(16, dtype=torch.uint8))  # every E2M1 code
    scale_bytes = w.block_scale.view(torch.uint8)
    assert scale_bytes.min() >= 0x30 and scale_bytes.max() <= 0x7D  # positive normal E4M3: 0.5 .. 416
    assert w.global_scale.shape == () and float(w.global_scale) == pytest.approx(1e-3)
    assert torch.isfinite(dequantize_nvfp4(w)).all()


def test_fp8_bytes_have_no_nan_and_either_sign():
    w = random_fp8(64, 512, "cpu", torch.Generator().manual_seed(2))
    raw = w.weight.view(torch.uint8)
    assert w.weight.shape == (64, 512) and (raw & 0x7F).max() <= 0x7D  # finite, 448 left out
    assert (raw >= 0x80).any() and (raw < 0x80).any()
    assert w.scale.shape == () and float(w.scale) == pytest.approx(1e-3) and w.input_scale is None
    assert torch.isfinite(dequantize_fp8(w)).all()
    per_row = random_fp8(64, 512, "cpu", torch.Generator().manual_seed(2), per_channel=True, input_scale=0.05)
    assert torch.equal(per_row.weight.view(torch.uint8), raw)  # the scales are drawn after the bytes
    assert per_row.scale.shape == (64,) and per_row.scale.dtype == torch.float32
    assert per_row.scale.min() >= 0.5e-3 and per_row.scale.max() < 1.5e-3 and float(per_row.input_scale) == pytest.approx(0.05)


def test_bf16_std():
    w = random_bf16(256, 1024, "cpu", torch.Generator().manual_seed(3), std=0.5)
    assert w.dtype == torch.bfloat16 and float(w.float().std()) == pytest.approx(0.5, rel=0.02)


@pytest.mark.parametrize("make", [random_nvfp4, random_fp8, random_bf16])
def test_a_seeded_generator_gives_the_same_weights(make):
    def bytes_of(w):
        tensors = [w] if isinstance(w, torch.Tensor) else [getattr(w, f) for f in ("packed", "block_scale", "weight")
                                                          if hasattr(w, f)]
        return torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])

    a, b = (make(32, 64, "cpu", torch.Generator().manual_seed(4)) for _ in range(2))
    c = make(32, 64, "cpu", torch.Generator().manual_seed(5))
    assert torch.equal(bytes_of(a), bytes_of(b)) and not torch.equal(bytes_of(a), bytes_of(c))
