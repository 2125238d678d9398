"""The peer all-reduce on two GPUs: exact sums inside a CUDA graph, NCCL for what does not fit."""

import pytest
import torch

from helpers import free_port


def _peer_sum_worker(rank: int, port: int, failures) -> None:
    import os

    import torch.distributed as dist

    from anyfp4.dispatch.limits import DECODE_ROWS as PEER_ROWS
    from anyfp4.parallel.allreduce import all_reduce_sum, peer_all_reduce
    from anyfp4.parallel.ranks import init_process_group

    os.environ["MASTER_PORT"] = str(port)
    init_process_group(rank, 2, "cuda", port)
    dev = torch.device("cuda", rank)
    peer = peer_all_reduce(dev, 256)
    assert peer is not None
    gens = [torch.Generator(device=dev).manual_seed(100 + r) for r in range(2)]
    src = [torch.randn(40, 3, 256, device=dev, generator=g) for g in gens]  # both ranks' inputs, on every rank
    mine = src[rank].clone()
    outs = [None] * 40
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for i in range(40):  # back to back through one buffer: each sum must wait for the previous one's readers
            outs[i] = all_reduce_sum(mine[i], peer)
    graph.replay()
    torch.cuda.synchronize()
    want = src[0] + src[1]
    bad = [i for i in range(40) if not torch.equal(outs[i], want[i])]
    big = torch.randn(PEER_ROWS + 1, 256, device=dev, generator=gens[rank])  # too large: NCCL
    total = all_reduce_sum(big.clone(), peer)
    dist.all_reduce(big)
    if bad or not torch.equal(total, big):
        failures.put((rank, bad))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_peer_all_reduce_in_a_cuda_graph():
    """40 float32 sums captured back to back in one graph through the peer buffer: every one exact on both
    ranks (a + b in float32); a tensor larger than the buffer goes through NCCL."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    mp.spawn(_peer_sum_worker, args=(free_port(), failures), nprocs=2, join=True)
    assert failures.empty(), failures.get()
