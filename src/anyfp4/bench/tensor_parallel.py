"""``anyfp4 bench --tp N``: the bench of ``model.py`` with the model split over N ranks (NCCL on GPUs,
gloo on the CPU), plus what tensor parallelism costs: the time of one decode-sized all-reduce, measured
on the same ranks, and its share of a step (two all-reduces per layer), and the weight bandwidth each
rank achieves on its own shard. Rank 0 reports; every rank decodes the same tokens."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..parallel.allreduce import all_reduce_sum
from ..parallel.model import load_model_tp
from ..parallel.ranks import check_rank_devices, run_on_ranks
from ..parallel.sharding import rank_args
from .model import bench_model
from .random_model import RandomSpec


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


def bench_rank(rank: int, tp: int, device: torch.device, spec: str, dtype_name: str, prompt_len: int,
               gen_len: int, batch: int):
    """One rank of ``bench_tp``: build or load its shard, bench it, time one all-reduce; rank 0's report."""
    dtype = getattr(torch, dtype_name)
    random = RandomSpec.parse(spec)
    if random is not None:
        model = random.model(device, dtype, progress=False, rank=rank, tp=tp)
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
    r.update(model=spec, tp=tp, ranks=ranks, allreduce_us=per * 1e6, allreduce="peer" if peer is not None else "nccl",
             allreduce_share=2 * len(model.blocks) * per / step,
             same_tokens_on_every_rank=len({x["sha256"] for x in ranks}) == 1)
    return model, r


def bench_tp(spec: RandomSpec | str, tp: int, device_type: str, dtype_name: str, prompt_len: int, gen_len: int,
             batch: int, port: int = 29519) -> dict:
    """Run the tensor-parallel bench of a checkpoint directory or a random-weight model; rank 0's report."""
    check_rank_devices(tp, device_type)
    spec = str(spec)
    random = RandomSpec.parse(spec)
    if random is not None:
        args = random.args()  # refuses an unknown architecture or a bad format before spawning
    else:
        from ..runtime.plan import plan_checkpoint

        args = plan_checkpoint(spec).args  # config and tensors agree, checked before spawning
    rank_args(args, tp)  # refuse uneven splits before spawning
    return run_on_ranks(bench_rank, (spec, dtype_name, prompt_len, gen_len, batch), tp, device_type, port)
