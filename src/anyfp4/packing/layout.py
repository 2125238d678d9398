"""The storage layout both prepacks (``nvfp4.py``, ``fp8.py``) share: padding, the tiles their int32 words (and
NVFP4's block-scale bytes) are stored in, and the placement of a word's bits. The one owner of this geometry:
the Triton kernels (``kernels/triton/bits.py``), the CUDA kernel (``kernels/cuda/weight_mma_defines.py``) and the
CPU kernel (``kernels/cpu/linear.py``) take their constants and offsets from here.

- Padding: a weight of N rows and K columns is stored as ``round_up(N, ROW_ALIGN)`` rows and
  ``round_up(K, K_ALIGN)`` columns (zeros), so every kernel tile is whole.
- Words: tiles of ``TILE_ROWS`` rows x ``TILE_WORDS`` words (NVFP4: 128 k, FP8: 64 k), row-major inside, the
  tiles of a row block in k order, row blocks in order (``tile_words``, ``tiled_word_offset``): a warp reads one
  tile as one contiguous 1 KiB stretch. The 2-D shape (rows, words per row) only keeps the byte count; every
  ``TILE_ROWS`` rows of it are one row block, so two prepacks stack along rows with ``torch.cat``.
- Block scales (one byte per ``WORDS_PER_BLOCK`` words): the same tiles, ``TILE_BLOCKS`` bytes per tile row,
  ordered (row % 8, block // 2, row // 8, block % 2) inside a tile (``tile_scales``, ``tiled_scale_offset``), so
  that one 32-bit load gives a thread the scales of two blocks in rows r and r + 8.
- Bits: a word's fields (a code or a value, in checkpoint order field i at bits ``i * width``) are moved to the
  positions a table gives (``spread_bits``; ``gather_bits`` is the inverse): each format's table is placed
  for its CUDA decode.
"""

from __future__ import annotations

import sys

import torch

ROW_ALIGN = 128  # the largest row tile of any kernel configuration
K_ALIGN = 256  # the largest K tile
TILE_ROWS = 16  # rows of a storage tile
TILE_WORDS = 16  # int32 words per tile row
TILE_HALF_ROWS = TILE_ROWS // 2  # a scale word holds rows r and r + TILE_HALF_ROWS
WORDS_PER_BLOCK = 2  # words per block scale (NVFP4: 16 k)
TILE_BLOCKS = TILE_WORDS // WORDS_PER_BLOCK  # block scales per tile row


def round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def tile_words(words: torch.Tensor) -> torch.Tensor:
    """(rows, words) row-major -> tiles of ``TILE_ROWS`` x ``TILE_WORDS``, row-major inside, in (row block, word
    block) order."""
    n, kw = words.shape
    tw = TILE_WORDS
    return words.view(n // TILE_ROWS, TILE_ROWS, kw // tw, tw).permute(0, 2, 1, 3).contiguous().view(n, kw)


def untile_words(words: torch.Tensor) -> torch.Tensor:
    """The inverse of ``tile_words``."""
    n, kw = words.shape
    tw = TILE_WORDS
    return words.view(n // TILE_ROWS, kw // tw, TILE_ROWS, tw).permute(0, 2, 1, 3).contiguous().view(n, kw)


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """(rows, blocks) -> per tile the order (row % 8, block // 2, row // 8, block % 2)."""
    n, kb = scales.shape
    tb, h = TILE_BLOCKS, TILE_HALF_ROWS
    # (tile, row // 8, row % 8, step, block // 2, block % 2)
    v = scales.view(n // TILE_ROWS, 2, h, kb // tb, tb // 2, 2)
    return v.permute(0, 3, 2, 4, 1, 5).contiguous().view(n, kb)


def untile_scales(scales: torch.Tensor) -> torch.Tensor:
    """The inverse of ``tile_scales``."""
    n, kb = scales.shape
    tb, h = TILE_BLOCKS, TILE_HALF_ROWS
    # (tile, step, row % 8, block // 2, row // 8, block % 2)
    v = scales.view(n // TILE_ROWS, kb // tb, h, tb // 2, 2, 2)
    return v.permute(0, 4, 2, 1, 3, 5).contiguous().view(n, kb)


def tiled_word_offset(row, word, words_per_row: int):
    """Index in the flat words of word ``word`` of weight row ``row`` (ints or int tensors)."""
    tw = TILE_WORDS
    return ((row // TILE_ROWS) * (TILE_ROWS * words_per_row) + (word // tw) * (TILE_ROWS * tw)
            + (row % TILE_ROWS) * tw + word % tw)


def tiled_scale_offset(row, block, blocks_per_row: int):
    """Index in the flat scales of block ``block`` of weight row ``row``."""
    tb, h = TILE_BLOCKS, TILE_HALF_ROWS
    b = block % tb
    inside = (row % h) * (2 * tb) + (b // 2) * 4 + ((row % TILE_ROWS) // h) * 2 + b % 2
    return (row // TILE_ROWS) * (TILE_ROWS * blocks_per_row) + (block // tb) * (TILE_ROWS * tb) + inside


def _byte_tables(moves: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """(4, 256) int32: entry [j, v] holds the word bits that byte j of a word, of value v, moves to (``moves``:
    (from bit, to bit) pairs)."""
    tables = torch.zeros(4, 256, dtype=torch.int64)
    values = torch.arange(256, dtype=torch.int64)
    for src, dst in moves:
        tables[src // 8] |= ((values >> (src % 8)) & 1) << dst
    return (tables - ((tables >> 31) << 32)).to(torch.int32)


def _move_bits(words: torch.Tensor, moves: tuple[tuple[int, int], ...], rows_per_chunk: int) -> torch.Tensor:
    """Every bit of every int32 word moved as ``moves`` says: one table lookup per byte (in chunks of rows)."""
    if sys.byteorder != "little":
        raise RuntimeError("the prepacks are built on little-endian machines only")
    tables = _byte_tables(moves).to(words.device)
    out = torch.empty_like(words)
    for r in range(0, words.shape[0], rows_per_chunk):
        b = words[r:r + rows_per_chunk].contiguous().view(torch.uint8).view(*words[r:r + rows_per_chunk].shape, 4)
        acc = tables[0][b[..., 0].int()]
        for j in range(1, 4):
            acc |= tables[j][b[..., j].int()]
        out[r:r + rows_per_chunk] = acc
    return out


def _field_moves(table) -> tuple[tuple[int, int], ...]:
    """(checkpoint-order bit, placed bit) for every bit of every field of ``table``."""
    return tuple((len(bits) * i + b, pos) for i, bits in enumerate(table) for b, pos in enumerate(bits))


def spread_bits(words: torch.Tensor, table, rows_per_chunk: int = 4096) -> torch.Tensor:
    """Checkpoint-order int32 words (field i, of ``len(table[i])`` bits, at bit ``i * len(table[i])``) -> the
    layout where bit b of field i sits at word bit ``table[i][b]``. NVFP4 uses ``nvfp4.CODE_BITS``, FP8
    ``fp8.BYTE_BITS``."""
    return _move_bits(words, _field_moves(table), rows_per_chunk)


def gather_bits(words: torch.Tensor, table, rows_per_chunk: int = 4096) -> torch.Tensor:
    """The inverse of ``spread_bits``."""
    return _move_bits(words, tuple((dst, src) for src, dst in _field_moves(table)), rows_per_chunk)
