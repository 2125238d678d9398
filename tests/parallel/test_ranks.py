"""The rank processes: rank 0's result comes back to the caller, a failed rank fails the call."""

import pytest
import torch

from anyfp4.parallel.ranks import check_rank_devices, run_on_ranks
from helpers import free_port


def _report(rank: int, tp: int, device: torch.device, tag: str):
    import torch.distributed as dist

    ranks = [None] * tp
    dist.all_gather_object(ranks, rank)  # inside one process group
    return None, {"tag": tag, "rank": rank, "ranks": ranks, "device": str(device), "ones": torch.ones(2)}


def _fail_on_rank_1(rank: int, tp: int, device: torch.device):
    if rank == 1:
        raise ValueError("rank 1 gives up")
    return None, {"rank": rank}


def test_rank_0s_result_comes_back():
    r = run_on_ranks(_report, ("x",), 2, "cpu", free_port())
    assert r["tag"] == "x" and r["rank"] == 0 and r["ranks"] == [0, 1] and r["device"] == "cpu"
    assert torch.equal(r["ones"], torch.ones(2))


def test_a_failed_rank_fails_the_call(capfd):
    with pytest.raises(RuntimeError, match="tensor-parallel .*its error is printed above"):
        run_on_ranks(_fail_on_rank_1, (), 2, "cpu", free_port())
    assert "rank 1 gives up" in capfd.readouterr().err


@pytest.mark.skipif(torch.cuda.device_count() >= 64, reason="needs fewer than 64 GPUs")
def test_more_gpu_ranks_than_gpus_are_refused():
    with pytest.raises(ValueError, match="--tp 64 needs 64 GPUs"):
        check_rank_devices(64, "cuda")
    check_rank_devices(64, "cpu")  # CPU ranks: as many as asked
