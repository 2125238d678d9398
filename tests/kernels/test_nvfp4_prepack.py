import pytest
import torch

from anyfp4.formats.nvfp4 import NVFP4Weight, quantize_nvfp4
from anyfp4.kernels.nvfp4_prepack import (
    K_ALIGN,
    ROW_ALIGN,
    WORD_BITS,
    checkpoint_order,
    prepack_nvfp4,
    prepack_nvfp4_gated,
    tiled_scale_offset,
    tiled_word_offset,
    unprepack_nvfp4,
    unprepack_nvfp4_gated,
)


def random_weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return NVFP4Weight(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
                       torch.randint(0, 0x7E, (n, k // 16), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn),
                       torch.tensor(0.01))


@pytest.mark.parametrize("n, k", [(64, 256), (4120, 1552), (1, 16), (130, 272)])
def test_round_trip_and_padding(n, k):
    w = random_weight(n, k)
    p = prepack_nvfp4(w)
    assert p.codes.dtype == torch.int32 and p.codes.shape[0] % ROW_ALIGN == 0 and (p.codes.shape[1] * 8) % K_ALIGN == 0
    assert p.scales.shape == (p.codes.shape[0], p.codes.shape[1] // 2)
    back = unprepack_nvfp4(p)
    assert torch.equal(back.packed, w.packed)
    assert torch.equal(back.block_scale.view(torch.uint8), w.block_scale.view(torch.uint8))
    assert torch.equal(back.global_scale, w.global_scale)
    # padding is zero codes and zero scales
    raw, scales = checkpoint_order(p)
    assert not raw[n:].any() and not raw[:, k // 2:].any() and not scales[n:].any() and not scales[:, k // 16:].any()


def test_tiles_and_word_bits():
    """Every code and scale sits where tiled_word_offset / WORD_BITS / tiled_scale_offset say."""
    n, k = 40, 512
    w = random_weight(n, k, 3)
    p = prepack_nvfp4(w)
    words_per_row, blocks_per_row = p.codes.shape[1], p.scales.shape[1]
    flat_codes = p.codes.reshape(-1).to(torch.int64) & 0xFFFFFFFF
    flat_scales = p.scales.reshape(-1)
    rows, cols = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    word = flat_codes[tiled_word_offset(rows, cols // 8, words_per_row)]
    i = cols % 8
    lo2 = torch.tensor([b[0] for b in WORD_BITS])[i % 4] + 16 * (i // 4)
    bit2 = torch.tensor([b[1] for b in WORD_BITS])[i % 4] + 16 * (i // 4)
    sign = torch.tensor([b[2] for b in WORD_BITS])[i % 4] + 16 * (i // 4)
    code = ((word >> lo2) & 3) | (((word >> bit2) & 1) << 2) | (((word >> sign) & 1) << 3)
    nibbles = torch.stack([w.packed & 0xF, w.packed >> 4], -1).reshape(n, k).to(torch.int64)
    assert torch.equal(code, nibbles)
    rows, blocks = torch.meshgrid(torch.arange(n), torch.arange(k // 16), indexing="ij")
    assert torch.equal(flat_scales[tiled_scale_offset(rows, blocks, blocks_per_row)], w.block_scale.view(torch.uint8))
    # a 16 x 128 tile is one contiguous run of 256 words
    assert tiled_word_offset(17, 16, words_per_row) == 256 * (words_per_row // 16) + 256 + 16


def test_gated_round_trip():
    gate, up = random_weight(130, 64, 1), random_weight(130, 64, 2)
    p = prepack_nvfp4_gated(gate, up)
    assert p.gated and p.up_offset % ROW_ALIGN == 0 and p.out_features == 130
    g, u = unprepack_nvfp4_gated(p)
    assert torch.equal(g.packed, gate.packed) and torch.equal(u.packed, up.packed)


def test_gated_needs_shared_scale():
    a = quantize_nvfp4(torch.randn(16, 32))
    b = quantize_nvfp4(torch.randn(16, 32) * 3)
    with pytest.raises(ValueError, match="share one global scale"):
        prepack_nvfp4_gated(a, b)
