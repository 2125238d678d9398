"""How the benchmarks time things: CUDA-graph replays of back-to-back calls, the device-to-device copy
bandwidth a result is compared with, and waiting for a device."""

from __future__ import annotations

import statistics

import torch

# Weight bytes a kernel timing rotates over: several times the L2 cache, so that every call reads its weight
# from memory as a decode step does.
ROTATE_BYTES = 512 * 1024**2


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def graph_seconds(calls, reps: int = 20, trials: int = 7) -> float:
    """Median seconds per call of ``calls(i)``: three warm-up calls on a side stream, then ``reps`` calls
    (i = 0 .. reps - 1, e.g. rotating over weight copies) captured in one CUDA graph; the median over
    ``trials`` replays, each timed with CUDA events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            calls(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            calls(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / reps)
    del graph
    return statistics.median(times)


def copy_bandwidth(device: torch.device, gib: int = 1, repeats: int = 7) -> float | None:
    """Read + write bytes per second of a ``gib`` GiB device-to-device copy (median); None on the CPU."""
    if device.type != "cuda":
        return None
    src = torch.empty(gib * 1024**3 // 2, dtype=torch.bfloat16, device=device).uniform_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        torch.cuda.synchronize(device)
        times.append(s.elapsed_time(e) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * gib * 1024**3 / sorted(times)[len(times) // 2]
