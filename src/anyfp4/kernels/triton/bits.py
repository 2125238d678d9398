"""Integer bit decoding shared by every kernel (no FP4/FP8 conversion instructions, so it compiles
for sm_70 .. sm_90). Each helper is exact; ``formats/`` holds the reference it is tested against.
The tile geometry is ``packing/layout.py``'s, as constexpr globals (shifts and masks: its sizes are
powers of two)."""

import triton
import triton.language as tl

from ...packing import layout


def _log2(v: int) -> int:
    if v <= 0 or v & (v - 1):
        raise ValueError(f"the Triton offsets need power-of-two tile sizes, got {v}")
    return v.bit_length() - 1


TILE_ROWS = tl.constexpr(layout.TILE_ROWS)
TILE_WORDS = tl.constexpr(layout.TILE_WORDS)
TILE_BLOCKS = tl.constexpr(layout.TILE_BLOCKS)
TILE_HALF_ROWS = tl.constexpr(layout.TILE_HALF_ROWS)
_ROW_SHIFT = tl.constexpr(_log2(layout.TILE_ROWS))
_WORD_SHIFT = tl.constexpr(_log2(layout.TILE_WORDS))
_BLOCK_SHIFT = tl.constexpr(_log2(layout.TILE_BLOCKS))
_HALF_SHIFT = tl.constexpr(_log2(layout.TILE_HALF_ROWS))


@triton.jit
def tiled_word_offset(rows, words, words_per_row):
    """``layout.tiled_word_offset`` for a (rows, words) grid: where word ``words`` (k // 8; FP8 k // 4) of row
    ``rows`` is stored. ``words`` must run along the last axis from a multiple of TILE_WORDS in steps of one,
    TILE_WORDS or more of them: each run is then contiguous and aligned, which the hints tell the compiler (so it
    keeps 16-byte loads)."""
    off = ((rows >> _ROW_SHIFT) * (TILE_ROWS * words_per_row) + (words >> _WORD_SHIFT) * (TILE_ROWS * TILE_WORDS)
           + (rows & (TILE_ROWS - 1)) * TILE_WORDS + (words & (TILE_WORDS - 1)))
    tl.static_assert(off.shape[1] % TILE_WORDS == 0, "tiled code words are read a tile row or more at a time")
    return tl.max_contiguous(tl.multiple_of(off, (1, TILE_WORDS)), (1, TILE_WORDS))


@triton.jit
def tiled_scale_offset(rows, blocks, blocks_per_row):
    """``layout.tiled_scale_offset``: where block scale ``blocks`` (k // 16) of row ``rows`` is stored."""
    inside = ((rows & (TILE_HALF_ROWS - 1)) * (2 * TILE_BLOCKS) + ((blocks & (TILE_BLOCKS - 1)) >> 1) * 4
              + ((rows & (TILE_ROWS - 1)) >> _HALF_SHIFT) * 2 + (blocks & 1))
    return ((rows >> _ROW_SHIFT) * (TILE_ROWS * blocks_per_row) + (blocks >> _BLOCK_SHIFT) * (TILE_ROWS * TILE_BLOCKS)
            + inside)


@triton.jit
def _shr(x, s: tl.constexpr):
    if s >= 0:
        return x >> s
    return x << (-s)


@triton.jit
def _bits_to(words, src: tl.constexpr, dst: tl.constexpr, n: tl.constexpr):
    """``n`` bits of ``words`` from bit ``src`` moved to bit ``dst`` (others zero). An arithmetic right shift of
    int32 is harmless: the copied sign bits land at ``32 - shift`` and up, above ``dst + n``."""
    mask: tl.constexpr = ((1 << n) - 1) << dst
    if mask >= 2147483648:  # the sign bit: as an int32 literal
        out = _shr(words, src - dst) & (mask - 4294967296)
    else:
        out = _shr(words, src - dst) & mask
    return out


@triton.jit
def _code_fp16(words, m0: tl.constexpr, m1: tl.constexpr, m2: tl.constexpr, sign: tl.constexpr):
    """The code with magnitude bits at ``m0, m1, m2`` and sign at ``sign`` -> fp16 bits, magnitude at 9-11, sign 15."""
    if m1 == m0 + 1 and m2 == m0 + 2:
        bits = _bits_to(words, m0, 9, 3)
    elif m2 == m1 + 1:
        bits = _bits_to(words, m0, 9, 1) | _bits_to(words, m1, 10, 2)
    else:
        bits = _bits_to(words, m0, 9, 1) | _bits_to(words, m1, 10, 1) | _bits_to(words, m2, 11, 1)
    return bits | _bits_to(words, sign, 15, 1)


