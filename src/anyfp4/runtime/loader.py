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


class WeightSource:
    """Where the model builder gets its tensors: a checkpoint, or random weights (bench)."""

    def linear(self, name: str, out_features: int, in_features: int):  # -> (weight, bias)
        raise NotImplementedError

    def tensor(self, name: str, shape: tuple, device, dtype) -> torch.Tensor:
        raise NotImplementedError

    def has_linear(self, name: str) -> bool:
        raise NotImplementedError


class CheckpointSource(WeightSource):
    def __init__(self, reader: CheckpointReader):
        self.reader = reader

    def linear(self, name, out_features, in_features):
        weight = _weight(self.reader, name)
        _check_shape(self.reader, name, (out_features, in_features))
        return weight

    def tensor(self, name, shape, device, dtype):
        t = _tensor(self.reader, name, device, dtype)
        if tuple(t.shape) != tuple(shape):
            raise CheckpointError(f"shape {tuple(t.shape)}, config.json implies {tuple(shape)}",
                                  file=self.reader.root, tensor=name)
        return t

    def has_linear(self, name):
        return name in self.reader.layer_by_name


def _block(src: WeightSource, args: ModelArgs, i: int, device, dtype) -> Block:
    p = f"model.layers.{i}."
    h, hd = args.hidden_size, args.head_dim
    rows = (args.num_heads * hd, args.num_kv_heads * hd, args.num_kv_heads * hd)
    loaded = [src.linear(f"{p}self_attn.{x}_proj", n, h) for x, n in zip("qkv", rows)]
    qkv = fused_linear([w for w, _ in loaded], [b for _, b in loaded], device, dtype)
    if qkv is None:
        qkv = nn.ModuleList([make_linear(w, b, device, dtype) for w, b in loaded])
    o, o_bias = src.linear(f"{p}self_attn.o_proj", h, args.num_heads * hd)
    q_norm = k_norm = None
    if args.qk_norm:
        q_norm = RMSNorm(src.tensor(f"{p}self_attn.q_norm.weight", (hd,), device, dtype), args.rms_norm_eps)
        k_norm = RMSNorm(src.tensor(f"{p}self_attn.k_norm.weight", (hd,), device, dtype), args.rms_norm_eps)
    attn = Attention(args, qkv, make_linear(o, o_bias, device, dtype), q_norm, k_norm)
    i_size = args.intermediate_size
    gate, up = (src.linear(f"{p}mlp.{x}_proj", i_size, h)[0] for x in ("gate", "up"))
    down = src.linear(f"{p}mlp.down_proj", h, i_size)[0]
    mlp = GatedMLP(gate, up, down, device, dtype)
    norms = [RMSNorm(src.tensor(f"{p}{n}.weight", (h,), device, dtype), args.rms_norm_eps)
             for n in ("input_layernorm", "post_attention_layernorm")]
    return Block(attn, mlp, *norms)


def build_model(args: ModelArgs, src: WeightSource, device, dtype, progress: bool = True) -> Transformer:
    embed = src.tensor("model.embed_tokens.weight", (args.vocab_size, args.hidden_size), device, dtype)
    blocks = [_block(src, args, i, device, dtype)
              for i in tqdm(range(args.num_layers), desc="loading", unit="layer", disable=not progress)]
    norm = RMSNorm(src.tensor("model.norm.weight", (args.hidden_size,), device, dtype), args.rms_norm_eps)
    if src.has_linear("lm_head"):
        w, b = src.linear("lm_head", args.vocab_size, args.hidden_size)
        lm_head = make_linear(w, b, device, dtype)
    elif args.tie_word_embeddings:
        lm_head = DenseLinear(embed, None, device, dtype)
    else:
        raise CheckpointError("no lm_head.weight and tie_word_embeddings is false", tensor="lm_head.weight")
    return Transformer(args, embed, blocks, norm, lm_head).eval()


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
               progress: bool = True) -> tuple[Transformer, CheckpointReader]:
    """The decoder for the checkpoint at ``path``, on ``device`` with activations in ``dtype``."""
    reader = CheckpointReader(path)
    args = ModelArgs.from_hf(reader.config)
    try:
        model = build_model(args, CheckpointSource(reader), torch.device(device), dtype, progress)
    except torch.cuda.OutOfMemoryError:
        need = sum(reader.index[n].nbytes for n in reader.index.names())
        dev = torch.device(device)
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" and torch.cuda.is_available() else 0
        raise MemoryError(
            f"out of GPU memory while loading {path}: its weights take {need / 1024**3:.1f} GiB on disk and "
            f"{free / 1024**3:.1f} GiB are free now on {device}; free the GPU, use a smaller checkpoint, "
            "or load on another device") from None
    return model, reader
