"""Launch choices for the NVFP4 decode kernel: a table measured on real GPUs, a heuristic elsewhere."""

from __future__ import annotations

import functools
from dataclasses import replace


from ..kernels.cuda.weight_mma import STEP_K, rows_per_block
from .configs import DecodeConfig, MMAConfig

# (sm, K, N, M-bucket) -> DecodeConfig, from `benchmarks/nvfp4_linear.py --tune` on that GPU
# (sm_90: one H200, benchmarks/results/nvfp4_linear_h200.json). M-buckets: 1, 2, 4, 8, 16, 32; a
# decode call uses the smallest bucket >= M.
LAUNCH_TABLE: dict[tuple[int, int, int, int], DecodeConfig] = {
    (90, 4096, 4096, 1): DecodeConfig(64, 128, 8, 4, 3),
    (90, 4096, 4096, 2): DecodeConfig(64, 128, 8, 4, 3),
    (90, 4096, 4096, 4): DecodeConfig(64, 128, 8, 4, 3),
    (90, 4096, 4096, 8): DecodeConfig(64, 128, 8, 4, 3),
    (90, 4096, 4096, 16): DecodeConfig(64, 128, 8, 4, 3),
    (90, 4096, 4096, 32): DecodeConfig(32, 128, 4, 4, 3),
    (90, 4096, 14336, 1): DecodeConfig(64, 128, 32, 4, 3),
    (90, 4096, 14336, 2): DecodeConfig(64, 128, 4, 4, 3),
    (90, 4096, 14336, 4): DecodeConfig(64, 128, 4, 4, 3),
    (90, 4096, 14336, 8): DecodeConfig(64, 128, 4, 4, 3),
    (90, 4096, 14336, 16): DecodeConfig(64, 128, 4, 4, 3),
    (90, 4096, 14336, 32): DecodeConfig(32, 128, 2, 4, 3),
    (90, 14336, 4096, 1): DecodeConfig(64, 128, 16, 4, 3),
    (90, 14336, 4096, 2): DecodeConfig(64, 128, 16, 4, 3),
    (90, 14336, 4096, 4): DecodeConfig(64, 128, 8, 4, 3),
    (90, 14336, 4096, 8): DecodeConfig(64, 128, 8, 4, 3),
    (90, 14336, 4096, 16): DecodeConfig(64, 128, 8, 4, 3),
    (90, 14336, 4096, 32): DecodeConfig(128, 128, 8, 4, 3),
    (90, 5120, 3584, 1): DecodeConfig(32, 128, 8, 4, 3),
    (90, 5120, 3584, 2): DecodeConfig(32, 128, 8, 4, 3),
    (90, 5120, 3584, 4): DecodeConfig(32, 128, 8, 4, 3),
    (90, 5120, 3584, 8): DecodeConfig(32, 128, 8, 4, 3),
    (90, 5120, 3584, 16): DecodeConfig(32, 128, 8, 4, 3),
    (90, 5120, 3584, 32): DecodeConfig(32, 128, 8, 4, 3),
    (90, 5120, 8704, 1): DecodeConfig(64, 128, 8, 4, 3),
    (90, 5120, 8704, 2): DecodeConfig(64, 128, 8, 4, 3),
    (90, 5120, 8704, 4): DecodeConfig(64, 128, 8, 4, 3),
    (90, 5120, 8704, 8): DecodeConfig(64, 128, 8, 4, 3),
    (90, 5120, 8704, 16): DecodeConfig(64, 128, 8, 4, 3),
    (90, 5120, 8704, 32): DecodeConfig(32, 128, 8, 4, 3),
    (90, 1536, 5120, 1): DecodeConfig(64, 256, 6, 4, 3),
    (90, 1536, 5120, 2): DecodeConfig(64, 128, 4, 4, 3),
    (90, 1536, 5120, 4): DecodeConfig(64, 128, 4, 4, 3),
    (90, 1536, 5120, 8): DecodeConfig(32, 128, 4, 4, 3),
    (90, 1536, 5120, 16): DecodeConfig(64, 128, 4, 4, 3),
    (90, 1536, 5120, 32): DecodeConfig(32, 128, 4, 4, 3),
    (90, 4352, 5120, 1): DecodeConfig(64, 256, 17, 4, 3),
    (90, 4352, 5120, 2): DecodeConfig(64, 256, 17, 4, 3),
    (90, 4352, 5120, 4): DecodeConfig(64, 256, 17, 4, 3),
    (90, 4352, 5120, 8): DecodeConfig(64, 256, 17, 4, 3),
    (90, 4352, 5120, 16): DecodeConfig(64, 256, 17, 4, 3),
    (90, 4352, 5120, 32): DecodeConfig(64, 256, 17, 4, 3),
    (90, 5120, 62080, 1): DecodeConfig(64, 128, 2, 4, 3),
    (90, 5120, 62080, 2): DecodeConfig(64, 128, 2, 4, 3),
    (90, 5120, 62080, 4): DecodeConfig(64, 128, 2, 4, 3),
    (90, 5120, 62080, 8): DecodeConfig(64, 128, 2, 4, 3),
    (90, 5120, 62080, 16): DecodeConfig(64, 128, 2, 4, 3),
    (90, 5120, 62080, 32): DecodeConfig(32, 128, 1, 4, 3),
    (90, 8192, 28672, 1): DecodeConfig(64, 128, 4, 4, 3),
    (90, 8192, 28672, 2): DecodeConfig(64, 128, 4, 4, 3),
    (90, 8192, 28672, 4): DecodeConfig(64, 128, 4, 4, 3),
    (90, 8192, 28672, 8): DecodeConfig(64, 128, 4, 4, 3),
    (90, 8192, 28672, 16): DecodeConfig(64, 128, 4, 4, 3),
    (90, 8192, 28672, 32): DecodeConfig(32, 128, 1, 4, 3),
}

