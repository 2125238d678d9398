"""Time of one decode-sized all-reduce (1 x hidden) between the GPUs of this host, inside a CUDA graph of
64 of them (as a decode step has): NCCL in bf16 and float32, and PyTorch symmetric memory's one-shot
all-reduce (peer loads, no multicast).

    PYTHONPATH=src torchrun --nproc-per-node 2 benchmarks/probes/allreduce_probe.py --out allreduce.json

2026-11-29, two H200s (results/allreduce_tp2_h200.json): NCCL 19.5 / 19.9 us (bf16 / float32), symmetric
memory 6.2 / 6.6 us — why ``parallel.allreduce.PeerAllReduce`` sums decode rows; run again by
``gpu_session.sh tp`` on each two-GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist


def graph_us(fn, reps: int = 64, replays: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for _ in range(reps):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(replays):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (replays * reps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--out", default="allreduce.json")
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", device_id=dev)
    res = {"world": world, "hidden": a.hidden}
    for dt in (torch.bfloat16, torch.float32):
        x = torch.ones(1, a.hidden, dtype=dt, device=dev)
        res[f"nccl_{str(dt)[6:]}_us"] = graph_us(lambda: dist.all_reduce(x))
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group_name = dist.group.WORLD.group_name
        for dt in (torch.bfloat16, torch.float32):
            buf = symm_mem.empty(1, a.hidden, dtype=dt, device=dev)
            symm_mem.rendezvous(buf, group_name)
            buf.fill_(rank + 1)
            y = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name)
            torch.cuda.synchronize()
            ok = bool((y == sum(range(1, world + 1))).all())
            res[f"symm_one_shot_{str(dt)[6:]}_correct"] = ok
            out = torch.empty_like(buf)
            res[f"symm_one_shot_{str(dt)[6:]}_us"] = graph_us(
                lambda: torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group_name, out))
    except Exception as e:  # report, keep the NCCL numbers
        res["symm_error"] = f"{type(e).__name__}: {e}"[:400]
    if rank == 0:
        print(json.dumps(res, indent=1))
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
