"""``anyfp4 bench --tp N``: the bench of ``bench.py`` with the model split over N ranks (NCCL on GPUs,
gloo on the CPU), plus what tensor parallelism costs: the time of one decode-sized all-reduce, measured
on the same ranks, and its share of a step (two all-reduces per layer), and the weight bandwidth each
rank achieves on its own shard. Rank 0 reports; every rank decodes the same tokens."""

from __future__ import annotations

import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

from .model import bench_model
from ..parallel.tensor_parallel import all_reduce_sum, init_process_group, load_model_tp, rank_args, run_rank, spawn_ranks


def _allreduce_seconds(x: torch.Tensor, peer, reps: int = 64) -> float:
    """One all-reduce of ``x`` as the model sums its row-parallel outputs; on GPUs timed inside a CUDA graph
    of ``reps`` of them (as a decode step replays them), eager on the CPU."""
    reduce = lambda: all_reduce_sum(x, peer)  # noqa: E731
    for _ in range(3):
        reduce()
    if not x.is_cuda:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            reduce()
        return (time.perf_counter() - t0) / reps
    torch.cuda.synchronize(x.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(reps):
            reduce()
    graph.replay()
    torch.cuda.synchronize(x.device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize(x.device)
    return (time.perf_counter() - t0) / (10 * reps)


def bench_worker(rank: int, tp: int, spec: str, device_type: str, dtype_name: str, prompt_len: int, gen_len: int,
                 batch: int, port: int, result_file: str) -> None:
    init_process_group(rank, tp, device_type, port)

    def work():
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        dtype = getattr(torch, dtype_name)
        if spec.startswith("random:"):
            from .random_model import random_model

            _, arch, fmt = spec.split(":")
            model = random_model(arch, fmt, device, dtype, progress=False, rank=rank, tp=tp)
        else:
            model = load_model_tp(spec, device, dtype, rank, tp)
        r = bench_model(model, prompt_len, gen_len, batch)
        peer = model.blocks[0].mlp.down.peer
        per = _allreduce_seconds(torch.zeros(batch, 1, model.args.hidden_size, dtype=torch.float32, device=device),
                                 peer)
        step = r["ms_per_step"] / 1e3
        mine = {"rank": rank, "bandwidth_GBps": r["bandwidth_GBps"], "weight_bytes_per_step": r["weight_bytes_per_step"],
                "sha256": r["sha256"]}
        ranks = [None] * tp
        dist.all_gather_object(ranks, mine)
        if rank == 0:
            r.update(model=spec, tp=tp, ranks=ranks, allreduce_us=per * 1e6,
                     allreduce="peer" if peer is not None else "nccl",
                     allreduce_share=2 * len(model.blocks) * per / step,
                     same_tokens_on_every_rank=len({x["sha256"] for x in ranks}) == 1)
            with open(result_file, "w") as f:
                json.dump(r, f)
        return model

    run_rank(work)


def bench_tp(spec: str, tp: int, device_type: str, dtype_name: str, prompt_len: int, gen_len: int, batch: int,
             port: int = 29519) -> dict:
    """Run the tensor-parallel bench of a checkpoint directory or ``random:ARCH:FORMAT``; rank 0's report."""
    if device_type == "cuda" and torch.cuda.device_count() < tp:
        raise ValueError(f"--tp {tp} needs {tp} GPUs, this machine has {torch.cuda.device_count()}")
    if spec.startswith("random:"):
        from .random_model import random_args

        _, arch, fmt = spec.split(":")
        args = random_args(arch, fmt)  # refuses an unknown architecture or a bad format before spawning
    else:
        from ..runtime.plan import plan_checkpoint

        args = plan_checkpoint(spec).args  # config and tensors agree, checked before spawning
    rank_args(args, tp)  # refuse uneven splits before spawning
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "bench.json")
        spawn_ranks(bench_worker, (tp, spec, device_type, dtype_name, prompt_len, gen_len, batch, port, result), tp)
        with open(result) as f:
            return json.load(f)
