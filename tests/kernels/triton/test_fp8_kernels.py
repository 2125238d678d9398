"""FP8 kernels against the formats/ reference (Triton's interpreter without a GPU)."""

import pytest
import torch

from anyfp4.formats.fp8 import FP8Weight, dequantize_fp8
from helpers import random_fp8
from anyfp4.kernels.triton.fp8_linear import fp8_dequantize, fp8_gemv
from anyfp4.packing.fp8 import BYTE_BITS, prepack_fp8, prepack_fp8_gated, unprepack_fp8

DTYPES = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("per_channel", [False, True])
def test_prepack_round_trip(per_channel):
    w = random_fp8(130, 272, torch.Generator().manual_seed(0), per_channel, "cpu")
    p = prepack_fp8(w)
    back = unprepack_fp8(p)
    assert torch.equal(back.weight.view(torch.uint8), w.weight.view(torch.uint8))
    assert torch.equal(dequantize_fp8(back), dequantize_fp8(w))


def test_words_are_stored_in_16_by_16_tiles():
    from anyfp4.packing.layout import tiled_word_offset

    n, k = 40, 512
    w = random_fp8(n, k, torch.Generator().manual_seed(1), False, "cpu")
    p = prepack_fp8(w)
    flat = p.codes.reshape(-1)
    rows, words = torch.meshgrid(torch.arange(n), torch.arange(k // 4), indexing="ij")
    stored = flat[tiled_word_offset(rows, words, p.codes.shape[1])].to(torch.int64) & 0xFFFFFFFF
    bits = torch.tensor(BYTE_BITS)  # (value in word, bit of the value) -> word bit
    value = sum(((stored[:, :, None] >> bits[:, b]) & 1) << b for b in range(8))  # (n, k // 4, 4)
    assert torch.equal(value.reshape(n, k).to(torch.uint8), w.weight.view(torch.uint8))
    assert sorted(bits.flatten().tolist()) == list(range(32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant_bit_exact(device, dtype):
    w = random_fp8(40, 272, torch.Generator().manual_seed(1), True, device)
    out = torch.full((40, 272), float("nan"), dtype=dtype, device=device)
    fp8_dequantize(prepack_fp8(w), dtype, out)
    assert torch.equal(out, dequantize_fp8(w).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_channel", [False, True])
def test_gemv_matches_reference(device, dtype, per_channel):
    gen = torch.Generator().manual_seed(2)
    w = random_fp8(72, 528, gen, per_channel, device)
    x = torch.randn(1, 528, generator=gen).to(dtype).to(device)
    bias = torch.randn(72, generator=gen).to(dtype).to(device)
    ref = x.float() @ dequantize_fp8(w).t() + bias.float()
    y = fp8_gemv(x, prepack_fp8(w), bias)
    assert not torch.isnan(y).any()
    tol = 2e-3 if dtype == torch.float16 else 8e-3
    assert ((y.float() - ref).norm() / ref.norm()).item() < tol
    assert torch.equal(y, fp8_gemv(x, prepack_fp8(w), bias))


def test_gated_gemv(device):
    gen = torch.Generator().manual_seed(3)
    gate, up = random_fp8(40, 256, gen, True, device), random_fp8(40, 256, gen, False, device)
    x = torch.randn(1, 256, generator=gen).to(torch.float16).to(device)
    ref = torch.nn.functional.silu(x.float() @ dequantize_fp8(gate).t()) * (x.float() @ dequantize_fp8(up).t())
    y = fp8_gemv(x, prepack_fp8_gated(gate, up), None)
    assert ((y.float() - ref).norm() / ref.norm()).item() < 4e-3
