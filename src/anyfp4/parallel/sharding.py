"""What a tensor-parallel rank holds: its per-rank architecture, its slices of every linear (``ShardedSource``
slices what the checkpoint source returns, so the model code never sees sharding), the sums after the
row-parallel linears and the lm_head replicated or split by vocabulary rows.

- column-parallel (q/k/v, gate/up): rows (output features) split evenly — a rank keeps whole attention heads
  and KV heads and 1/tp of the MLP width;
- row-parallel (o, down): columns (input features) split on 16-element group boundaries, so an NVFP4 rank keeps
  whole block scales; the partial outputs are summed by the all-reduce.
- Mixtures of experts: every expert's gate / up split by rows and down by columns, as a dense MLP's; the router is
  replicated (each rank routes every token alike), and a rank's weighted sum of its experts' shares is summed over
  the ranks in float32, once per layer.
- Gated DeltaNet layers (Qwen3.5 hybrids): a rank keeps 1/tp of the key heads and of the value heads (a value head
  stays with the key head it reads). in_proj_z, in_proj_b, in_proj_a are column-parallel; in_proj_qkv and the
  convolution's channels hold three sections (q, k, v), each split so; A_log and dt_bias follow the value heads;
  out_proj is row-parallel. The recurrent and convolution states are then each rank's own.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from ..formats.fp8 import FP8Weight
from ..formats.nvfp4 import GROUP_SIZE, NVFP4Weight
from ..nn.linear import DenseLinear, FP8Linear, NVFP4Linear
from ..runtime.config import GDNShape, ModelArgs
from ..runtime.experts import MixtureOfExperts
from ..runtime.gated_deltanet import GatedDeltaNet
from ..runtime.loader import WeightSource
from .allreduce import AllReduce, peer_all_reduce

# Mixtral's experts name their gate / up / down w1 / w3 / w2; a mixture's router (``gate``) is replicated.
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "in_proj_z", "in_proj_b", "in_proj_a", "w1",
                   "w3")
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "w2")
SECTIONED = ("in_proj_qkv", "conv1d.weight")  # q | k | v rows (channels) of a Gated DeltaNet layer
PER_VALUE_HEAD = ("A_log", "dt_bias")


def check_divisible(args: ModelArgs, tp: int) -> None:
    problems = []
    g = args.gdn
    if g is not None:
        if g.k_heads % tp:
            problems.append(f"{g.k_heads} Gated DeltaNet key heads")
        if g.v_heads % tp:
            problems.append(f"{g.v_heads} Gated DeltaNet value heads")
        elif (g.v_heads // tp * g.v_dim) % GROUP_SIZE:
            problems.append(f"Gated DeltaNet value width {g.v_heads * g.v_dim}")
    if args.num_kv_heads % tp:
        problems.append(f"{args.num_kv_heads} key/value heads")
    if args.num_heads % tp:
        problems.append(f"{args.num_heads} attention heads")
    dense_mlps = args.moe is None or len(args.moe.sparse_layers) < args.num_layers
    if dense_mlps and args.intermediate_size % (tp * GROUP_SIZE):
        problems.append(f"intermediate size {args.intermediate_size} (needs a multiple of {tp * GROUP_SIZE})")
    if args.moe is not None and args.moe.intermediate % (tp * GROUP_SIZE):
        problems.append(f"expert intermediate size {args.moe.intermediate} (needs a multiple of {tp * GROUP_SIZE})")
    if (args.num_heads * args.head_dim) % (tp * GROUP_SIZE):
        problems.append(f"attention width {args.num_heads * args.head_dim}")
    if problems:
        raise ValueError(f"cannot split this model over {tp} ranks: {', '.join(problems)} do not divide evenly")


def rank_args(args: ModelArgs, tp: int) -> ModelArgs:
    """The per-rank architecture: 1/tp of the heads (Gated DeltaNet heads too) and of the MLP width."""
    check_divisible(args, tp)
    gdn = None if args.gdn is None else replace(args.gdn, k_heads=args.gdn.k_heads // tp,
                                                v_heads=args.gdn.v_heads // tp)
    moe = None if args.moe is None else replace(args.moe, intermediate=args.moe.intermediate // tp)
    return replace(args, num_heads=args.num_heads // tp, num_kv_heads=args.num_kv_heads // tp,
                   intermediate_size=args.intermediate_size // tp, gdn=gdn, moe=moe)


def sections(gdn: GDNShape) -> list[int]:
    """The q, k and v rows of a Gated DeltaNet layer's in_proj_qkv (and channels of its convolution)."""
    return [gdn.k_heads * gdn.k_dim, gdn.k_heads * gdn.k_dim, gdn.v_heads * gdn.v_dim]


