"""Timing helpers: the copy bandwidth and CUDA-graph timings on a GPU; nothing to measure on the CPU."""

import pytest
import torch

from anyfp4.bench.timing import copy_bandwidth, graph_seconds, sync

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_the_cpu_has_no_copy_bandwidth_and_nothing_to_wait_for():
    assert copy_bandwidth(torch.device("cpu")) is None
    sync(torch.device("cpu"))


@gpu
def test_graph_seconds_times_each_call():
    """``reps`` calls per replay: the time per call of a 64 MiB copy is the copy's, whatever ``reps``."""
    src = torch.empty(32 * 1024**2, dtype=torch.bfloat16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    calls = []
    one, many = (graph_seconds(lambda i: (calls.append(i), dst.copy_(src)), reps=r, trials=3) for r in (2, 8))
    assert calls[:3] == [0, 1, 2] and 0 < one and 0.5 < many / one < 2
    assert copy_bandwidth(torch.device("cuda")) > 0