@triton.jit
def e2m1_fp16_at(words, i: tl.constexpr):
    """Code ``i`` (0..7, checkpoint order) of prepacked words -> fp16 ``e2m1 * 2^-14`` (subnormal 0.5
    included): its bits gathered from where ``packing.nvfp4.CODE_BITS`` puts them (the positions below are
    that table's; the kernels' reference tests fail if the two part)."""
    if i == 0:
        bits = _code_fp16(words, 4, 5, 6, 13)
    elif i == 1:
        bits = _code_fp16(words, 0, 1, 2, 9)
    elif i == 2:
        bits = _code_fp16(words, 26, 27, 28, 3)
    elif i == 3:
        bits = _code_fp16(words, 30, 7, 8, 15)
    elif i == 4:
        bits = _code_fp16(words, 20, 21, 22, 29)
    elif i == 5:
        bits = _code_fp16(words, 16, 17, 18, 25)
    elif i == 6:
        bits = _code_fp16(words, 10, 11, 12, 19)
    else:
        bits = _code_fp16(words, 14, 23, 24, 31)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


_PAIR_MASK = tl.constexpr(0x81C081C0 - (1 << 32))  # bf16 bits 6-8 and 15 of both halves, as an int32
_PAIR3_MASK = tl.constexpr(0x81808180 - (1 << 32))
_SIGNS = tl.constexpr(0x80008000 - (1 << 32))
_HIGH_HALF = tl.constexpr(0xFFFF0000 - (1 << 32))
_FP8_PAIR_MASK = tl.constexpr(0x87F087F0 - (1 << 32))
_FP8_LOW_MASK = tl.constexpr(0x80F080F0 - (1 << 32))


@triton.jit
def _rotl(w, s: tl.constexpr):
    """A 32-bit rotation of int32 words (the arithmetic right shift's copied sign bits masked off)."""
    return (w << s) | ((w >> (32 - s)) & ((1 << s) - 1))


@triton.jit
def _pair_bf16_bits(w, p: tl.constexpr):
    """Codes p and p + 4 of prepacked words as the two halves of an int32: bf16 bits of ``e2m1 * 2^-126`` (code
    1 subnormal), where ``packing.nvfp4.CODE_BITS`` places them for the CUDA kernel's ``decode_pair``: pair 0's
    magnitudes sit at 4-6 / 20-22 (signs 13 / 29), pair 1's at 0-2 / 16-18 (9 / 25), pair 2's at 26-28 / 10-12
    (3 / 19), pair 3's magnitude bits 1-2 and signs in place, bit 0 at 30 / 14."""
    if p == 0:
        bits = (w << 2) & _PAIR_MASK
    elif p == 1:
        bits = (w << 6) & _PAIR_MASK
    elif p == 2:
        bits = _rotl(w, 12) & _PAIR_MASK
    else:
        bits = (w & _PAIR3_MASK) | (_rotl(w, 8) & 0x00400040)
    return bits


@triton.jit
def _pair_bits(w, p: tl.constexpr, dtype: tl.constexpr):
    bits = _pair_bf16_bits(w, p)
    if dtype == tl.float16:  # the magnitude moved up three bits: e2m1 * 2^-14
        bits = ((bits << 3) & 0x0E000E00) | (bits & _SIGNS)
    return bits


@triton.jit
def _halves(bits, dtype: tl.constexpr, WIDE: tl.constexpr):
    """The two 16-bit halves of int32 ``bits`` as ``dtype`` values; WIDE (bf16 only): as the float32 values of
    those bf16 bits (the CPU interpreter's bf16 flushes subnormals)."""
    if WIDE:
        lo = (bits << 16).to(tl.float32, bitcast=True)
        hi = (bits & _HIGH_HALF).to(tl.float32, bitcast=True)
    else:
        lo = bits.to(tl.int16).to(dtype, bitcast=True)
        hi = (bits >> 16).to(tl.int16).to(dtype, bitcast=True)
    return lo, hi


