"""The constants ``weight_mma.cu`` is compiled with, worked out here once and handed to the source as #defines by
``weight_mma.plan_launch`` (the GPU build through NVRTC and the tests' host build alike), so the C++ spells none
of them:

- the storage tile (``packing/layout.py``): TILE_ROWS, TILE_WORDS, TILE_BLOCKS;
- STEP, the k of one main-loop step: one tile row of words (NVFP4 128 k, FP8 64 k);
- X_T, X_Q, XS_PAD: where the staged activations lie in shared memory (``STAGING``);
- the decode's numbers, from the encodings of ``formats/`` and ``packing/``: SCALE_PERM_BASE, SCALE_PERM_STEP,
  SCALE_MUL and SCALE_ADD (``scale_pair``: a prepacked scale byte -> fp16 / bf16), FP8_BF16_RESCALE (the bf16
  multiplier of ``decode_e4m3_pair``) and UNIT (the power of two the epilogue restores).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...packing import fp8 as fp8_packing
from ...packing import nvfp4 as nvfp4_packing
from ...packing.layout import TILE_BLOCKS, TILE_ROWS, TILE_WORDS

K_PER_WORD = {"nvfp4": nvfp4_packing.K_PER_WORD, "fp8": fp8_packing.K_PER_WORD}
STEP_K = {fmt: TILE_WORDS * k for fmt, k in K_PER_WORD.items()}  # k per main-loop step


@dataclass(frozen=True)
class Staging:
    """A thread's B fragments for word q of a step lie at ``t * x_t + q * x_q`` words from its row's step start;
    rows are ``kc / 2 + pad`` words apart. Chosen so that a warp's fragment loads meet no bank conflict: NVFP4
    (16-byte loads, a quarter warp = rows g, g + 1 x t = 0..3) puts the four t of a word side by side and rows 16
    words (mod 32) apart; FP8 (8-byte loads, a half warp = rows g..g + 3 x t) keeps t 8 words apart and makes the
    row stride's half odd (rows 8-byte aligned)."""
    x_t: int
    x_q: int
    pad: int


STAGING = {"nvfp4": Staging(x_t=4, x_q=16, pad=16), "fp8": Staging(x_t=8, x_q=2, pad=2)}
XS_PAD = {fmt: s.pad for fmt, s in STAGING.items()}  # words per staged row beyond kc / 2


@dataclass(frozen=True)
class Half:
    """A 16-bit float format as the decode builds its bits: mantissa width and exponent bias."""
    mantissa_bits: int
    bias: int

    def bits(self, power: int) -> int:
        """The bits of ``2^power`` (a normal value)."""
        return (self.bias + power) << self.mantissa_bits


HALVES = {"fp16": Half(10, 15), "bf16": Half(7, 127)}
# The weight values entering the mma, as powers of two times the true values (the .cu comments say why):
# NVFP4 codes decode to e2m1 * 2^CODE_POWER and their block scales to bs * 2^SCALE_POWER (fp16: an exact fp16
# product; bf16: e2m1 * bs * 2^-8, a normal bf16, far from float32 subnormals once times the activations);
# FP8 values decode to e4m3 * 2^VALUE_POWER, and bf16 multiplies them by 2^FP8_BF16_POWER.
CODE_POWER = {"fp16": -14, "bf16": -126}
SCALE_POWER = {"fp16": 0, "bf16": 118}
VALUE_POWER = {"fp16": -8, "bf16": -120}
FP8_BF16_POWER = 120


def scale_byte_selector(j: int) -> int:
    """``__byte_perm(s, 0, selector)`` giving ``b | b << 16`` for byte j of s (selector 4: a zero byte of 0)."""
    return j | 4 << 4 | j << 8 | 4 << 12


def scale_constants(half: str) -> tuple[int, int]:
    """(SCALE_MUL, SCALE_ADD): ``b * SCALE_MUL + SCALE_ADD`` puts a prepacked scale byte ``(e + SCALE_EXP_BIAS) << 3
    | m`` into both halves as ``bs * 2^SCALE_POWER``: m shifted to the mantissa's top 3 bits, the exponent field
    moved from ``e + SCALE_EXP_BIAS`` to the format's biased ``e + SCALE_POWER``."""
    h = HALVES[half]
    add = h.bits(SCALE_POWER[half]) - (nvfp4_packing.SCALE_EXP_BIAS << h.mantissa_bits)
    return 1 << (h.mantissa_bits - 3), add * 0x10001


def unit(fmt: str, half: str) -> int:
    """What the epilogue multiplies the sums by: the inverse of the powers of two the weights entered with."""
    power = CODE_POWER[half] + SCALE_POWER[half] if fmt == "nvfp4" else VALUE_POWER[half] + (
        FP8_BF16_POWER if half == "bf16" else 0)
    return 1 << -power


def source_defines(fmt: str, half: str) -> dict[str, int]:
    """The defines above for a launch over ``fmt`` ("nvfp4", "fp8") prepacks with ``half`` ("fp16", "bf16")
    activations; ``plan_launch`` adds the launch's own (FP8, BF16, NT, MT, ...)."""
    mul, add = scale_constants(half)
    staging = STAGING[fmt]
    return dict(TILE_ROWS=TILE_ROWS, TILE_WORDS=TILE_WORDS, TILE_BLOCKS=TILE_BLOCKS, STEP=STEP_K[fmt],
                X_T=staging.x_t, X_Q=staging.x_q, XS_PAD=staging.pad,
                SCALE_PERM_BASE=scale_byte_selector(0), SCALE_PERM_STEP=scale_byte_selector(1) - scale_byte_selector(0),
                SCALE_MUL=mul, SCALE_ADD=add, FP8_BF16_RESCALE=HALVES["bf16"].bits(FP8_BF16_POWER) * 0x10001,
                UNIT=unit(fmt, half))
