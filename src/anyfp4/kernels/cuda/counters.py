"""The split-K arrival counters of the CUDA decode kernel (``weight_mma.cu``): one buffer per device, which
every launch leaves at zero, shared by every kernel on that device (they must run on one stream at a time, as
a model's layers do).

The buffer is allocated on first use, so CUDA-graph capture must not be the first use: the layers that make
GPU prepacks (``nn.linear``, ``integrations.vllm``) reserve it when they are built (``reserve_counters_for``);
code that prepacks by hand runs a layer once eagerly, or calls ``reserve_counters``, before capturing.
"""

from __future__ import annotations

import torch

COUNTER_SLOTS = 1 << 16  # row tiles of one launch at most
_COUNTERS: dict[int, torch.Tensor] = {}


def reserve_counters(device: torch.device) -> torch.Tensor:
    """The per-device split-K arrival counters (every kernel leaves them at zero)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    buf = _COUNTERS.get(index)
    if buf is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("anyfp4: split-K counters must be reserved before CUDA-graph capture; run the model "
                               "once eagerly or call anyfp4.kernels.cuda.counters.reserve_counters(device) first")
        buf = _COUNTERS[index] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=torch.device("cuda", index))
    return buf


def reserve_counters_for(codes: torch.Tensor) -> None:
    """Reserve the counters of the device a prepack's ``codes`` live on, when that is a GPU: what a layer calls
    once it has made its prepack."""
    if codes.is_cuda:
        reserve_counters(codes.device)
