"""The storage layout both prepacks share (packing/layout.py): the tiles put every word and scale byte where the
offset functions say, and every transform has its inverse."""

import torch

from anyfp4.packing.fp8 import BYTE_BITS
from anyfp4.packing.layout import (K_ALIGN, ROW_ALIGN, TILE_BLOCKS, TILE_ROWS, TILE_WORDS, gather_bits, round_up,
                                   spread_bits, tile_scales, tile_words, tiled_scale_offset, tiled_word_offset,
                                   untile_scales, untile_words)
from anyfp4.packing.nvfp4 import CODE_BITS


def test_padding_is_whole_tiles():
    assert ROW_ALIGN % TILE_ROWS == 0 and K_ALIGN % 8 == 0
    assert [round_up(v, 16) for v in (0, 1, 16, 17)] == [0, 16, 16, 32]


def test_tiled_words_lie_at_their_offsets():
    gen = torch.Generator().manual_seed(0)
    n, kw = 3 * TILE_ROWS, 4 * TILE_WORDS
    words = torch.randint(-2**31, 2**31, (n, kw), dtype=torch.int64, generator=gen).to(torch.int32)
    tiled = tile_words(words)
    rows, cols = torch.meshgrid(torch.arange(n), torch.arange(kw), indexing="ij")
    assert torch.equal(tiled.reshape(-1)[tiled_word_offset(rows, cols, kw)], words)
    assert torch.equal(untile_words(tiled), words)
    # a tile is TILE_ROWS x TILE_WORDS consecutive words, row-major
    assert tiled_word_offset(TILE_ROWS + 1, TILE_WORDS, kw) == TILE_ROWS * kw + TILE_ROWS * TILE_WORDS + TILE_WORDS


def test_tiled_scales_lie_at_their_offsets():
    gen = torch.Generator().manual_seed(1)
    n, kb = 2 * TILE_ROWS, 3 * TILE_BLOCKS
    scales = torch.randint(0, 256, (n, kb), dtype=torch.uint8, generator=gen)
    tiled = tile_scales(scales)
    rows, blocks = torch.meshgrid(torch.arange(n), torch.arange(kb), indexing="ij")
    assert torch.equal(tiled.reshape(-1)[tiled_scale_offset(rows, blocks, kb)], scales)
    assert torch.equal(untile_scales(tiled), scales)
    # one 32-bit word of a tile: rows r and r + 8, blocks 2t and 2t + 1 (what a CUDA thread loads at once)
    word = [tiled_scale_offset(r, b, kb) for r in (5, 5 + TILE_ROWS // 2) for b in (6, 7)]
    assert sorted(word) == list(range(word[0], word[0] + 4)) and word[0] % 4 == 0


def test_bit_spreads_invert():
    gen = torch.Generator().manual_seed(2)
    words = torch.randint(-2**31, 2**31, (40, 24), dtype=torch.int64, generator=gen).to(torch.int32)
    for table in (CODE_BITS, BYTE_BITS):
        assert sorted(b for field in table for b in field) == list(range(32))
        spread = spread_bits(words, table, rows_per_chunk=7)
        assert torch.equal(gather_bits(spread, table), words)
        assert not torch.equal(spread, words)
