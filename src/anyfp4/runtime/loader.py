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
from ..checkpoint.quant_config import WeightFormat
from ..checkpoint.reader import CheckpointReader
from ..layers import DenseLinear, GatedMLP, fused_linear, make_linear
from .config import ModelArgs
from .model import Attention, Block, RMSNorm, Transformer


def _weight(reader: CheckpointReader, name: str):
    layer = reader.layer_by_name.get(name)
    if layer is None:
        raise CheckpointError(f"the model needs linear {name!r}, which the checkpoint does not hold",
                              file=reader.root, tensor=f"{name}.weight")
    if layer.format is WeightFormat.NVFP4:
        return reader.load_nvfp4(layer), reader.load_bias(layer)
    if layer.format is WeightFormat.FP8:
        return reader.load_fp8(layer), reader.load_bias(layer)
    return reader.load_dense(layer), reader.load_bias(layer)


def _tensor(reader: CheckpointReader, name: str, device, dtype) -> torch.Tensor:
    if name not in reader.index:
        raise CheckpointError("tensor the model needs is missing", file=reader.root, tensor=name)
    return reader.load(name).to(device=device, dtype=dtype)


def _check_shape(reader: CheckpointReader, name: str, expected: tuple[int, int]) -> None:
    layer = reader.layer_by_name[name]
    if (layer.out_features, layer.in_features) != expected:
        raise CheckpointError(f"{name} is {layer.out_features} x {layer.in_features} but config.json implies "
                              f"{expected[0]} x {expected[1]}: checkpoint and config do not match",
                              file=reader.root, tensor=f"{name}.weight")


def _block(reader: CheckpointReader, args: ModelArgs, i: int, device, dtype) -> Block:
    p = f"model.layers.{i}."
    h, hd = args.hidden_size, args.head_dim
    names = [f"{p}self_attn.{x}_proj" for x in "qkv"]
    for name, rows in zip(names, (args.num_heads * hd, args.num_kv_heads * hd, args.num_kv_heads * hd)):
        _weight(reader, name)  # existence, with a clear error
        _check_shape(reader, name, (rows, h))
    loaded = [_weight(reader, n) for n in names]
    qkv = fused_linear([w for w, _ in loaded], [b for _, b in loaded], device, dtype)
    if qkv is None:
        qkv = nn.ModuleList([make_linear(w, b, device, dtype) for w, b in loaded])
    o, o_bias = _weight(reader, f"{p}self_attn.o_proj")
    q_norm = k_norm = None
    if args.qk_norm:
        q_norm = RMSNorm(_tensor(reader, f"{p}self_attn.q_norm.weight", device, dtype), args.rms_norm_eps)
        k_norm = RMSNorm(_tensor(reader, f"{p}self_attn.k_norm.weight", device, dtype), args.rms_norm_eps)
    attn = Attention(args, qkv, make_linear(o, o_bias, device, dtype), q_norm, k_norm)
    for proj, shape in (("gate", (args.intermediate_size, h)), ("up", (args.intermediate_size, h)),
                        ("down", (h, args.intermediate_size))):
        _weight(reader, f"{p}mlp.{proj}_proj")
        _check_shape(reader, f"{p}mlp.{proj}_proj", shape)
    gate, up, down = (_weight(reader, f"{p}mlp.{x}_proj")[0] for x in ("gate", "up", "down"))
    mlp = GatedMLP(gate, up, down, device, dtype)
    norms = [RMSNorm(_tensor(reader, f"{p}{n}.weight", device, dtype), args.rms_norm_eps)
             for n in ("input_layernorm", "post_attention_layernorm")]
    return Block(attn, mlp, *norms)


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
               progress: bool = True) -> tuple[Transformer, CheckpointReader]:
    """The decoder for the checkpoint at ``path``, on ``device`` with activations in ``dtype``."""
    device = torch.device(device)
    reader = CheckpointReader(path)
    args = ModelArgs.from_hf(reader.config)
    embed = _tensor(reader, "model.embed_tokens.weight", device, dtype)
    if embed.shape != (args.vocab_size, args.hidden_size):
        raise CheckpointError(f"embedding is {tuple(embed.shape)}, config.json implies "
                              f"({args.vocab_size}, {args.hidden_size})", file=reader.root,
                              tensor="model.embed_tokens.weight")
    blocks = [_block(reader, args, i, device, dtype)
              for i in tqdm(range(args.num_layers), desc="loading", unit="layer", disable=not progress)]
    norm = RMSNorm(_tensor(reader, "model.norm.weight", device, dtype), args.rms_norm_eps)
    if "lm_head" in reader.layer_by_name:
        w, b = _weight(reader, "lm_head")
        lm_head = make_linear(w, b, device, dtype)
    elif args.tie_word_embeddings:
        lm_head = DenseLinear(embed, None, device, dtype)
    else:
        raise CheckpointError("no lm_head.weight and tie_word_embeddings is false", file=reader.root,
                              tensor="lm_head.weight")
    return Transformer(args, embed, blocks, norm, lm_head).eval(), reader
