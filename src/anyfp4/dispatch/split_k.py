"""The split-K of tensor-parallel shards: the one that makes a shard compute one GPU's bits.

The CUDA decode kernel's K slices (split-K blocks x K warps) alone set the order a row's products are added in
(``tuning.mma_config``), so a shard launched with its full layer's slices adds its k as one GPU does. "Split-K" below
and in the ops' ``split_k`` arguments means that number of slices. These functions say which split that is;
``parallel`` passes it to the ops (their ``split_k`` argument) and computes none itself.
"""

from __future__ import annotations

import torch

from ..packing.layout import K_ALIGN, round_up


def single_gpu_split_k(device: torch.device, fmt: str, gated: bool, n: int, k: int) -> int:
    """The split-K one GPU of ``device``'s kind uses for the full ``n`` x ``k`` layer (the launch table's or the
    heuristic's, from M = 1); 0 where the CUDA decode kernel does not serve the device (nothing to match)."""
    from ..kernels.cuda import weight_mma
    from ..kernels.device import device_arch
    from ..kernels.cuda.weight_mma import k_slices
    from .tuning import mma_config

    sm, sms = device_arch(device.index)
    if not weight_mma.enabled(sm):
        return 0
    return k_slices(mma_config(sm, sms, fmt, gated, n, k, round_up(k, K_ALIGN), 1))


def row_parallel_split_k(device: torch.device, fmt: str, n: int, full_k: int, tp: int) -> int:
    """The split-K of one of ``tp`` row-parallel shards (a slice of ``full_k``) whose float32 shares, summed, give
    one GPU's bits for the full layer: the full layer's split divided by ``tp``. 0 where no split does that (the
    split or the layer's K steps do not divide by ``tp``: close, not the same bits) or the CUDA kernel does not
    serve the device."""
    from ..kernels.cuda.weight_mma_defines import STEP_K

    split = single_gpu_split_k(device, fmt, False, n, full_k)
    if split and split % tp == 0 and (round_up(full_k, K_ALIGN) // STEP_K[fmt]) % tp == 0:
        return split // tp
    return 0