M_BUCKETS = (1, 2, 4, 8, 16, 32)


def m_bucket(m: int) -> int:
    return next(b for b in M_BUCKETS if b >= m)


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
    return LAUNCH_TABLE.get((sm, k, n, m_bucket(m))) or heuristic_config(n, k_pad, sms)


# CUDA tensor-core decode kernel (weight_mma): (sm, format, gated, K, N, M-bucket) -> MMAConfig, the fastest of
# the sweep in `benchmarks/probes/mma_sweep.py` (sm_90: one H200, benchmarks/results/nvfp4_mma_sweep_h200.json and
# fp8_mma_sweep_h200.json; the M = 1 entries of 14336x4096, 4096x14336, 28672x8192 and gated 2x14336x4096 re-swept
# for the tiled prepack: nvfp4_mma_sweep_tiled_h200.json; 14336x4096 M = 1, 8, 16 from the layout probe and
# smem_stage_h200.json). An M > 1 entry is the fastest of its sweep at the split-K of the M = 1 entry, the split
# the op runs every M with (mma_config).
MMA_LAUNCH_TABLE: dict[tuple[int, str, bool, int, int, int], MMAConfig] = {
    (90, "nvfp4", False, 4096, 4096, 1): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4096, 4096, 2): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", False, 4096, 4096, 4): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4096, 4096, 8): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4096, 4096, 16): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4096, 4096, 32): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4096, 14336, 1): MMAConfig(1, 8, 2, 4),
    (90, "nvfp4", False, 4096, 14336, 2): MMAConfig(1, 8, 2, 4),
    (90, "nvfp4", False, 4096, 14336, 4): MMAConfig(1, 8, 2, 4),
    (90, "nvfp4", False, 4096, 14336, 8): MMAConfig(1, 8, 2, 4),
    (90, "nvfp4", False, 4096, 14336, 16): MMAConfig(1, 8, 2, 4),
    (90, "nvfp4", False, 4096, 14336, 32): MMAConfig(1, 8, 2, 2),
    (90, "nvfp4", False, 14336, 4096, 1): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 14336, 4096, 2): MMAConfig(1, 8, 8, 4),
    (90, "nvfp4", False, 14336, 4096, 4): MMAConfig(1, 8, 8, 4),
    (90, "nvfp4", False, 14336, 4096, 8): MMAConfig(1, 8, 8, 4),
    (90, "nvfp4", False, 14336, 4096, 16): MMAConfig(1, 8, 8, 4),
    (90, "nvfp4", False, 14336, 4096, 32): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 3584, 1): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 3584, 2): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 3584, 4): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 3584, 8): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 3584, 16): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 3584, 32): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 8704, 1): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", False, 5120, 8704, 2): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 8704, 4): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 8704, 8): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 8704, 16): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 5120, 8704, 32): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 1536, 5120, 1): MMAConfig(1, 4, 4, 2),
    (90, "nvfp4", False, 1536, 5120, 2): MMAConfig(1, 4, 4, 2),
    (90, "nvfp4", False, 1536, 5120, 4): MMAConfig(1, 4, 4, 2),
    (90, "nvfp4", False, 1536, 5120, 8): MMAConfig(1, 4, 4, 2),
    (90, "nvfp4", False, 1536, 5120, 16): MMAConfig(1, 4, 4, 4),
    (90, "nvfp4", False, 1536, 5120, 32): MMAConfig(1, 4, 4, 4),
    (90, "nvfp4", False, 4352, 5120, 1): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", False, 4352, 5120, 2): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", False, 4352, 5120, 4): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", False, 4352, 5120, 8): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4352, 5120, 16): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4352, 5120, 32): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", False, 5120, 62080, 1): MMAConfig(1, 8, 1, 4),
    (90, "nvfp4", False, 5120, 62080, 2): MMAConfig(1, 8, 1, 4),
    (90, "nvfp4", False, 5120, 62080, 4): MMAConfig(1, 8, 1, 4),
    (90, "nvfp4", False, 5120, 62080, 8): MMAConfig(2, 4, 1, 2),
    (90, "nvfp4", False, 5120, 62080, 16): MMAConfig(2, 4, 1, 2),
    (90, "nvfp4", False, 5120, 62080, 32): MMAConfig(1, 8, 1, 2),
    (90, "nvfp4", False, 8192, 28672, 1): MMAConfig(1, 8, 1, 8),
    (90, "nvfp4", False, 8192, 28672, 2): MMAConfig(1, 8, 1, 4),
    (90, "nvfp4", False, 8192, 28672, 4): MMAConfig(1, 8, 1, 4),
    (90, "nvfp4", False, 8192, 28672, 8): MMAConfig(1, 8, 1, 4),
    (90, "nvfp4", False, 8192, 28672, 16): MMAConfig(1, 8, 1, 4),
    (90, "nvfp4", False, 8192, 28672, 32): MMAConfig(1, 8, 1, 2),
    # Llama-3-8B's qkv and its tensor-parallel (two ranks) halves, bucket 1 and 8
    # (benchmarks/results/nvfp4_mma_sweep_llama8b_tp_shapes_h200.json)
    (90, "nvfp4", False, 4096, 6144, 1): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4096, 6144, 8): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 4096, 3072, 1): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", False, 4096, 3072, 8): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", False, 2048, 4096, 1): MMAConfig(1, 4, 8, 4),
    (90, "nvfp4", False, 2048, 4096, 8): MMAConfig(1, 8, 4, 2),
    (90, "nvfp4", False, 7168, 4096, 1): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", False, 7168, 4096, 8): MMAConfig(1, 8, 8, 2),
    (90, "nvfp4", True, 4096, 7168, 1): MMAConfig(1, 4, 8, 2),
    (90, "nvfp4", True, 4096, 7168, 8): MMAConfig(1, 8, 4, 2),
    (90, "nvfp4", True, 4096, 14336, 1): MMAConfig(1, 8, 2, 2),
    (90, "nvfp4", True, 4096, 14336, 2): MMAConfig(1, 4, 4, 2),
    (90, "nvfp4", True, 4096, 14336, 4): MMAConfig(1, 4, 4, 2),
    (90, "nvfp4", True, 4096, 14336, 8): MMAConfig(1, 8, 2, 2),
    (90, "nvfp4", True, 4096, 14336, 16): MMAConfig(1, 8, 1, 4),
    (90, "nvfp4", True, 4096, 14336, 32): MMAConfig(1, 8, 1, 4),
    (90, "fp8", False, 4096, 4096, 1): MMAConfig(1, 8, 16, 2),
    (90, "fp8", False, 4096, 4096, 2): MMAConfig(1, 4, 16, 2),
    (90, "fp8", False, 4096, 4096, 4): MMAConfig(1, 4, 16, 2),
    (90, "fp8", False, 4096, 4096, 8): MMAConfig(1, 8, 8, 2),
    (90, "fp8", False, 4096, 4096, 16): MMAConfig(1, 8, 8, 2),
    (90, "fp8", False, 4096, 4096, 32): MMAConfig(1, 8, 16, 4),
    (90, "fp8", False, 4096, 14336, 1): MMAConfig(1, 4, 4, 2),
    (90, "fp8", False, 4096, 14336, 2): MMAConfig(1, 8, 4, 2),
    (90, "fp8", False, 4096, 14336, 4): MMAConfig(1, 8, 4, 2),
    (90, "fp8", False, 4096, 14336, 8): MMAConfig(1, 8, 4, 2),
    (90, "fp8", False, 4096, 14336, 16): MMAConfig(2, 8, 4, 2),
    (90, "fp8", False, 4096, 14336, 32): MMAConfig(1, 8, 2, 4),
    (90, "fp8", False, 14336, 4096, 1): MMAConfig(1, 4, 16, 2),
    (90, "fp8", False, 14336, 4096, 2): MMAConfig(1, 8, 16, 2),
    (90, "fp8", False, 14336, 4096, 4): MMAConfig(1, 8, 16, 2),
    (90, "fp8", False, 14336, 4096, 8): MMAConfig(1, 8, 16, 2),
    (90, "fp8", False, 14336, 4096, 16): MMAConfig(2, 4, 16, 2),
    (90, "fp8", False, 14336, 4096, 32): MMAConfig(1, 8, 8, 4),
    (90, "fp8", False, 5120, 3584, 1): MMAConfig(1, 4, 16, 2),
    (90, "fp8", False, 5120, 3584, 2): MMAConfig(1, 4, 16, 2),
    (90, "fp8", False, 5120, 3584, 4): MMAConfig(1, 8, 16, 2),
    (90, "fp8", False, 5120, 3584, 8): MMAConfig(1, 4, 16, 2),
    (90, "fp8", False, 5120, 3584, 16): MMAConfig(1, 4, 16, 2),
    (90, "fp8", False, 5120, 3584, 32): MMAConfig(1, 4, 16, 2),
    (90, "fp8", False, 5120, 8704, 1): MMAConfig(1, 4, 4, 2),
    (90, "fp8", False, 5120, 8704, 2): MMAConfig(1, 4, 4, 2),
    (90, "fp8", False, 5120, 8704, 4): MMAConfig(1, 8, 4, 2),
    (90, "fp8", False, 5120, 8704, 8): MMAConfig(1, 8, 4, 4),
    (90, "fp8", False, 5120, 8704, 16): MMAConfig(1, 8, 4, 2),
    (90, "fp8", False, 5120, 8704, 32): MMAConfig(1, 8, 8, 2),
    (90, "fp8", False, 1536, 5120, 1): MMAConfig(1, 4, 8, 2),
    (90, "fp8", False, 1536, 5120, 2): MMAConfig(1, 4, 8, 2),
    (90, "fp8", False, 1536, 5120, 4): MMAConfig(1, 4, 8, 2),
    (90, "fp8", False, 1536, 5120, 8): MMAConfig(1, 4, 8, 2),
    (90, "fp8", False, 1536, 5120, 16): MMAConfig(1, 8, 8, 2),
    (90, "fp8", False, 1536, 5120, 32): MMAConfig(1, 4, 8, 2),
    (90, "fp8", False, 4352, 5120, 1): MMAConfig(1, 4, 8, 2),
    (90, "fp8", False, 4352, 5120, 2): MMAConfig(1, 4, 8, 2),
    (90, "fp8", False, 4352, 5120, 4): MMAConfig(1, 4, 8, 2),
    (90, "fp8", False, 4352, 5120, 8): MMAConfig(1, 8, 8, 2),
    (90, "fp8", False, 4352, 5120, 16): MMAConfig(1, 8, 8, 2),
    (90, "fp8", False, 4352, 5120, 32): MMAConfig(1, 8, 8, 2),
    (90, "fp8", False, 5120, 62080, 1): MMAConfig(1, 4, 1, 8),
    (90, "fp8", False, 5120, 62080, 2): MMAConfig(1, 8, 1, 8),
    (90, "fp8", False, 5120, 62080, 4): MMAConfig(1, 8, 1, 8),
    (90, "fp8", False, 5120, 62080, 8): MMAConfig(1, 8, 1, 2),
    (90, "fp8", False, 5120, 62080, 16): MMAConfig(2, 4, 1, 2),
    (90, "fp8", False, 5120, 62080, 32): MMAConfig(1, 8, 1, 4),
    (90, "fp8", False, 8192, 28672, 1): MMAConfig(1, 4, 8, 8),
    (90, "fp8", False, 8192, 28672, 2): MMAConfig(1, 8, 1, 4),
    (90, "fp8", False, 8192, 28672, 4): MMAConfig(1, 4, 8, 8),
    (90, "fp8", False, 8192, 28672, 8): MMAConfig(1, 8, 1, 8),
    (90, "fp8", False, 8192, 28672, 16): MMAConfig(1, 8, 8, 4),
    (90, "fp8", False, 8192, 28672, 32): MMAConfig(1, 8, 1, 4),
    (90, "fp8", True, 4096, 14336, 1): MMAConfig(1, 4, 8, 2),
    (90, "fp8", True, 4096, 14336, 2): MMAConfig(1, 4, 1, 4),
    (90, "fp8", True, 4096, 14336, 4): MMAConfig(1, 4, 1, 4),
    (90, "fp8", True, 4096, 14336, 8): MMAConfig(1, 4, 2, 2),
    (90, "fp8", True, 4096, 14336, 16): MMAConfig(1, 8, 2, 4),
    (90, "fp8", True, 4096, 14336, 32): MMAConfig(1, 8, 2, 2),
}


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


