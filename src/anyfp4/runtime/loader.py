"""Build the decoder from a checkpoint: NVFP4, FP8, mixed or plain float, streamed layer by layer.

Each decoder layer's tensors are read from the safetensors memory maps, prepacked and moved to
the device before the next layer is read, so host memory stays near one layer.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from ..checkpoint.errors import CheckpointError
from ..checkpoint.reader import CheckpointReader
from ..nn.linear import DenseLinear, GatedMLP, fused_linear, make_linear
from .config import LINEAR_ATTENTION, ModelArgs
from .experts import MixtureOfExperts
from .gated_deltanet import GatedDeltaNet
from .model import Attention, Block, RMSNorm, Transformer
from .mtp import MTPHead
from .plan import (MTP_LAYER, MTP_NORMS, MTP_PREFIX, ModelPlan, embedding, expert, final_norm, layer_prefix,
                   plan_checkpoint, router)


class WeightSource:
    """Where the model builder gets its tensors: a checkpoint, or random weights (bench)."""

    def linear(self, name: str, out_features: int, in_features: int):  # -> (weight, bias)
        raise NotImplementedError

    def tensor(self, name: str, shape: tuple, device, dtype) -> torch.Tensor:
        raise NotImplementedError

    def has_linear(self, name: str) -> bool:
        raise NotImplementedError


class CheckpointSource(WeightSource):
    """Serves what ``plan`` (the consistency check of config and tensors) says the model reads, each
    tensor's values checked as it is read; a request outside the plan is a bug in the builder."""

    def __init__(self, plan: ModelPlan):
        self.plan, self.reader = plan, plan.reader
        self.unread = set(plan.linears) | set(plan.tensors)

    def _planned(self, name: str, planned: tuple, asked: tuple) -> None:
        if planned != asked:
            raise RuntimeError(f"the model builder asked for {name} as {asked}, the plan has {planned}")
        self.unread.discard(name)

    def linear(self, name, out_features, in_features):
        want = self.plan.linears.get(name)
        self._planned(name, (want.out_features, want.in_features) if want else None, (out_features, in_features))
        return self.reader.load_layer(self.reader.layer_by_name[name], with_bias=want.bias)

    def tensor(self, name, shape, device, dtype):
        self._planned(name, self.plan.tensors.get(name), tuple(shape))
        return self.reader.load_float(name).to(device=device, dtype=dtype)

    def has_linear(self, name):
        return name in self.plan.linears


def _norm(src: WeightSource, args: ModelArgs, name: str, size: int, device, dtype) -> RMSNorm:
    """An RMSNorm's weight; a zero-centered one (stored w, applied 1 + w) kept as 1 + w in float32."""
    if args.zero_centered_norms:
        return RMSNorm(1.0 + src.tensor(name, (size,), device, torch.float32), args.rms_norm_eps)
    return RMSNorm(src.tensor(name, (size,), device, dtype), args.rms_norm_eps)


def _gated_deltanet(src: WeightSource, args: ModelArgs, p: str, device, dtype) -> GatedDeltaNet:
    g, h = args.gdn, args.hidden_size
    vd = g.v_heads * g.v_dim
    def pair(first: tuple[str, int], second: tuple[str, int]) -> nn.Module:
        """Two projections of the input as one fused linear where their formats allow, else a ModuleList."""
        loaded = [src.linear(f"{p}linear_attn.{name}", n, h) for name, n in (first, second)]
        fused = fused_linear([w for w, _ in loaded], [b for _, b in loaded], device, dtype)
        return fused if fused is not None else nn.ModuleList([make_linear(w, b, device, dtype) for w, b in loaded])

    qkvz = pair(("in_proj_qkv", g.conv_channels), ("in_proj_z", vd))
    ba = pair(("in_proj_b", g.v_heads), ("in_proj_a", g.v_heads))
    out = make_linear(*src.linear(f"{p}linear_attn.out_proj", h, vd), device, dtype)
    conv = src.tensor(f"{p}linear_attn.conv1d.weight", (g.conv_channels, 1, g.conv_kernel), device, dtype)[:, 0]
    return GatedDeltaNet(g, qkvz, ba, out, conv_weight=conv.contiguous(),
                         a_log=src.tensor(f"{p}linear_attn.A_log", (g.v_heads,), device, torch.float32),
                         dt_bias=src.tensor(f"{p}linear_attn.dt_bias", (g.v_heads,), device, torch.float32),
                         norm_weight=src.tensor(f"{p}linear_attn.norm.weight", (g.v_dim,), device, dtype),
                         eps=args.rms_norm_eps)


def _block(src: WeightSource, args: ModelArgs, i: int, device, dtype, prefix: str | None = None) -> Block:
    """Decoder layer ``i`` (``prefix``: a full-attention layer of other names, an MTP head's)."""
    p, h = prefix or layer_prefix(args, i), args.hidden_size
    linear_attention = prefix is None and args.layer_type(i) == LINEAR_ATTENTION
    mixer = _gated_deltanet(src, args, p, device, dtype) if linear_attention else _attention(src, args, p, device, dtype)
    if prefix is None and args.has_experts(i):
        mlp = _experts(src, args, p, device, dtype)
    else:
        i_size = args.intermediate_size
        gate, up = (src.linear(f"{p}mlp.{x}_proj", i_size, h)[0] for x in ("gate", "up"))
        down = src.linear(f"{p}mlp.down_proj", h, i_size)[0]
        mlp = GatedMLP(gate, up, down, device, dtype)
    norms = [_norm(src, args, f"{p}{n}.weight", h, device, dtype) for n in ("input_layernorm", "post_attention_layernorm")]
    return Block(mixer, mlp, *norms)


