"""Prepack: ModelOpt NVFP4 tensors -> the resident layout the NVFP4 kernels read, and its inverse.

Layout (``NVFP4Prepacked``), for a weight of N rows (out_features) and K columns (in_features),
padded to ``N_pad`` (a multiple of ``ROW_ALIGN``) and ``K_pad`` (a multiple of ``K_ALIGN``):

- ``codes``: (N_pad, K_pad // 8) int32 (``K_PER_WORD`` codes a word), stored in the tiles of
  ``layout.py``: 16 rows x 16 words (128 k), 256 consecutive words, row-major inside
  (``layout.tiled_word_offset``); a decode kernel's warp reads one tile per step as one contiguous
  1 KiB stretch, and gate and up halves stack with ``torch.cat``.
- inside a word, the 8 codes of ``k = 8j .. 8j + 7`` (checkpoint codes c0..c7) have their bits
  (magnitude bits 0-2 and sign) where ``CODE_BITS`` says, placed for the CUDA kernel's bf16
  decode of the pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7): a pair is two bf16 values
  ``e2m1 * 2^-126`` with the first code's magnitude at bits 6-8 and sign at 15, the second's at
  22-24 and 31, and the layout makes that ``(w << 2) & 0x81C081C0``, ``(w << 6) & 0x81C081C0``,
  ``rotl(w, 12) & 0x81C081C0`` and ``(w & 0x81808180) | (rotl(w, 8) & 0x00400040)`` — nine
  operations per word, the fewest of any layout (an exhaustive search over the shift amounts:
  no layout lets every pair be one shift and one mask, and none does it in eight).
- ``scales``: (N_pad, K_pad // 16) uint8 block scales in the same tiles: per 16 rows x 128 k, 128
  bytes ordered (row % 8, block // 2, row // 8, block % 2) (``layout.tiled_scale_offset``), so a
  thread of the CUDA kernel gets the four scales it needs in one 32-bit load. Each byte is the E4M3
  scale re-encoded without subnormals (``SCALE_BYTE``): ``bs = 2^e * (1 + m / 8)`` (every E4M3 value
  has this form with e in -9..8) is stored as ``(e + 10) << 3 | m``, and zero as 0. Shifted into a
  float's exponent field that byte is ``bs`` times a power of two for every scale, so a kernel
  converts it with one shift and one add (``(byte << 4) + (235 << 7)`` is bf16 ``bs * 2^118``,
  ``(byte << 7)`` fp16 ``bs * 2^-5``, ``(byte << 20)`` float32 ``bs * 2^-117``) — except a zero
  scale, which an add can make nonzero: the codes of a block whose scale is zero (+0 or -0) are
  stored as zero, so the block decodes to exact zeros however its scale converts.
- ``global_scale``: (1,) float32 on the device, so no host sync is needed to read it.

Padding holds code 0 (value 0) and scale 0, so padded rows and columns contribute exact zeros
and the kernels crop the output to N. Activations are never padded: kernels mask k >= K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats.nvfp4 import GROUP_SIZE, NVFP4Weight
from .layout import (K_ALIGN, ROW_ALIGN, TILE_ROWS, gather_bits, round_up, spread_bits, tile_scales, tile_words,
                     untile_scales, untile_words)

K_PER_WORD = 8  # codes per int32 word: a storage tile row (``layout.TILE_WORDS``) holds 128 k
# per code i (k = 8j + i) of word j: the word bits holding its magnitude bits 0, 1, 2 and its sign
CODE_BITS = ((4, 5, 6, 13), (0, 1, 2, 9), (26, 27, 28, 3), (30, 7, 8, 15),
             (20, 21, 22, 29), (16, 17, 18, 25), (10, 11, 12, 19), (14, 23, 24, 31))
SCALE_EXP_BIAS = 10  # a prepacked scale byte is (e + SCALE_EXP_BIAS) << 3 | m for bs = 2^e * (1 + m / 8)
_NOT_A_SCALE = 0xFF  # SCALE_BYTE's mark for E4M3 bytes that are no block scale (negative, NaN)


def _scale_byte_table() -> torch.Tensor:
    """E4M3 byte -> prepacked scale byte (256 entries, uint8); ``_NOT_A_SCALE`` for negative and NaN bytes."""
    table = torch.full((256,), _NOT_A_SCALE, dtype=torch.uint8)
    for b in range(0x7F):  # non-negative finite: 0x00 .. 0x7E
        exp_field, m = b >> 3, b & 7
        if exp_field == 0 and m == 0:
            code = 0
        elif exp_field == 0:  # subnormal m * 2^-9: normalize
            e = m.bit_length() - 1
            code = (e - 9 + SCALE_EXP_BIAS) << 3 | ((m << (3 - e)) & 7)
        else:
            code = (exp_field - 7 + SCALE_EXP_BIAS) << 3 | m
        table[b] = code
    table[0x80] = 0  # -0
    return table


SCALE_BYTE = _scale_byte_table()
# prepacked scale byte -> E4M3 byte (+0 for zero)
E4M3_OF_SCALE_BYTE = torch.zeros(256, dtype=torch.uint8).index_put_(
    (SCALE_BYTE[:0x7F].long(),), torch.arange(0x7F, dtype=torch.uint8))


@dataclass(frozen=True)
class NVFP4Prepacked:
    codes: torch.Tensor  # (N_pad, K_pad // 8) int32
    scales: torch.Tensor  # (N_pad, K_pad // 16) uint8
    global_scale: torch.Tensor  # (1,) float32
    out_features: int  # columns of the op's output (for a gated weight: of gate alone)
    in_features: int
    up_offset: int = 0  # gated weights: row where the up projection starts (gate rows come first)

    @property
    def gated(self) -> bool:
        return self.up_offset > 0


def prepack_nvfp4(weight: NVFP4Weight, device: torch.device | str | None = None) -> NVFP4Prepacked:
    """Pad and reinterpret ModelOpt tensors (codes (N, K/2) uint8, scales (N, K/16) e4m3)."""
    n, k = weight.shape
    if k % GROUP_SIZE:
        raise ValueError(f"NVFP4 in_features must be a multiple of {GROUP_SIZE}, got {k}")
    if weight.block_scale.shape != (n, k // GROUP_SIZE):
        raise ValueError(f"block scales must be ({n}, {k // GROUP_SIZE}), got {tuple(weight.block_scale.shape)}")
    device = torch.device(device) if device is not None else weight.packed.device
    n_pad, k_pad = round_up(n, ROW_ALIGN), round_up(k, K_ALIGN)
    codes = torch.zeros(n_pad, k_pad // 2, dtype=torch.uint8, device=device)
    codes[:n, : k // 2] = weight.packed.to(device)
    scales = torch.zeros(n_pad, k_pad // GROUP_SIZE, dtype=torch.uint8, device=device)
    scales[:n, : k // GROUP_SIZE] = _encode_scales(weight.block_scale.to(device).view(torch.uint8))
    # a zero scale's block holds zero codes (see the module docstring)
    codes.view(n_pad, k_pad // GROUP_SIZE, GROUP_SIZE // 2).masked_fill_((scales == 0)[:, :, None], 0)
    codes, scales = tile_words(_spread_words(codes.view(torch.int32))), tile_scales(scales)
    global_scale = weight.global_scale.to(device=device, dtype=torch.float32).reshape(1).clone()
    return NVFP4Prepacked(codes, scales, global_scale, n, k)


def prepack_nvfp4_gated(gate: NVFP4Weight, up: NVFP4Weight, device: torch.device | str | None = None) -> NVFP4Prepacked:
    """Gate and up stacked along N for ``silu(gate) * up`` in one launch: each half padded on its
    own, so the up projection starts at row ``up_offset`` (a multiple of ``ROW_ALIGN``)."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {gate.shape} and up {up.shape} must have the same shape")
    if not torch.equal(gate.global_scale.float().reshape(()), up.global_scale.float().reshape(())):
        raise ValueError("gate and up must share one global scale (ModelOpt's export gives them one)")
    g, u = prepack_nvfp4(gate, device), prepack_nvfp4(up, device)
    half = g.codes.shape[0]
    return NVFP4Prepacked(torch.cat([g.codes, u.codes]), torch.cat([g.scales, u.scales]), g.global_scale,
                          gate.shape[0], gate.shape[1], up_offset=half)


