"""Launch configs of the decode kernels: the entry of a launch table measured on real GPUs
(``dispatch.launch_tables``: the JSON files under ``dispatch/tables/``, and ``ANYFP4_MMA_TABLE``), a heuristic
for other shapes and GPUs."""

from __future__ import annotations

from dataclasses import replace

from ..kernels.cuda import nvrtc
from ..kernels.cuda.weight_mma_defines import STEP_K
from ..kernels.cuda.weight_mma_geometry import (STAGE_BYTES, k_slices, k_warps_refusal, least_shared_bytes,
                                               rows_per_block)
from .configs import DecodeConfig, FusedConfig, MMAConfig
from .limits import DECODE_ROWS
from .launch_tables import MMAKey, builtin_decode_table, builtin_mma_table, m_bucket, user_mma_table


def smallest_split(n_tiles: int, k_tiles: int, min_programs: int) -> int:
    """The smallest split-K dividing ``k_tiles`` that launches at least ``min_programs`` programs
    (all of K when even that is too few)."""
    for d in range(1, k_tiles + 1):
        if k_tiles % d == 0 and n_tiles * d >= min_programs:
            return d
    return k_tiles


def heuristic_config(n: int, k_pad: int, sms: int) -> DecodeConfig:
    """Tensor-core decode kernel: two programs per multiprocessor at least."""
    block_n, block_k = (64 if n >= 4096 else 32), 256
    split = smallest_split(-(-n // block_n), k_pad // block_k, 2 * sms)
    return DecodeConfig(block_n=block_n, block_k=block_k, split_k=split, num_warps=4, num_stages=3)


def gemv_heuristic_config(n: int, k_pad: int, sms: int) -> DecodeConfig:
    """M = 1 GEMV kernel: 8 rows x 1024 K per program (best on the H200), four programs per
    multiprocessor at least."""
    block_n, block_k = 8, (1024 if k_pad % 1024 == 0 else 256)
    split = smallest_split(-(-n // block_n), k_pad // block_k, 4 * sms)
    return DecodeConfig(block_n=block_n, block_k=block_k, split_k=split, num_warps=2, num_stages=1)


def decode_config(sm: int, sms: int, n: int, k: int, k_pad: int, m: int) -> DecodeConfig:
    """The Triton decode kernel's config: the table entry for this GPU, shape and M bucket, else the heuristic."""
    return builtin_decode_table().get((sm, k, n, m_bucket(m))) or heuristic_config(n, k_pad, sms)


FUSED_FEW_TILES = 64  # weight-row tiles of a call up to 64 rows below which its K is split ...
FUSED_SPLIT_PROGRAMS = 192  # ... into up to four slices, the fewest that launch this many programs


FUSED_SWAP_MIN_SM = 90  # from sm_90 on the 128 x 128 tiles multiply w @ x^T (wgmma's register operand)


def fused_config(m: int, weight_rows: int, k: int, sm: int = 0) -> FusedConfig:
    """NVFP4's fused prefill GEMM tiles for ``m`` rows of a ``weight_rows`` x ``k`` weight (a gated weight's rows: both
    halves; ``k`` as prepacked, a multiple of 128), from the H100 sweeps (benchmarks/probes/fused_configs.py,
    results/fused_configs_h100.json and fused_configs_split_h100.json): up to 64 rows tiles of 64 rows and 64
    weight rows (four warps; 128 weight rows on weights of K >= 8192 and >= 16384 rows:
    28672x8192 at 48 rows 110 against 160 us), K split in 2 or 4 where the weight has at most FUSED_FEW_TILES tiles
    (4096x14336 at 64 rows, 64 tiles: 39.1 us in 4 slices, 58.5 in 2, 99.5 in one; bf16 46.1); up to 128 rows
    128 x 128 (eight warps) on weights of >= 14336 rows and K < 12288, else 64 x 64 (4096x14336 at 128 rows: 100
    against 180 us); above, 128 x 128 (tiles of 256 rows were no faster: 4096x14336 at 1024 rows 325 against 360
    us, 14336x4096 380 against 354, gate + up 1181 against 672). On ``sm`` >= FUSED_SWAP_MIN_SM the 128 x 128 tiles
    take the decoded tile as the multiply's register operand (``swap_ab``: H100, results/fused_swap_h100.json, gate +
    up at 128 / 256 / 1024 rows 92.8 / 180.4 / 627.2 us against 101.5 / 195.9 / 679.7, 14336x4096 53.7 / 103.6 /
    347.8 against 55.0 / 105.1 / 358.6)."""
    if m <= 64:
        block_n = 128 if k >= 8192 and weight_rows >= 16384 else 64
        tiles, k_tiles, split = -(-weight_rows // block_n), k // 128, 1
        if tiles <= FUSED_FEW_TILES:
            while split < 4 and tiles * split < FUSED_SPLIT_PROGRAMS and k_tiles % (2 * split) == 0:
                split *= 2
        return FusedConfig(block_m=64, block_n=block_n, num_warps=4, split_k=split)
    if m <= 128 and not (weight_rows >= 14336 and k < 12288):
        return FusedConfig(block_m=64, block_n=64, num_warps=4)
    return FusedConfig(swap_ab=sm >= FUSED_SWAP_MIN_SM)


def mma_heuristic_config(n_rows: int, k_pad: int, m: int, sms: int, gated: bool, fmt: str = "nvfp4") -> MMAConfig:
    """Eight warps of 16 rows per block; split-K to about four blocks per multiprocessor (a power of two,
    at least four steps per block, fp32 partials under a fifth of the weight bytes)."""
    c = MMAConfig()
    blocks = -(-n_rows // rows_per_block(c))
    steps = k_pad // STEP_K[fmt]
    weight_bytes = k_pad * (0.5625 if fmt == "nvfp4" else 1.0)
    split = 1
    while (blocks * split * 2 <= 4 * sms * 1.5 and steps // (split * 2) >= 4
           and (split * 2) * m * 8 * (2 if gated else 1) <= 0.2 * weight_bytes):
        split *= 2
    return MMAConfig(split_k=split, depth=4 if blocks * split >= 2 * sms and steps // split >= 16 else 2)


def spread_slices(c: MMAConfig, slices: int, steps: int, m: int, gated: bool, fmt: str) -> MMAConfig:
    """``c`` with ``slices`` K slices in all: as many of them K warps as ``c`` has and the kernel takes
    (``weight_mma.k_warps_refusal``, within ``STAGE_BYTES`` of shared memory), halved until it does, the rest
    split-K blocks. Which it is changes no bits (``weight_mma.k_slices``)."""
    kw = c.kw
    while kw > 1:
        spread = replace(c, kw=kw, split_k=slices // kw)
        if (slices % kw == 0 and k_warps_refusal(spread, steps) is None
                and least_shared_bytes(spread, m, gated, fmt) <= STAGE_BYTES):
            return spread
        kw //= 2
    return replace(c, kw=1, split_k=slices)


def _mma_entry(key: MMAKey) -> MMAConfig | None:
    from ..env import extra_mma_table_path

    path = extra_mma_table_path()
    extra = user_mma_table(path).get(key) if path else None
    return extra or builtin_mma_table().get(key)


def mma_config(sm: int, sms: int, fmt: str, gated: bool, n: int, k: int, k_pad: int, m: int,
               split_k: int = 0) -> MMAConfig:
    """The entry of ``ANYFP4_MMA_TABLE`` (a sweep file) or of the launch table for this GPU, shape and M
    bucket, else the heuristic (always 128-row blocks, which every prepack's row padding covers). The K slices
    (split-K blocks x K warps) always come from M = 1 — they alone set the order in which a row's partial sums are
    added, so every M gives each row the bits M = 1 gives it (a verify pass of k + 1 rows computes what k + 1
    single-token steps would) — unless ``split_k`` (> 0) names them for every M (a tensor-parallel shard's). An
    entry's warpgroup mmas become mma.sync where NVRTC cannot compile them (the same sums either way)."""
    c = (_mma_entry((sm, fmt, gated, k, n, m_bucket(min(m, DECODE_ROWS))))  # a wider prefill chunk: the widest bucket
         or mma_heuristic_config(n, k_pad, m, sms, gated, fmt))
    if c.wgmma and not nvrtc.compiles_sm90a():  # the mma.sync launch of the same config adds the same sums
        c = replace(c, wgmma=0)
    if not split_k:
        one = _mma_entry((sm, fmt, gated, k, n, 1)) or mma_heuristic_config(n, k_pad, 1, sms, gated, fmt)
        split_k = k_slices(one)
    return spread_slices(c, split_k, k_pad // STEP_K[fmt], m, gated, fmt)


def experts_mma_config(k_pad: int, fmt: str) -> MMAConfig:
    """A grouped expert launch of the CUDA decode kernel (one activation row a pair, no split-K): blocks of four
    warps, each its own 16-row tile over the whole K with four steps of code words in flight. On an H100 (random
    Qwen3-30B-A3B experts, ``benchmarks/kernels/experts.py --sweep``, ``results/experts_h100.json``) that beat every
    split of K over K warps and every deeper or wider block tried, NVFP4 and FP8, one token and 16. A function of
    the shape alone (here: of nothing), so a pair's bits do not depend on how many pairs a step has."""
    return MMAConfig(mt=1, warps=4, split_k=1, kw=1, depth=4)
