"""A block of the CUDA decode kernel (``weight_mma.cu``) by its config: rows and n8 tiles, K slices and K warps, and
the shared memory it stages activations, K warps' sums and a shared ring in."""

from __future__ import annotations

from ...dispatch.configs import MMAConfig
from .weight_mma_defines import STEP_K, XS_PAD


def n_tiles_for(m: int) -> int:
    return 1 if m <= 8 else 2 if m <= 16 else 4 if m <= 32 else 8


def rows_per_block(c: MMAConfig) -> int:
    return c.warps // c.kw * c.mt * 16


def k_slices(c: MMAConfig) -> int:
    """The K slices a row's sums are made of (split-K blocks x K warps): with a power-of-two split, this number
    alone sets a row's bits (weight_mma.cu), however the slices are spread over blocks and warps."""
    return c.split_k * c.kw


def is_power_of_two(v: int) -> bool:
    return v >= 1 and v & (v - 1) == 0


def k_warps_refusal(c: MMAConfig, steps: int) -> str | None:
    """Why the kernel cannot run ``c``'s K warps over ``steps`` main-loop steps (None: it can): K warps are a power
    of two dividing the warps, and beside more than one they need a power-of-two split-K whose slices divide the
    steps (equal slices, so that the K warps of a block stage together)."""
    if not is_power_of_two(c.kw) or c.warps % c.kw:
        return f"K warps {c.kw} must be a power of two dividing the {c.warps} warps"
    if c.kw > 1 and (not is_power_of_two(c.split_k) or steps % k_slices(c)):
        return (f"K warps {c.kw} need a power-of-two split-K (got {c.split_k}) whose {k_slices(c)} slices divide the "
                f"{steps} steps")
    return None


def reduction_bytes(c: MMAConfig, m: int, gated: bool) -> int:
    """Shared memory in which a block's K warps meet (none for one K warp)."""
    tiles = c.mt * (2 if gated else 1)
    return c.warps // c.kw * (c.kw - 1) * tiles * n_tiles_for(m) * 4 * 32 * 4


def ring_bytes(c: MMAConfig, gated: bool, fmt: str) -> int:
    """A shared ring's bytes (none in registers): per warp, step and tile 32 lanes' 32 code bytes (+ 4 scale bytes)."""
    return c.shared_ring * c.warps * c.depth * c.mt * (2 if gated else 1) * 32 * (32 if fmt == "fp8" else 36)


def shared_bytes(c: MMAConfig, m: int, gated: bool, fmt: str, kc: int) -> int:
    """Dynamic shared memory of a block of config ``c`` staging ``kc`` k per round: each K warp's rows, or what
    its K warps meet in, where more; then its shared ring (16-byte aligned, as weight_mma.cu places it)."""
    staged = max(c.kw * stage_bytes_for(m, kc, fmt, c.wgmma), reduction_bytes(c, m, gated))
    return -(-staged // 16) * 16 + ring_bytes(c, gated, fmt) if c.shared_ring else staged


def least_shared_bytes(c: MMAConfig, m: int, gated: bool, fmt: str) -> int:
    """The shared memory a block of config ``c`` needs at the least: one pass of its ring staged per round."""
    return shared_bytes(c, m, gated, fmt, c.depth * STEP_K[fmt])


# Shared memory for one block's staged activations (capped by the GPU's opt-in limit): more k per round means
# fewer __syncthreads rounds for M > 8 (H200, results/smem_stage_h200.json: 32 -> 128 KiB took M = 32 on
# 14336x4096 from 49.7 to 42.8 us and M = 16 from 30.1 to 28.1 us, bits unchanged).
STAGE_BYTES = 128 * 1024


def stage_bytes_for(m: int, kc: int, fmt: str = "nvfp4", wgmma: int = 0) -> int:
    """Dynamic shared memory of a block staging ``kc`` k of ``m`` activation rows (``wgmma``: all 8 x n8-tile rows of
    the B operand, unpadded, as weight_mma.cu's wgmma_word places them)."""
    if wgmma:
        return 8 * n_tiles_for(m) * kc * 2
    return m * (kc // 2 + XS_PAD[fmt]) * 4


def stage_k(m: int, stage_bytes: int | None = None, least: int = 128, fmt: str = "nvfp4", wgmma: int = 0) -> int:
    """k staged in shared memory per round: a power of two in [``least``, 4096] (``least``: a power of two, the k
    of one pass of the kernel's ring, which rounds must be whole passes of), at most ``STAGE_BYTES`` unless even
    ``least`` is more."""
    cap = stage_bytes or STAGE_BYTES
    kc = 4096
    while kc > least and stage_bytes_for(m, kc, fmt, wgmma) > cap:
        kc //= 2
    return kc
