"""Integer bit decoding shared by every kernel (no FP4/FP8 conversion instructions, so it compiles
for sm_70 .. sm_90). Each helper is exact; ``formats/`` holds the reference it is tested against."""

import triton
import triton.language as tl


@triton.jit
def unpack_words(words, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(BLOCK_N, BLOCK_K // 8) int32 words of 8 E2M1 codes (code i in bits 4i..4i+3) ->
    (BLOCK_N, BLOCK_K) codes in checkpoint order."""
    shifts = tl.arange(0, 8) * 4
    return tl.reshape((words[:, :, None] >> shifts[None, None, :]) & 0xF, (BLOCK_N, BLOCK_K))


@triton.jit
def e2m1_fp16(c):
    """E2M1 codes (low 4 bits of ``c``) -> fp16 ``e2m1 * 2^-14`` (subnormal 0.5 included)."""
    return (((c & 7) << 9) | ((c & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def block_scale_fp16(b):
    """Non-negative E4M3 block-scale bytes -> fp16 ``bs * 2^-8`` (subnormals included)."""
    return (b.to(tl.int16) << 7).to(tl.float16, bitcast=True)


@triton.jit
def e4m3_fp16(b):
    """Signed E4M3 bytes (low 8 bits of ``b``) -> fp16 ``e4m3 * 2^-8`` (finite values)."""
    return (((b & 0x7F) << 7) | ((b & 0x80) << 8)).to(tl.int16).to(tl.float16, bitcast=True)