@functools.lru_cache(maxsize=None)
def _extra_mma_table(path: str) -> dict[tuple[int, str, bool, int, int, int], MMAConfig]:
    """The best configs of a ``benchmarks/probes/mma_sweep.py`` output file, as launch-table entries."""
    import json

    try:
        with open(path) as f:
            report = json.load(f)
        table = {}
        for gated, rows in ((False, report.get("sweep", [])), (True, report.get("gated", []))):
            for r in rows:
                c = r["best_cfg"]
                table[(int(report["sm"]), r["format"], gated, int(r["k"]), int(r["n"]), m_bucket(int(r["m"])))] = \
                    MMAConfig(int(c["mt"]), int(c["warps"]), int(c["split_k"]), int(c["depth"]))
        return table
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"ANYFP4_MMA_TABLE={path}: not a launch-sweep file of benchmarks/probes/mma_sweep.py "
                         f"({type(e).__name__}: {e})") from e


def _mma_entry(key: tuple) -> MMAConfig | None:
    from ..env import extra_mma_table_path

    path = extra_mma_table_path()
    extra = _extra_mma_table(path).get(key) if path else None
    return extra or MMA_LAUNCH_TABLE.get(key)


def mma_config(sm: int, sms: int, fmt: str, gated: bool, n: int, k: int, k_pad: int, m: int,
               split_k: int = 0) -> MMAConfig:
    """The entry of ``ANYFP4_MMA_TABLE`` (a sweep file) or of the launch table for this GPU, shape and M
    bucket, else the heuristic (always 128-row blocks, which every prepack's row padding covers). The split-K
    always comes from M = 1 — it alone sets the order in which a row's partial sums are added, so every M
    gives each row the bits M = 1 gives it (a verify pass of k + 1 rows computes what k + 1 single-token
    steps would) — unless ``split_k`` (> 0) names it for every M (a tensor-parallel shard's)."""
    c = _mma_entry((sm, fmt, gated, k, n, m_bucket(m))) or mma_heuristic_config(n, k_pad, m, sms, gated, fmt)
    if split_k:
        return replace(c, split_k=split_k)
    one = _mma_entry((sm, fmt, gated, k, n, 1)) or mma_heuristic_config(n, k_pad, 1, sms, gated, fmt)
    return replace(c, split_k=one.split_k)
