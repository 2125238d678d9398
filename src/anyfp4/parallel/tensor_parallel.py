"""Tensor parallelism: each rank loads its own shard of every linear; one all-reduce after the
row-parallel projections (o_proj, down_proj). torch.distributed with NCCL on GPUs, gloo on CPUs.

- column-parallel (q/k/v, gate/up): rows (output features) split evenly — a rank keeps whole
  attention heads and KV heads and 1/tp of the MLP width;
- row-parallel (o, down): columns (input features) split on 16-element group boundaries, so an
  NVFP4 rank keeps whole block scales; the partial outputs are summed by the all-reduce;
- embeddings and norms are replicated; the lm_head too, or (``ANYFP4_TP_LM_HEAD=vocab``) split by
  vocabulary rows, each rank computing its slice of the logits and the ranks all-gathering them.

The model code never sees sharding: ``ShardedSource`` slices what the checkpoint source returns.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from ..dispatch.limits import DECODE_ROWS
from ..formats.fp8 import FP8Weight
from ..formats.nvfp4 import GROUP_SIZE, NVFP4Weight
from ..nn.linear import FP8Linear, NVFP4Linear
from ..runtime.config import ModelArgs
from ..runtime.loader import WeightSource

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


def check_divisible(args: ModelArgs, tp: int) -> None:
    problems = []
    if args.num_kv_heads % tp:
        problems.append(f"{args.num_kv_heads} key/value heads")
    if args.num_heads % tp:
        problems.append(f"{args.num_heads} attention heads")
    if args.intermediate_size % (tp * GROUP_SIZE):
        problems.append(f"intermediate size {args.intermediate_size} (needs a multiple of {tp * GROUP_SIZE})")
    if (args.num_heads * args.head_dim) % (tp * GROUP_SIZE):
        problems.append(f"attention width {args.num_heads * args.head_dim}")
    if problems:
        raise ValueError(f"cannot split this model over {tp} ranks: {', '.join(problems)} do not divide evenly")


def rank_args(args: ModelArgs, tp: int) -> ModelArgs:
    """The per-rank architecture: 1/tp of the heads and of the MLP width."""
    check_divisible(args, tp)
    return replace(args, num_heads=args.num_heads // tp, num_kv_heads=args.num_kv_heads // tp,
                   intermediate_size=args.intermediate_size // tp)


def _rows(w, lo: int, hi: int):
    if isinstance(w, NVFP4Weight):
        return NVFP4Weight(w.packed[lo:hi], w.block_scale[lo:hi], w.global_scale)
    if isinstance(w, FP8Weight):
        scale = w.scale.reshape(-1)[lo:hi] if w.scale.numel() > 1 else w.scale
        return FP8Weight(w.weight[lo:hi], scale, w.input_scale)
    return w[lo:hi]


def _cols(w, lo: int, hi: int):
    if isinstance(w, NVFP4Weight):
        return NVFP4Weight(w.packed[:, lo // 2:hi // 2], w.block_scale[:, lo // GROUP_SIZE:hi // GROUP_SIZE],
                           w.global_scale)
    if isinstance(w, FP8Weight):
        return FP8Weight(w.weight[:, lo:hi], w.scale, w.input_scale)
    return w[:, lo:hi]


class ShardedSource(WeightSource):
    """Wraps a full-model source; asked with per-rank shapes, it loads full tensors and slices."""

    def __init__(self, inner: WeightSource, rank: int, tp: int, vocab_parallel: bool = False):
        self.inner, self.rank, self.tp, self.vocab_parallel = inner, rank, tp, vocab_parallel

    def linear(self, name, out_features, in_features):
        leaf = name.rsplit(".", 1)[-1]
        r, tp = self.rank, self.tp
        if name == "lm_head" and self.vocab_parallel:
            w, b = self.inner.linear(name, out_features, in_features)
            lo, hi = vocab_slice(out_features, r, tp)
            return _rows(w, lo, hi), (b[lo:hi] if b is not None else None)
        if leaf in COLUMN_PARALLEL:
            w, b = self.inner.linear(name, out_features * tp, in_features)
            lo, hi = r * out_features, (r + 1) * out_features
            return _rows(w, lo, hi), (b[lo:hi] if b is not None else None)
        if leaf in ROW_PARALLEL:
            w, b = self.inner.linear(name, out_features, in_features * tp)
            if b is not None:
                raise ValueError(f"{name} has a bias; row-parallel layers with biases are not supported")
            return _cols(w, r * in_features, (r + 1) * in_features), None
        return self.inner.linear(name, out_features, in_features)

    def tensor(self, name, shape, device, dtype):
        return self.inner.tensor(name, shape, device, dtype)

    def has_linear(self, name):
        return self.inner.has_linear(name)


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
    from ..env import tp_allreduce

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


def vocab_slice(vocab: int, rank: int, tp: int) -> tuple[int, int]:
    """The vocabulary rows of ``rank``: ceil(vocab / tp) each, the last rank's slice shorter when uneven."""
    per = -(-vocab // tp)
    return min(vocab, rank * per), min(vocab, (rank + 1) * per)


class VocabParallelHead(nn.Module):
    """This rank's rows of the lm_head, then the ranks' logits all-gathered in rank order: the full (..., vocab)
    logits on every rank. Slices are padded to one width for the gather (the last may be shorter)."""

    def __init__(self, inner: nn.Module, vocab: int, tp: int):
        super().__init__()
        self.inner, self.vocab, self.tp = inner, vocab, tp
        self.width = -(-vocab // tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        if y.shape[-1] < self.width:
            y = nn.functional.pad(y, (0, self.width - y.shape[-1]))
        y = y.contiguous()
        gathered = torch.empty((self.tp * y.shape[0], *y.shape[1:]), dtype=y.dtype, device=y.device)
        dist.all_gather_into_tensor(gathered, y)  # rank r's slice at rows r * b .. (r + 1) * b
        return torch.cat(gathered.view(self.tp, *y.shape).unbind(0), dim=-1)[..., : self.vocab]


def shard_lm_head(model: nn.Module, rank: int, tp: int) -> None:
    """Vocabulary-parallel lm_head: a tied one becomes this rank's rows of the embedding (an untied one was
    loaded as its rows by ``ShardedSource``); then the all-gather around it."""
    from ..nn.linear import DenseLinear

    vocab = model.args.vocab_size
    lo, hi = vocab_slice(vocab, rank, tp)
    head = model.lm_head
    if isinstance(head, DenseLinear) and head.weight.shape[0] == vocab:  # tied: built from the whole embedding
        head = DenseLinear(model.embed[lo:hi], None, model.device, model.dtype)
    model.lm_head = VocabParallelHead(head, vocab, tp)


def _single_gpu_split(layer: nn.Module, n: int, k: int, gated: bool) -> int:
    """The split-K one GPU uses for the full ``n`` x ``k`` layer (the launch table's, from M = 1)."""
    from ..packing.layout import K_ALIGN, round_up as _round_up
    from ..dispatch.tuning import mma_config
    from ..kernels.device import device_arch

    sm, sms = device_arch(layer.codes.device.index)
    fmt = "nvfp4" if isinstance(layer, NVFP4Linear) else "fp8"
    return mma_config(sm, sms, fmt, gated, n, k, _round_up(k, K_ALIGN), 1).split_k


def match_single_gpu_splits(model: nn.Module, tp: int) -> None:
    """Give each quantized shard the split-K of its full layer on one GPU: a column-parallel rank (a slice of
    the rows) the full layer's, a row-parallel rank (a slice of K) the full layer's divided by ``tp``. A
    rank's rows then add up their k in the order one GPU does; with two ranks and an even split, one GPU
    sums each half of its slices as a rank sums its own before adding the halves (``sum_slices`` in
    ``cuda/weight_mma.cu``), so the ranks' float32 shares summed give one GPU's sum bit for bit."""
    if model.device.type != "cuda":  # before the GPU-only imports (tuning needs Triton)
        return
    from ..kernels.cuda import weight_mma
    from ..packing.layout import K_ALIGN, round_up as _round_up
    from ..kernels.device import device_arch

    if not weight_mma.enabled(device_arch(model.device.index)[0]):
        return
    quantized = (NVFP4Linear, FP8Linear)
    for blk in model.blocks:
        qkv = blk.attn.qkv if isinstance(blk.attn.qkv, nn.ModuleList) else [blk.attn.qkv]
        column = [(m, False) for m in qkv] + [(blk.mlp.gated, True)] + [(m, False) for m in (
            blk.mlp.gate_up, blk.mlp.gate, blk.mlp.up)]
        for layer, gated in column:
            if isinstance(layer, quantized):
                layer.split_k = _single_gpu_split(layer, layer.out_features * tp, layer.in_features, gated)
        for layer in (blk.attn.o_proj, blk.mlp.down):
            if not isinstance(layer, quantized):
                continue
            full_k = layer.in_features * tp
            split = _single_gpu_split(layer, layer.out_features, full_k, False)
            step = weight_mma.STEP_K["nvfp4" if isinstance(layer, NVFP4Linear) else "fp8"]
            if split % tp == 0 and (_round_up(full_k, K_ALIGN) // step) % tp == 0:  # else: close, not the same bits
                layer.split_k = split // tp


def wrap_row_parallel(model: nn.Module, tp: int) -> None:
    match_single_gpu_splits(model, tp)
    peer = peer_all_reduce(model.device, model.args.hidden_size)
    for blk in model.blocks:
        blk.attn.o_proj = AllReduce(blk.attn.o_proj, peer)
        blk.mlp.down = AllReduce(blk.mlp.down, peer)


def load_model_tp(path, device, dtype, rank: int, tp: int, progress: bool = False):
    """This rank's shard of the checkpoint at ``path`` (the process group must be initialised)."""
    from ..runtime.loader import CheckpointSource
    from ..runtime.plan import plan_checkpoint

    plan = plan_checkpoint(path)
    return build_model_tp(plan.args, CheckpointSource(plan), device, dtype, rank, tp, progress and rank == 0)


def build_model_tp(args: ModelArgs, src: WeightSource, device, dtype, rank: int, tp: int, progress: bool = False):
    """Rank ``rank``'s shard of the model ``src`` holds whole: its slices of every linear, the all-reduces after
    the row-parallel ones, and the lm_head replicated or split by vocabulary (``ANYFP4_TP_LM_HEAD``)."""
    from ..env import tp_lm_head
    from ..runtime.loader import build_model

    vocab_parallel = tp_lm_head() == "vocab"
    with torch.no_grad():
        model = build_model(rank_args(args, tp), ShardedSource(src, rank, tp, vocab_parallel), torch.device(device),
                            dtype, progress)
    wrap_row_parallel(model, tp)
    if vocab_parallel:
        shard_lm_head(model, rank, tp)
    return model


def init_process_group(rank: int, tp: int, device_type: str, port: int) -> None:
    import threading

    from tqdm import tqdm

    # tqdm's default lock is a multiprocessing semaphore, which a rank leaving through os._exit (run_rank)
    # never releases: the resource tracker then warns about leaked semaphores when the run ends.
    tqdm.set_lock(threading.RLock())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "gloo" and os.path.exists("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # CPU ranks are local: talk over loopback
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=tp, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group(backend, rank=rank, world_size=tp)


def run_rank(work, *args) -> None:
    """Run one rank's ``work(*args)`` inside an initialised process group. On an error the traceback is
    printed and the process leaves at once: tearing NCCL down with collectives still pending on the other
    ranks would hang, and the parent's ``mp.spawn`` then stops the other ranks and reports the failure."""
    import sys
    import traceback

    try:
        model = work(*args)
        dist.barrier()  # no rank tears its connections down while another still uses them
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    if model is not None and model.device.type == "cuda":
        from ..runtime.generate import forget_decode_graphs

        forget_decode_graphs(model)  # graphs holding NCCL kernels go before the communicator
        torch.cuda.synchronize()
    del model
    dist.destroy_process_group()
    # The rank's work is done and written: leave without the interpreter's teardown, where a communication
    # helper thread once aborted a finished CPU rank ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(worker, args: tuple, tp: int) -> None:
    """Run ``worker(rank, *args)`` in ``tp`` processes and wait for them.

    Interrupts belong to this process: a Ctrl-C reaches the whole process group, so the ranks start with
    SIGINT ignored (inherited, in effect before their interpreter starts) and this process, stopped by the
    interrupt or by SIGTERM, terminates them. No rank outlives it and none prints a traceback of its own."""
    import signal
    import threading

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    in_main_thread = threading.current_thread() is threading.main_thread()  # where signal handlers are set
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
    try:
        ranks = mp.spawn(worker, args=args, nprocs=tp, join=False)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
    try:
        while not ranks.join():
            pass
    except ProcessException as e:
        raise RuntimeError(f"tensor-parallel {e} (its error is printed above)") from e
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.terminate()
        for process in ranks.processes:
            process.join()


def generate_worker(rank: int, tp: int, path: str, prompts: list, params, device_type: str, dtype_name: str,
                    port: int, result_file: str) -> None:
    """One rank of ``generate_tp``: load the shard, generate (every rank takes the same greedy or
    same-seeded sampling decisions), rank 0 writes the tokens."""
    import json

    from ..runtime.generate import generate

    init_process_group(rank, tp, device_type, port)

    def work():
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        model = load_model_tp(path, device, getattr(torch, dtype_name), rank, tp)
        out = generate(model, prompts, params)
        if rank == 0:
            with open(result_file, "w") as f:
                json.dump(out, f)
        return model

    run_rank(work)


def generate_tp(path, prompts: list, params, tp: int, device_type: str = "cpu", dtype_name: str = "float32",
                port: int = 29517) -> list[list[int]]:
    """Greedy / sampled generation with the model split over ``tp`` processes (one per GPU, or CPU ranks)."""
    import json
    import tempfile

    from ..runtime.plan import plan_checkpoint

    if device_type == "cuda" and torch.cuda.device_count() < tp:
        raise ValueError(f"--tp {tp} needs {tp} GPUs, this machine has {torch.cuda.device_count()}")
    rank_args(plan_checkpoint(path).args, tp)  # a consistent checkpoint, split evenly: checked before spawning
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "tokens.json")
        spawn_ranks(generate_worker, (tp, str(path), prompts, params, device_type, dtype_name, port, result), tp)
        with open(result) as f:
            return json.load(f)