@triton.jit
def decode_words_pairs(words, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, dtype: tl.constexpr,
                       WIDE: tl.constexpr = False):
    """(BLOCK_N, BLOCK_K // 8) prepacked words -> (BLOCK_N, BLOCK_K) codes in checkpoint order, two per integer
    operation: bf16 ``e2m1 * 2^-126`` or fp16 ``e2m1 * 2^-14`` (the magnitude three bits up); WIDE: the bf16
    values as float32. Scaled by ``block_scale_pair`` they become ``e2m1 * bs * 2^-14``, exactly."""
    c0, c4 = _halves(_pair_bits(words, 0, dtype), dtype, WIDE)
    c1, c5 = _halves(_pair_bits(words, 1, dtype), dtype, WIDE)
    c2, c6 = _halves(_pair_bits(words, 2, dtype), dtype, WIDE)
    c3, c7 = _halves(_pair_bits(words, 3, dtype), dtype, WIDE)
    # join stacks on a new last axis: this nesting puts code l + 4a + 2b at [a, b, l], i.e. in order
    x = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(x, (BLOCK_N, BLOCK_K))


@triton.jit
def block_scale_pair(b, dtype: tl.constexpr, WIDE: tl.constexpr = False):
    """Prepacked block-scale bytes -> the factor that makes ``decode_words_pairs``' codes ``e2m1 * bs * 2^-14``:
    fp16 ``bs`` or bf16 ``bs * 2^112``, exactly (the exponent field ``e + 10`` moved up by 5 or by 229); WIDE:
    the bf16 value as float32."""
    if dtype == tl.float16:
        s = ((b.to(tl.int16) << 7) + (5 << 10)).to(dtype, bitcast=True)
    elif WIDE:
        s = (((b.to(tl.int32) << 4) + (229 << 7)) << 16).to(tl.float32, bitcast=True)
    else:
        s = ((b.to(tl.int16) << 4) + (229 << 7)).to(dtype, bitcast=True)
    return s


@triton.jit
def fp8_fp16_at(words, i: tl.constexpr):
    """Value ``i`` (0..3, k = 4j + i) of FP8 prepacked words -> fp16 ``e4m3 * 2^-8`` (finite values, subnormals
    included): its magnitude moved to fp16 bits 7-13 and its sign to 15 from where ``packing.fp8.BYTE_BITS``
    puts them. Arithmetic shifts of int32 are harmless: every mask lies below the copied sign bits."""
    if i == 0:  # magnitude 4-10, sign 15
        bits = ((words << 3) & 0x3F80) | (words & 0x8000)
    elif i == 1:  # magnitude 0-3 and 28-30, sign 11
        bits = ((words << 7) & 0x0780) | ((words >> 17) & 0x3800) | ((words << 4) & 0x8000)
    elif i == 2:  # magnitude 20-26, sign 31
        bits = ((words >> 13) & 0x3F80) | ((words >> 16) & 0x8000)
    else:  # magnitude 16-19 and 12-14, sign 27
        bits = ((words >> 9) & 0x0780) | ((words >> 1) & 0x3800) | ((words >> 12) & 0x8000)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def decode_fp8_pairs(words, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(BLOCK_N, BLOCK_K // 4) FP8 prepacked words -> (BLOCK_N, BLOCK_K) float32 ``e4m3 * 2^-120`` in k order,
    exactly (subnormals included), two values per integer operation: where ``packing.fp8.BYTE_BITS`` places them
    for the CUDA kernel's ``decode_e4m3_pair``, values k0 / k2 sit as bf16 bits (magnitude 4-10, sign 15 of each
    half), k1 / k3 move there with a shift (bits 0-3 / 16-19 and signs 11 / 27) and a rotation (28-30 / 12-14)."""
    k0, k2 = _halves(words & _FP8_PAIR_MASK, tl.bfloat16, True)
    k1, k3 = _halves(((words << 4) & _FP8_LOW_MASK) | (_rotl(words, 12) & 0x07000700), tl.bfloat16, True)
    # join stacks on a new last axis: this nesting puts value 2a + b at [a, b], i.e. in k order
    return tl.reshape(tl.join(tl.join(k0, k2), tl.join(k1, k3)), (BLOCK_N, BLOCK_K))


@triton.jit
def fp8_checkpoint_words(words):
    """FP8 prepacked words -> checkpoint-order words (value i of k = 4j + i as E4M3 bits 8i .. 8i + 7): the inverse
    of ``packing.fp8.BYTE_BITS`` (whose positions these are)."""
    v0 = _bits_to(words, 4, 0, 7) | _bits_to(words, 15, 7, 1)
    v1 = _bits_to(words, 0, 8, 4) | _bits_to(words, 28, 12, 3) | _bits_to(words, 11, 15, 1)
    v2 = _bits_to(words, 20, 16, 7) | _bits_to(words, 31, 23, 1)
    v3 = _bits_to(words, 16, 24, 4) | _bits_to(words, 12, 28, 3) | _bits_to(words, 27, 31, 1)
    return v0 | v1 | v2 | v3
