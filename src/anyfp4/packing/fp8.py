"""FP8 (E4M3) prepack: checkpoint FP8 tensors -> the resident layout the FP8 kernels read, and its inverse.

Prepack (``FP8Prepacked``): ``codes`` (N_pad, K_pad // 4) int32, word ``j`` of a row holding the
E4M3 values of ``k = 4j .. 4j + 3``, the words stored in the tiles of ``layout.py`` (16 rows x 16
words, 64 k) like the NVFP4 prepack's (one contiguous 1 KiB read per warp and step of the CUDA
kernel); ``scales`` (N_pad,) float32 per output channel (a per-tensor scale is broadcast, so
fused projections concatenate exactly); padding holds zeros. A gated prepack stacks gate and up,
up starting at row ``up_offset``.

Inside a word the bits of the four values are placed (``BYTE_BITS``) for the CUDA kernel's bf16
decode, which forms two bf16 pairs, (k0, k2) and (k1, k3), each value's 7 magnitude bits at 4-10 and
its sign at 15 of a half: pair (k0, k2) is ``w & 0x87F087F0`` (k0 stored there as is, k2 16 bits up),
pair (k1, k3) is ``((w << 4) & 0x80F080F0) | (rotl(w, 12) & 0x07000700)`` (four operations; no
layout makes both pairs one shift and one mask). The magnitude bits read as bf16 are
``e4m3 * 2^-120`` (subnormals included).

Pure torch (no Triton), so the CPU path runs without Triton installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats.fp8 import FP8Weight
from .layout import K_ALIGN, ROW_ALIGN, TILE_ROWS, gather_bits, round_up, spread_bits, tile_words, untile_words

K_PER_WORD = 4  # E4M3 values per int32 word: a storage tile row (``layout.TILE_WORDS``) holds 64 k
# for value i (k = 4j + i) of word j: the word bit holding each of its E4M3 bits 0..7 (bit 7: the sign)
BYTE_BITS = ((4, 5, 6, 7, 8, 9, 10, 15), (0, 1, 2, 3, 28, 29, 30, 11),
             (20, 21, 22, 23, 24, 25, 26, 31), (16, 17, 18, 19, 12, 13, 14, 27))


def spread_fp8_words(words: torch.Tensor) -> torch.Tensor:
    """Checkpoint-order words (value i in bits 8i .. 8i + 7) -> the layout of ``BYTE_BITS``."""
    return spread_bits(words, BYTE_BITS)


def gather_fp8_words(words: torch.Tensor) -> torch.Tensor:
    """The inverse of ``spread_fp8_words``."""
    return gather_bits(words, BYTE_BITS)


@dataclass(frozen=True)
class FP8Prepacked:
    codes: torch.Tensor  # (N_pad, K_pad // 4) int32
    scales: torch.Tensor  # (N_pad,) float32
    out_features: int
    in_features: int
    up_offset: int = 0

    @property
    def gated(self) -> bool:
        return self.up_offset > 0


def _pad(weight: FP8Weight, device) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    n_pad, k_pad = round_up(n, ROW_ALIGN), round_up(k, K_ALIGN)
    codes = torch.zeros(n_pad, k_pad, dtype=torch.uint8, device=device)
    codes[:n, :k] = weight.weight.to(device).view(torch.uint8)
    nan = (codes & 0x7F) == 0x7F  # E4M3 has no infinities; 0x7F / 0xFF are NaN (prepack_nvfp4 refuses NaN scales)
    if nan.any():
        row, col = (int(i) for i in nan.nonzero()[0])
        raise ValueError(f"{int(nan.sum())} FP8 weight value(s) are NaN (first: row {row}, column {col}); FP8 weights "
                         f"must be finite")
    scale = weight.scale.float().reshape(-1).to(device)
    if not torch.isfinite(scale).all() or (scale <= 0).any():
        raise ValueError("FP8 weight scales must be finite and positive")
    scales = torch.zeros(n_pad, dtype=torch.float32, device=device)
    scales[:n] = scale.expand(n) if scale.numel() == 1 else scale
    return tile_words(spread_fp8_words(codes.view(torch.int32))), scales


def prepack_fp8(weight: FP8Weight, device=None) -> FP8Prepacked:
    device = torch.device(device) if device is not None else weight.weight.device
    codes, scales = _pad(weight, device)
    return FP8Prepacked(codes, scales, weight.shape[0], weight.shape[1])


def prepack_fp8_gated(gate: FP8Weight, up: FP8Weight, device=None) -> FP8Prepacked:
    if gate.shape != up.shape:
        raise ValueError(f"gate {gate.shape} and up {up.shape} must have the same shape")
    device = torch.device(device) if device is not None else gate.weight.device
    (gc, gs), (uc, us) = _pad(gate, device), _pad(up, device)
    return FP8Prepacked(torch.cat([gc, uc]), torch.cat([gs, us]), gate.shape[0], gate.shape[1], up_offset=gc.shape[0])


def checkpoint_words(codes: torch.Tensor) -> torch.Tensor:
    """Whole row blocks of prepacked ``codes`` -> the checkpoint's row-major words (E4M3 bytes in k order)."""
    return gather_fp8_words(untile_words(codes))


def unprepack_fp8(p: FP8Prepacked, row0: int = 0) -> FP8Weight:
    """The exact inverse of the prepack (scales per channel); ``row0 = up_offset`` gives the up half."""
    n, k = p.out_features, p.in_features
    rows = checkpoint_words(p.codes[row0:row0 + round_up(n, TILE_ROWS)])  # this half's row blocks
    weight = rows.view(torch.uint8)[:n, :k].contiguous().view(torch.float8_e4m3fn)
    return FP8Weight(weight, p.scales[row0:row0 + n].clone())
