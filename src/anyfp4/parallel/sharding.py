"""What a tensor-parallel rank holds: its per-rank architecture, its slices of every linear (``ShardedSource``
slices what the checkpoint source returns, so the model code never sees sharding), the sums after the
row-parallel linears and the lm_head replicated or split by vocabulary rows.

- column-parallel (q/k/v, gate/up): rows (output features) split evenly — a rank keeps whole attention heads
  and KV heads and 1/tp of the MLP width;
- row-parallel (o, down): columns (input features) split on 16-element group boundaries, so an NVFP4 rank keeps
  whole block scales; the partial outputs are summed by the all-reduce.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from ..formats.fp8 import FP8Weight
from ..formats.nvfp4 import GROUP_SIZE, NVFP4Weight
from ..nn.linear import DenseLinear, FP8Linear, NVFP4Linear
from ..runtime.config import ModelArgs
from ..runtime.loader import WeightSource
from .allreduce import AllReduce, peer_all_reduce

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")


def check_divisible(args: ModelArgs, tp: int) -> None:
    if args.layer_types and tp > 1:
        raise ValueError(f"tensor parallelism of {args.architecture} (Gated DeltaNet layers) is not supported yet: "
                         "run it on one GPU")
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


def shard_rows(w, lo: int, hi: int):
    """Output rows ``lo`` .. ``hi`` of an NVFP4, FP8 or float weight (a column-parallel shard)."""
    if isinstance(w, NVFP4Weight):
        return NVFP4Weight(w.packed[lo:hi], w.block_scale[lo:hi], w.global_scale)
    if isinstance(w, FP8Weight):
        scale = w.scale.reshape(-1)[lo:hi] if w.scale.numel() > 1 else w.scale
        return FP8Weight(w.weight[lo:hi], scale, w.input_scale)
    return w[lo:hi]


def shard_cols(w, lo: int, hi: int):
    """Input columns ``lo`` .. ``hi`` of an NVFP4 (on 16-element group boundaries), FP8 or float weight (a
    row-parallel shard)."""
    if isinstance(w, NVFP4Weight):
        return NVFP4Weight(w.packed[:, lo // 2:hi // 2], w.block_scale[:, lo // GROUP_SIZE:hi // GROUP_SIZE],
                           w.global_scale)
    if isinstance(w, FP8Weight):
        return FP8Weight(w.weight[:, lo:hi], w.scale, w.input_scale)
    return w[:, lo:hi]


def vocab_slice(vocab: int, rank: int, tp: int) -> tuple[int, int]:
    """The vocabulary rows of ``rank``: ceil(vocab / tp) each, the last rank's slice shorter when uneven."""
    per = -(-vocab // tp)
    return min(vocab, rank * per), min(vocab, (rank + 1) * per)


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
            return shard_rows(w, lo, hi), (b[lo:hi] if b is not None else None)
        if leaf in COLUMN_PARALLEL:
            w, b = self.inner.linear(name, out_features * tp, in_features)
            lo, hi = r * out_features, (r + 1) * out_features
            return shard_rows(w, lo, hi), (b[lo:hi] if b is not None else None)
        if leaf in ROW_PARALLEL:
            w, b = self.inner.linear(name, out_features, in_features * tp)
            if b is not None:
                raise ValueError(f"{name} has a bias; row-parallel layers with biases are not supported")
            return shard_cols(w, r * in_features, (r + 1) * in_features), None
        return self.inner.linear(name, out_features, in_features)

    def tensor(self, name, shape, device, dtype):
        return self.inner.tensor(name, shape, device, dtype)

    def has_linear(self, name):
        return self.inner.has_linear(name)


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
    vocab = model.args.vocab_size
    lo, hi = vocab_slice(vocab, rank, tp)
    head = model.lm_head
    if isinstance(head, DenseLinear) and head.weight.shape[0] == vocab:  # tied: built from the whole embedding
        head = DenseLinear(model.embed[lo:hi], None, model.device, model.dtype)
    model.lm_head = VocabParallelHead(head, vocab, tp)


def wrap_row_parallel(model: nn.Module, tp: int) -> None:
    """Row-parallel linears followed by the sum of the ranks' shares, each quantized shard run with its full
    layer's split-K."""
    match_single_gpu_splits(model, tp)
    peer = peer_all_reduce(model.device, model.args.hidden_size)
    for blk in model.blocks:
        blk.attn.o_proj = AllReduce(blk.attn.o_proj, peer)
        blk.mlp.down = AllReduce(blk.mlp.down, peer)


def match_single_gpu_splits(model: nn.Module, tp: int) -> None:
    """Give each quantized shard the split-K of its full layer on one GPU (``dispatch.split_k``): a column-parallel
    rank (a slice of the rows) the full layer's, a row-parallel rank (a slice of K) the full layer's divided by
    ``tp``. A rank's rows then add up their k in the order one GPU does; with two ranks and an even split, one GPU
    sums each half of its slices as a rank sums its own before adding the halves (``sum_slices`` in
    ``cuda/weight_mma.cu``), so the ranks' float32 shares summed give one GPU's sum bit for bit."""
    if model.device.type != "cuda":
        return
    from ..dispatch.split_k import row_parallel_split_k, single_gpu_split_k

    quantized = (NVFP4Linear, FP8Linear)
    for blk in model.blocks:
        qkv = blk.attn.qkv if isinstance(blk.attn.qkv, nn.ModuleList) else [blk.attn.qkv]
        column = [(m, False) for m in qkv] + [(blk.mlp.gated, True)] + [(m, False) for m in (
            blk.mlp.gate_up, blk.mlp.gate, blk.mlp.up)]
        for layer, gated in column:
            if isinstance(layer, quantized):
                fmt = "nvfp4" if isinstance(layer, NVFP4Linear) else "fp8"
                split = single_gpu_split_k(layer.codes.device, fmt, gated, layer.out_features * tp, layer.in_features)
                if split:  # 0: the CUDA decode kernel does not serve this GPU
                    layer.split_k = split
        for layer in (blk.attn.o_proj, blk.mlp.down):
            if not isinstance(layer, quantized):
                continue
            fmt = "nvfp4" if isinstance(layer, NVFP4Linear) else "fp8"
            split = row_parallel_split_k(layer.codes.device, fmt, layer.out_features, layer.in_features * tp, tp)
            if split:  # else: the CUDA kernel does not serve this GPU, or close, not the same bits
                layer.split_k = split
