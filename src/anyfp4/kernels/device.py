"""What a CUDA device is, read once per device, and whether kernels on it start early (programmatic dependent
launch)."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def device_arch(index: int) -> tuple[int, int]:
    """(sm as major*10+minor, multiprocessor count) of CUDA device ``index``."""
    props = torch.cuda.get_device_properties(index)
    return props.major * 10 + props.minor, props.multi_processor_count


def early_launch(index: int) -> bool:
    """Programmatic dependent launch on sm_90+ unless ``ANYFP4_EARLY_LAUNCH=0``: every kernel of a decode step (the
    CUDA decode kernel and the Triton glue kernels) is launched so that it may start while the kernel before it
    finishes, and waits for it (``griddepcontrol.wait``) before it reads or writes anything a kernel writes. The
    one switch for all of them: a kernel that started early and did not wait would race."""
    from ..env import early_launch_allowed

    return device_arch(index)[0] >= 90 and early_launch_allowed()
