"""What a CUDA device is, read once per device."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def device_arch(index: int) -> tuple[int, int]:
    """(sm as major*10+minor, multiprocessor count) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return props.major * 10 + props.minor, props.multi_processor_count
