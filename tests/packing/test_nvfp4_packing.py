import pytest
import torch

from anyfp4.formats.fp8 import e4m3_decode
from anyfp4.formats.nvfp4 import NVFP4Weight, dequantize_nvfp4, quantize_nvfp4
from anyfp4.packing.layout import K_ALIGN, ROW_ALIGN, tiled_scale_offset, tiled_word_offset
from anyfp4.packing.nvfp4 import (
    CODE_BITS,
    SCALE_BYTE,
    checkpoint_order,
    prepack_nvfp4,
    prepack_nvfp4_gated,
    unprepack_nvfp4,
    unprepack_nvfp4_gated,
)


def random_weight(n, k, seed=0):
    """Random codes; scales over every non-negative finite E4M3 byte, one block in eight zero."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.randint(0, 0x7F, (n, k // 16), dtype=torch.uint8, generator=g)
    scales[torch.rand(n, k // 16, generator=g) < 0.125] = 0
    return NVFP4Weight(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
                       scales.view(torch.float8_e4m3fn), torch.tensor(0.01))


def kept_codes(w):
    """The codes a prepack keeps: a block with a zero scale reads back with zero codes, every other code as is."""
    n, k2 = w.packed.shape
    zero_blocks = w.block_scale.view(torch.uint8) == 0
    return w.packed.view(n, k2 // 8, 8).masked_fill(zero_blocks[:, :, None], 0).view(n, k2)


def test_random_weights_have_zero_and_nonzero_scales():
    scales = random_weight(64, 256).block_scale.view(torch.uint8)
    assert (scales == 0).any() and (scales != 0).any() and (scales < 8).any()  # subnormals too


def test_scale_byte_shifts_into_every_float_format():
    """Every non-negative finite E4M3 scale (subnormals, +0 and -0 included): the prepacked byte shifted into
    bf16 / fp16 / float32 exponent fields is bs times a fixed power of two (the kernels' conversions)."""
    b = torch.tensor(list(range(0x7F)) + [0x80], dtype=torch.uint8)
    bs = e4m3_decode(b).double().abs()
    code = SCALE_BYTE[b.long()].to(torch.int32)
    as_bf16 = ((code << 4) + (235 << 7)).to(torch.int16).view(torch.bfloat16).double()
    nonzero = bs != 0
    assert torch.equal(as_bf16[nonzero], bs[nonzero] * 2.0**118)
    assert torch.equal(((code << 7) + (5 << 10)).to(torch.int16).view(torch.float16).double()[nonzero], bs[nonzero])
    assert torch.equal((code << 7).to(torch.int16).view(torch.float16).double(), bs * 2.0**-5)
    assert torch.equal((code << 20).view(torch.float32).double(), bs * 2.0**-117)
    assert int(code.max()) < 256 and torch.equal(code[~nonzero], torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("bad", [0x81, 0xC0, 0x7F, 0xFF])
def test_negative_or_nan_scales_are_refused(bad):
    w = random_weight(16, 64)
    scales = w.block_scale.view(torch.uint8).clone()
    scales[3, 2] = bad
    with pytest.raises(ValueError, match=r"negative or NaN \(first: row 3, block 2, byte 0x"):
        prepack_nvfp4(NVFP4Weight(w.packed, scales.view(torch.float8_e4m3fn), w.global_scale))


def test_negative_zero_scale_is_zero():
    w = random_weight(16, 64)
    scales = w.block_scale.view(torch.uint8).clone()
    scales[:, 1] = 0x80
    back = unprepack_nvfp4(prepack_nvfp4(NVFP4Weight(w.packed, scales.view(torch.float8_e4m3fn), w.global_scale)))
    assert not back.block_scale.view(torch.uint8)[:, 1].any() and not back.packed[:, 8:16].any()


@pytest.mark.parametrize("n, k", [(64, 256), (4120, 1552), (1, 16), (130, 272)])
def test_round_trip_and_padding(n, k):
    w = random_weight(n, k)
    p = prepack_nvfp4(w)
    assert p.codes.dtype == torch.int32 and p.codes.shape[0] % ROW_ALIGN == 0 and (p.codes.shape[1] * 8) % K_ALIGN == 0
    assert p.scales.shape == (p.codes.shape[0], p.codes.shape[1] // 2)
    back = unprepack_nvfp4(p)
    assert torch.equal(back.packed, kept_codes(w))
    assert torch.equal(back.block_scale.view(torch.uint8), w.block_scale.view(torch.uint8))
    assert torch.equal(dequantize_nvfp4(back), dequantize_nvfp4(w))
    assert torch.equal(back.global_scale, w.global_scale)
    # padding is zero codes and zero scales
    raw, scales = checkpoint_order(p)
    assert not raw[n:].any() and not raw[:, k // 2:].any() and not scales[n:].any() and not scales[:, k // 16:].any()


def test_tiles_and_word_bits():
    """Every code and scale sits where tiled_word_offset / CODE_BITS / tiled_scale_offset say."""
    n, k = 40, 512
    w = random_weight(n, k, 3)
    p = prepack_nvfp4(w)
    words_per_row, blocks_per_row = p.codes.shape[1], p.scales.shape[1]
    flat_codes = p.codes.reshape(-1).to(torch.int64) & 0xFFFFFFFF
    flat_scales = p.scales.reshape(-1)
    rows, cols = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    word = flat_codes[tiled_word_offset(rows, cols // 8, words_per_row)]
    pos = torch.tensor(CODE_BITS)[cols % 8]  # (n, k, 4): word bits of magnitude bits 0-2 and the sign
    code = sum(((word >> pos[..., b]) & 1) << b for b in range(4))
    assert sorted(torch.tensor(CODE_BITS).flatten().tolist()) == list(range(32))
    nibbles = torch.stack([w.packed & 0xF, w.packed >> 4], -1).reshape(n, k).to(torch.int64)
    zero_block = (w.block_scale.view(torch.uint8) == 0).repeat_interleave(16, dim=1)
    assert torch.equal(code, nibbles.masked_fill(zero_block, 0))
    rows, blocks = torch.meshgrid(torch.arange(n), torch.arange(k // 16), indexing="ij")
    assert torch.equal(flat_scales[tiled_scale_offset(rows, blocks, blocks_per_row)],
                       SCALE_BYTE[w.block_scale.view(torch.uint8).long()])
    # a 16 x 128 tile is one contiguous run of 256 words
    assert tiled_word_offset(17, 16, words_per_row) == 256 * (words_per_row // 16) + 256 + 16


def test_gated_round_trip():
    gate, up = random_weight(130, 64, 1), random_weight(130, 64, 2)
    p = prepack_nvfp4_gated(gate, up)
    assert p.gated and p.up_offset % ROW_ALIGN == 0 and p.out_features == 130
    g, u = unprepack_nvfp4_gated(p)
    assert torch.equal(g.packed, kept_codes(gate)) and torch.equal(u.packed, kept_codes(up))
    assert torch.equal(dequantize_nvfp4(u), dequantize_nvfp4(up))


def test_gated_needs_shared_scale():
    a = quantize_nvfp4(torch.randn(16, 32))
    b = quantize_nvfp4(torch.randn(16, 32) * 3)
    with pytest.raises(ValueError, match="share one global scale"):
        prepack_nvfp4_gated(a, b)