def _experts(src: WeightSource, args: ModelArgs, p: str, device, dtype) -> MixtureOfExperts:
    m, h = args.moe, args.hidden_size
    router_weight, router_bias = src.linear(router(args, p), m.experts, h)
    experts = []
    for e in range(m.experts):
        gate, up, down = expert(args, p, e)
        experts.append(GatedMLP(src.linear(gate, m.intermediate, h)[0], src.linear(up, m.intermediate, h)[0],
                                src.linear(down, h, m.intermediate)[0], device, dtype))
    return MixtureOfExperts(m, make_linear(router_weight, router_bias, device, dtype), experts)


def _attention(src: WeightSource, args: ModelArgs, p: str, device, dtype) -> Attention:
    h, hd = args.hidden_size, args.head_dim
    q_rows = args.num_heads * hd * (2 if args.attn_output_gate else 1)
    rows = (q_rows, args.num_kv_heads * hd, args.num_kv_heads * hd)
    loaded = [src.linear(f"{p}self_attn.{x}_proj", n, h) for x, n in zip("qkv", rows)]
    qkv = fused_linear([w for w, _ in loaded], [b for _, b in loaded], device, dtype)
    if qkv is None:
        qkv = nn.ModuleList([make_linear(w, b, device, dtype) for w, b in loaded])
    o, o_bias = src.linear(f"{p}self_attn.o_proj", h, args.num_heads * hd)
    q_norm = k_norm = None
    if args.qk_norm:
        q_norm, k_norm = (_norm(src, args, f"{p}self_attn.{n}.weight", hd, device, dtype) for n in ("q_norm", "k_norm"))
    return Attention(args, qkv, make_linear(o, o_bias, device, dtype), q_norm, k_norm)


def build_model(args: ModelArgs, src: WeightSource, device, dtype, progress: bool = True) -> Transformer:
    embed = src.tensor(embedding(args), (args.vocab_size, args.hidden_size), device, dtype)
    blocks = [_block(src, args, i, device, dtype)
              for i in tqdm(range(args.num_layers), desc="loading", unit="layer", disable=not progress)]
    norm = _norm(src, args, final_norm(args), args.hidden_size, device, dtype)
    if src.has_linear("lm_head"):
        w, b = src.linear("lm_head", args.vocab_size, args.hidden_size)
        lm_head = make_linear(w, b, device, dtype)
    elif args.tie_word_embeddings:
        lm_head = DenseLinear(embed, None, device, dtype)
    else:
        raise CheckpointError("no lm_head.weight and tie_word_embeddings is false", tensor="lm_head.weight")
    return Transformer(args, embed, blocks, norm, lm_head).eval()


def build_mtp(args: ModelArgs, src: WeightSource, device, dtype) -> MTPHead:
    """A multi-token-prediction head (``mtp.*``) from ``src``."""
    dev = torch.device(device)
    fc = make_linear(*src.linear(f"{MTP_PREFIX}fc", args.hidden_size, 2 * args.hidden_size), dev, dtype)
    norm_e, norm_h, norm = (_norm(src, args, n, args.hidden_size, dev, dtype) for n in MTP_NORMS)
    return MTPHead(fc, norm_e, norm_h, _block(src, args, 0, dev, dtype, prefix=MTP_LAYER), norm).eval()


def load_mtp(plan: ModelPlan, device, dtype) -> MTPHead:
    """The checkpoint's multi-token-prediction head (``plan_mtp``'s plan), for speculative decoding."""
    src = CheckpointSource(plan)
    head = build_mtp(plan.args, src, device, dtype)
    if src.unread:
        raise RuntimeError(f"the MTP builder did not read {sorted(src.unread)[:3]}, which the plan has")
    return head


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
               progress: bool = True) -> tuple[Transformer, CheckpointReader]:
    """The decoder for the checkpoint at ``path``, on ``device`` with activations in ``dtype``."""
    plan = plan_checkpoint(path)
    return load_planned(plan, device, dtype, progress), plan.reader


def load_planned(plan: ModelPlan, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
                 progress: bool = True) -> Transformer:
    """The decoder ``plan`` describes (config and tensors already checked against each other)."""
    src = CheckpointSource(plan)
    try:
        model = build_model(plan.args, src, torch.device(device), dtype, progress)
    except torch.cuda.OutOfMemoryError:
        index = plan.reader.index
        need = sum(index[n].nbytes for n in index.names())
        dev = torch.device(device)
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" and torch.cuda.is_available() else 0
        raise MemoryError(
            f"out of GPU memory while loading {plan.reader.root}: its weights take {need / 1024**3:.1f} GiB on disk "
            f"and {free / 1024**3:.1f} GiB are free now on {device}; free the GPU, use a smaller checkpoint, "
            "or load on another device") from None
    if src.unread:
        raise RuntimeError(f"the model builder did not read {sorted(src.unread)[:3]}, which the plan has")
    return model
