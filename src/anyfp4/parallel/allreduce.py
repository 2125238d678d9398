"""The sum over the ranks after a row-parallel linear: through peer memory for decode-sized rows on GPUs,
NCCL (or gloo on CPUs) otherwise; every rank gets the same bits."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..dispatch.limits import DECODE_ROWS
from ..env import tp_allreduce


class PeerAllReduce:
    """Sums of small float32 tensors over the process group through peer memory (PyTorch symmetric memory,
    no multicast): in one kernel each rank copies its tensor into its own buffer, waits for the others, and
    reads and adds every rank's buffer in rank order 0, 1, ..., so every rank gets the same bits. Made at
    load (the rendezvous is a collective), used inside CUDA graphs; about 3x faster than NCCL for one
    decode row on two H200s (benchmarks/NOTES.md)."""

    def __init__(self, device: torch.device, numel: int):
        import torch.distributed._symmetric_memory as symm_mem

        self.group = dist.group.WORLD.group_name
        self.buf = symm_mem.empty(numel, dtype=torch.float32, device=device)
        symm_mem.rendezvous(self.buf, self.group)

    def fits(self, y: torch.Tensor) -> bool:
        return y.dtype == torch.float32 and y.is_contiguous() and y.numel() <= self.buf.numel()

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(y)
        torch.ops.symm_mem.one_shot_all_reduce_copy_out(self.buf[: y.numel()], y.view(-1), "sum", self.group,
                                                        out.view(-1))
        return out


def peer_all_reduce(device: torch.device, width: int) -> PeerAllReduce | None:
    """The peer all-reduce for ``width``-wide rows on a GPU rank, or None (CPU, ``ANYFP4_TP_ALLREDUCE=nccl``,
    or symmetric memory unavailable — reported once, then NCCL)."""
    mode = tp_allreduce()
    if device.type != "cuda" or mode == "nccl":
        return None
    try:
        return PeerAllReduce(device, DECODE_ROWS * width)  # decode and verify steps; larger calls use NCCL
    except Exception as e:  # an older torch or a GPU without peer access
        if mode == "peer":
            raise RuntimeError(f"ANYFP4_TP_ALLREDUCE=peer: symmetric memory is not usable here ({e})") from e
        if dist.get_rank() == 0:
            import sys

            print(f"anyfp4: peer all-reduce unavailable ({type(e).__name__}: {e}); using NCCL", file=sys.stderr)
        return None


def all_reduce_sum(y: torch.Tensor, peer: PeerAllReduce | None) -> torch.Tensor:
    """The sum of float32 ``y`` over the ranks: through peer memory when it fits, else NCCL."""
    if peer is not None and peer.fits(y):
        return peer(y)
    y = y.contiguous()
    dist.all_reduce(y)
    return y


class AllReduce(nn.Module):
    """A row-parallel linear followed by the sum of the ranks' shares: each rank's share stays float32
    (``partial``: the kernel's sums before the global / row scale, unrounded), the ranks' shares are added
    in float32, scaled and rounded once — as one GPU's epilogue scales and rounds its split-K sum."""

    def __init__(self, inner: nn.Module, peer: PeerAllReduce | None = None):
        super().__init__()
        self.inner = inner
        self.peer = peer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = all_reduce_sum(self.inner.partial(x), self.peer)
        return self.inner.scale_partial(total).to(x.dtype)