def _encode_scales(e4m3: torch.Tensor, rows_per_chunk: int = 4096) -> torch.Tensor:
    """E4M3 block-scale bytes -> prepacked scale bytes (``SCALE_BYTE``), in chunks of rows; a negative or NaN
    scale is an error."""
    table = SCALE_BYTE.to(e4m3.device)
    out = torch.empty_like(e4m3)
    for r in range(0, e4m3.shape[0], rows_per_chunk):
        out[r:r + rows_per_chunk] = table[e4m3[r:r + rows_per_chunk].long()]
    bad = out == _NOT_A_SCALE
    if bad.any():
        row, block = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{int(bad.sum())} NVFP4 block scale(s) are negative or NaN (first: row {row}, block {block}, "
                         f"byte 0x{int(e4m3[row, block]):02X}); block scales must be finite and non-negative")
    return out


def _spread_words(words: torch.Tensor) -> torch.Tensor:
    """Checkpoint-order NVFP4 words (code i in bits 4i..4i+3) -> the layout of ``CODE_BITS``."""
    return spread_bits(words, CODE_BITS)


def _gather_words(words: torch.Tensor) -> torch.Tensor:
    """The inverse of ``_spread_words``."""
    return gather_bits(words, CODE_BITS)


def _checkpoint_rows(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole row blocks of ``codes`` / ``scales`` -> the checkpoint's row-major, nibble-order bytes."""
    table = E4M3_OF_SCALE_BYTE.to(scales.device)
    return _gather_words(untile_words(codes)).view(torch.uint8), table[untile_scales(scales).long()]


def checkpoint_order(p: NVFP4Prepacked) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes (N_pad, K_pad // 2) uint8, scales (N_pad, K_pad // 16) uint8 E4M3 bytes) in the checkpoint's own
    row-major order and nibble order, padding included."""
    return _checkpoint_rows(p.codes, p.scales)


def _crop(p: NVFP4Prepacked, row0: int) -> NVFP4Weight:
    """The weight of rows ``row0 .. row0 + N`` (``row0``: 0 or ``up_offset``, a row-block boundary); only
    those row blocks are converted back."""
    n, k = p.out_features, p.in_features
    end = row0 + round_up(n, TILE_ROWS)
    codes, scales = _checkpoint_rows(p.codes[row0:end], p.scales[row0:end])
    packed = codes[:n, : k // 2].contiguous()
    scales = scales[:n, : k // GROUP_SIZE].contiguous().view(torch.float8_e4m3fn)
    return NVFP4Weight(packed, scales, p.global_scale.reshape(()).clone())


def unprepack_nvfp4(p: NVFP4Prepacked) -> NVFP4Weight:
    """The inverse of ``prepack_nvfp4`` (crops the padding): the same codes and scale bytes, except that a block
    with a zero scale reads back with zero codes and a +0 scale (the same values). For a gated prepack: the gate."""
    return _crop(p, 0)


def unprepack_nvfp4_gated(p: NVFP4Prepacked) -> tuple[NVFP4Weight, NVFP4Weight]:
    """The inverse of ``prepack_nvfp4_gated`` (as ``unprepack_nvfp4``): (gate, up)."""
    if not p.gated:
        raise ValueError("not a gated prepack")
    return _crop(p, 0), _crop(p, p.up_offset)