def cat_rows(weights: list):
    """NVFP4, FP8 or float weights of one layer (shards of its rows) stacked back along the rows."""
    first = weights[0]
    if isinstance(first, NVFP4Weight):
        return NVFP4Weight(torch.cat([w.packed for w in weights]), torch.cat([w.block_scale for w in weights]),
                           first.global_scale)
    if isinstance(first, FP8Weight):
        scale = first.scale if first.scale.numel() == 1 else torch.cat([w.scale.reshape(-1) for w in weights])
        return FP8Weight(torch.cat([w.weight for w in weights]), scale, first.input_scale)
    return torch.cat(weights)


def rank_sections(full: list[int], rank: int, tp: int) -> list[tuple[int, int]]:
    """(lo, hi) rows of each section that ``rank`` keeps: 1/tp of every one."""
    out, base = [], 0
    for size in full:
        per = size // tp
        out.append((base + rank * per, base + (rank + 1) * per))
        base += size
    return out


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

    def __init__(self, inner: WeightSource, rank: int, tp: int, vocab_parallel: bool = False,
                 gdn: GDNShape | None = None):
        """``gdn``: the whole model's Gated DeltaNet shape (for its sectioned tensors), if it has such layers."""
        self.inner, self.rank, self.tp, self.vocab_parallel, self.gdn = inner, rank, tp, vocab_parallel, gdn

    def linear(self, name, out_features, in_features):
        leaf = name.rsplit(".", 1)[-1]
        r, tp = self.rank, self.tp
        if leaf in SECTIONED:
            w, b = self.inner.linear(name, out_features * tp, in_features)
            parts = rank_sections(sections(self.gdn), r, tp)
            bias = None if b is None else torch.cat([b[lo:hi] for lo, hi in parts])
            return cat_rows([shard_rows(w, lo, hi) for lo, hi in parts]), bias
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
        leaf = name.split("linear_attn.", 1)[-1] if "linear_attn." in name else None
        if leaf in SECTIONED:
            whole = self.inner.tensor(name, (shape[0] * self.tp, *shape[1:]), device, dtype)
            return torch.cat([whole[lo:hi] for lo, hi in rank_sections(sections(self.gdn), self.rank, self.tp)])
        if leaf in PER_VALUE_HEAD:
            whole = self.inner.tensor(name, (shape[0] * self.tp,), device, dtype)
            return whole[self.rank * shape[0]:(self.rank + 1) * shape[0]]
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
        if isinstance(blk.attn, GatedDeltaNet):
            blk.attn.out_proj = AllReduce(blk.attn.out_proj, peer)
        else:
            blk.attn.o_proj = AllReduce(blk.attn.o_proj, peer)
        if isinstance(blk.mlp, MixtureOfExperts):  # every expert's share weighted and added, then the ranks' sums
            blk.mlp = AllReduce(blk.mlp, peer)
        else:
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

    def layers(m):
        return list(m) if isinstance(m, nn.ModuleList) else [m]

    for blk in model.blocks:
        mixer = blk.attn
        if isinstance(mixer, GatedDeltaNet):
            inputs, output = layers(mixer.in_proj_qkvz) + layers(mixer.in_proj_ba), mixer.out_proj
        else:
            inputs, output = layers(mixer.qkv), mixer.o_proj
        mlps = list(blk.mlp.experts) if isinstance(blk.mlp, MixtureOfExperts) else [blk.mlp]
        column = [(m, False) for m in inputs] + [(layer, gated) for mlp in mlps for layer, gated in (
            (mlp.gated, True), (mlp.gate_up, False), (mlp.gate, False), (mlp.up, False))]
        for layer, gated in column:
            if isinstance(layer, quantized):
                fmt = "nvfp4" if isinstance(layer, NVFP4Linear) else "fp8"
                split = single_gpu_split_k(layer.codes.device, fmt, gated, layer.out_features * tp, layer.in_features)
                if split:  # 0: the CUDA decode kernel does not serve this GPU
                    layer.split_k = split
        for layer in [output] + [mlp.down for mlp in mlps]:
            if not isinstance(layer, quantized):
                continue
            fmt = "nvfp4" if isinstance(layer, NVFP4Linear) else "fp8"
            split = row_parallel_split_k(layer.codes.device, fmt, layer.out_features, layer.in_features * tp, tp)
            if split:  # else: the CUDA kernel does not serve this GPU, or close, not the same bits
                layer.split_k = split
