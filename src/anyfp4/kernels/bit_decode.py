"""Integer bit decoding shared by every kernel (no FP4/FP8 conversion instructions, so it compiles
for sm_70 .. sm_90). Each helper is exact; ``formats/`` holds the reference it is tested against."""

import triton
import triton.language as tl


@triton.jit
def tiled_word_offset(rows, words, words_per_row):
    """``nvfp4_prepack.tiled_word_offset`` for a (rows, words) grid: where word ``words`` (k // 8; FP8 k // 4)
    of row ``rows`` is stored. ``words`` must run along the last axis from a multiple of 16 in steps of one,
    16 or more of them: each run of 16 is then contiguous and 16-aligned, which the hints tell the compiler
    (so it keeps 16-byte loads)."""
    off = (rows >> 4) * (16 * words_per_row) + (words >> 4) * 256 + (rows & 15) * 16 + (words & 15)
    tl.static_assert(off.shape[1] % 16 == 0, "tiled code words are read 16 or more at a time")
    return tl.max_contiguous(tl.multiple_of(off, (1, 16)), (1, 16))


@triton.jit
def tiled_scale_offset(rows, blocks, blocks_per_row):
    """``nvfp4_prepack.tiled_scale_offset``: where block scale ``blocks`` (k // 16) of row ``rows`` is stored."""
    inside = (rows & 7) * 16 + ((blocks & 7) >> 1) * 4 + ((rows & 15) >> 3) * 2 + (blocks & 1)
    return (rows >> 4) * (16 * blocks_per_row) + (blocks >> 3) * 128 + inside


@triton.jit
def _shr(x, s: tl.constexpr):
    if s >= 0:
        return x >> s
    return x << (-s)


@triton.jit
def e2m1_fp16_at(words, i: tl.constexpr):
    """Code ``i`` (0..7, checkpoint order) of prepacked words -> fp16 ``e2m1 * 2^-14`` (subnormal 0.5
    included). Pair ``i % 4`` of ``nvfp4_prepack.WORD_BITS``, bits + 16 for ``i >= 4``; the fp16 bits are
    magnitude at 9-11, sign at 15. Arithmetic shifts of int32 are harmless: every mask lies below the
    copied sign bits."""
    p: tl.constexpr = i % 4
    base: tl.constexpr = 16 * (i // 4)
    if p < 3:
        mag: tl.constexpr = base + 6 - 3 * p
        bits = (_shr(words, mag - 9) & 0x0E00) | (_shr(words, mag + 9 - 15) & 0x8000)
    else:
        bits = (_shr(words, base + 1) & 0x0600) | (_shr(words, base + 3) & 0x0800) | (_shr(words, base - 2) & 0x8000)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def decode_words_fp16(words, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(BLOCK_N, BLOCK_K // 8) prepacked words -> (BLOCK_N, BLOCK_K) fp16 ``e2m1 * 2^-14`` in checkpoint order."""
    c0, c1, c2, c3 = e2m1_fp16_at(words, 0), e2m1_fp16_at(words, 1), e2m1_fp16_at(words, 2), e2m1_fp16_at(words, 3)
    c4, c5, c6, c7 = e2m1_fp16_at(words, 4), e2m1_fp16_at(words, 5), e2m1_fp16_at(words, 6), e2m1_fp16_at(words, 7)
    # join stacks on a new last axis: this nesting puts code l + 4a + 2b at [a, b, l], i.e. in order
    x = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(x, (BLOCK_N, BLOCK_K))


@triton.jit
def block_scale_fp16(b):
    """Non-negative E4M3 block-scale bytes -> fp16 ``bs * 2^-8`` (subnormals included)."""
    return (b.to(tl.int16) << 7).to(tl.float16, bitcast=True)


@triton.jit
def e4m3_fp16(b):
    """Signed E4M3 bytes (low 8 bits of ``b``) -> fp16 ``e4m3 * 2^-8`` (finite values)."""
    return (((b & 0x7F) << 7) | ((b & 0x80) << 8)).to(tl.int16).to(tl.float16, bitcast=True)
