"""What the runner builds from a checkpoint, checked against what the checkpoint stores — before any
weight is read. ``anyfp4 inspect`` and the loader share this one check, so inspect calls "valid"
exactly what ``generate`` runs, and says which architecture it runs it as.

From config.json (``ModelArgs``) follow every linear the decoder reads, with its shape and whether it
has a bias, and every other tensor (embeddings, norms) with its shape. The checkpoint must store
exactly those: the decoder layers 0 .. num_hidden_layers-1 and no more, each linear with the config's
shape, biases where the architecture has them and nowhere else, the norms, an ``lm_head`` unless the
embeddings are tied (and not as well), and no other tensor (a stored tensor the runner would not read
means config and weights describe different models: more experts than the config has, an extra layer, a bias) — a Qwen3.5 hybrid's
multi-token-prediction head (``mtp.*``) aside, which is stored beside the model and planned on its own
(``plan_mtp``, for ``--speculate mtp``), and a vision-language checkpoint's vision tower (``ModelArgs.vision_prefix``),
which the text model does not read. The decoder's tensors sit under ``ModelArgs.weights_prefix``.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from ..checkpoint.errors import CheckpointError
from ..checkpoint.modules import FLOAT_DTYPES, IGNORED_SUFFIXES, LayerSpec
from ..checkpoint.quant_config import WeightFormat
from ..checkpoint.reader import CheckpointReader
from .config import LINEAR_ATTENTION, ModelArgs, UnsupportedModelError

LM_HEAD = "lm_head"
# Stored tensors no decoder reads: KV-cache / activation scales, old exports' RoPE buffers.
UNREAD_SUFFIXES = IGNORED_SUFFIXES + ("inv_freq",)
# A hybrid's multi-token-prediction head (a draft for speculative decoding): stored beside the model, read only by
# plan_mtp / load_mtp.
MTP_PREFIX = "mtp."


def embedding(args: ModelArgs) -> str:
    return f"{args.weights_prefix}embed_tokens.weight"


def final_norm(args: ModelArgs) -> str:
    return f"{args.weights_prefix}norm.weight"


def layer_prefix(args: ModelArgs, i: int) -> str:
    return f"{args.weights_prefix}layers.{i}."


@dataclass(frozen=True)
class LinearPlan:
    out_features: int
    in_features: int
    bias: bool


@dataclass(frozen=True)
class ModelPlan:
    reader: CheckpointReader
    args: ModelArgs
    linears: Mapping[str, LinearPlan]  # module name -> shape and bias, as the builder asks for them
    tensors: Mapping[str, tuple[int, ...]]  # embedding and norms: name -> shape

    @property
    def architecture(self) -> str:
        return self.args.architecture

    @property
    def tied_head(self) -> bool:
        return LM_HEAD not in self.linears

    def layers(self) -> list[LayerSpec]:
        return [self.reader.layer_by_name[name] for name in self.linears]


def block_linears(args: ModelArgs, i: int, prefix: str | None = None) -> dict[str, LinearPlan]:
    """Decoder layer ``i``'s linears (``prefix``: another layer's names, full attention: an MTP head's layer)."""
    p, h, hd = prefix or layer_prefix(args, i), args.hidden_size, args.head_dim
    q, kv, inter = args.num_heads * hd, args.num_kv_heads * hd, args.intermediate_size
    if prefix is None and args.layer_type(i) == LINEAR_ATTENTION:
        g = args.gdn
        mixer = {
            f"{p}linear_attn.in_proj_qkv": LinearPlan(g.conv_channels, h, False),
            f"{p}linear_attn.in_proj_z": LinearPlan(g.v_heads * g.v_dim, h, False),
            f"{p}linear_attn.in_proj_b": LinearPlan(g.v_heads, h, False),
            f"{p}linear_attn.in_proj_a": LinearPlan(g.v_heads, h, False),
            f"{p}linear_attn.out_proj": LinearPlan(h, g.v_heads * g.v_dim, False),
        }
    else:
        mixer = {
            f"{p}self_attn.q_proj": LinearPlan(2 * q if args.attn_output_gate else q, h, args.qkv_bias),
            f"{p}self_attn.k_proj": LinearPlan(kv, h, args.qkv_bias),
            f"{p}self_attn.v_proj": LinearPlan(kv, h, args.qkv_bias),
            f"{p}self_attn.o_proj": LinearPlan(h, q, args.o_bias),
        }
    if prefix is None and args.has_experts(i):
        return {**mixer, **expert_linears(args, p)}
    return {
        **mixer,
        f"{p}mlp.gate_proj": LinearPlan(inter, h, False),
        f"{p}mlp.up_proj": LinearPlan(inter, h, False),
        f"{p}mlp.down_proj": LinearPlan(h, inter, False),
    }


def router(args: ModelArgs, p: str) -> str:
    """The router of the mixture of experts of the layer with prefix ``p``."""
    return f"{p}{args.moe.block}.gate"


def expert(args: ModelArgs, p: str, e: int) -> tuple[str, str, str]:
    """Expert ``e``'s gate, up and down projections in the layer with prefix ``p``."""
    return tuple(f"{p}{args.moe.block}.experts.{e}.{n}" for n in args.moe.names)


def expert_linears(args: ModelArgs, p: str) -> dict[str, LinearPlan]:
    """A mixture-of-experts MLP's linears: its router (float, one logit per expert), then each expert's."""
    m, h = args.moe, args.hidden_size
    out = {router(args, p): LinearPlan(m.experts, h, False)}
    for e in range(m.experts):
        gate, up, down = expert(args, p, e)
        out.update({gate: LinearPlan(m.intermediate, h, False), up: LinearPlan(m.intermediate, h, False),
                    down: LinearPlan(h, m.intermediate, False)})
    return out


def block_tensors(args: ModelArgs, i: int, prefix: str | None = None) -> dict[str, tuple[int, ...]]:
    p, h = prefix or layer_prefix(args, i), args.hidden_size
    out = {f"{p}input_layernorm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,)}
    if prefix is None and args.layer_type(i) == LINEAR_ATTENTION:
        g = args.gdn
        out.update({f"{p}linear_attn.conv1d.weight": (g.conv_channels, 1, g.conv_kernel),
                    f"{p}linear_attn.A_log": (g.v_heads,), f"{p}linear_attn.dt_bias": (g.v_heads,),
                    f"{p}linear_attn.norm.weight": (g.v_dim,)})
    elif args.qk_norm:
        out.update({f"{p}self_attn.q_norm.weight": (args.head_dim,), f"{p}self_attn.k_norm.weight": (args.head_dim,)})
    return out


def model_needs(args: ModelArgs, untied_head: bool) -> tuple[dict[str, LinearPlan], dict[str, tuple[int, ...]]]:
    """Every linear and every other tensor the decoder for ``args`` reads, in the order it reads them."""
    linears: dict[str, LinearPlan] = {}
    tensors: dict[str, tuple[int, ...]] = {embedding(args): (args.vocab_size, args.hidden_size)}
    for i in range(args.num_layers):
        linears.update(block_linears(args, i))
        tensors.update(block_tensors(args, i))
    tensors[final_norm(args)] = (args.hidden_size,)
    if untied_head:
        linears[LM_HEAD] = LinearPlan(args.vocab_size, args.hidden_size, False)
    return linears, tensors


def _check_layer_count(reader: CheckpointReader, args: ModelArgs) -> None:
    layer = re.compile(re.escape(args.weights_prefix) + r"layers\.(\d+)\.")
    stored = sorted({int(m.group(1)) for n in reader.index.names() if (m := layer.match(n))})
    if stored != list(range(args.num_layers)):
        held = f"decoder layers {stored[0]}-{stored[-1]} ({len(stored)} of them)" if stored else "no decoder layers"
        raise CheckpointError(f"'num_hidden_layers' is {args.num_layers} but the weights hold {held}: config.json "
                              "and the weights describe different models", file=reader.config_file)


def _check_head(reader: CheckpointReader, args: ModelArgs) -> None:
    stored = LM_HEAD in reader.layer_by_name
    if args.tie_word_embeddings and stored:
        raise CheckpointError("'tie_word_embeddings' is true but lm_head is stored too: config.json and the weights "
                              "disagree on the output head", file=reader.config_file, tensor=f"{LM_HEAD}.weight")
    if not args.tie_word_embeddings and not stored:
        raise CheckpointError("'tie_word_embeddings' is false but no lm_head is stored", file=reader.config_file,
                              tensor=f"{LM_HEAD}.weight")


def _check_linear(reader: CheckpointReader, args: ModelArgs, name: str, want: LinearPlan) -> LayerSpec:
    layer = reader.layer_by_name.get(name)
    if layer is None:
        odd = next((n for n in (f"{name}.weight", f"{name}.weight_packed") if n in reader.index), None)
        if odd is not None:
            shape = list(reader.index[odd].shape)
            raise CheckpointError(f"linear {name} must store a 2-D weight, found {shape}", file=reader.index[odd].file,
                                  tensor=odd)
        raise CheckpointError(f"the model needs linear {name!r}, which the checkpoint does not hold",
                              file=reader.root, tensor=f"{name}.weight")
    got = (layer.out_features, layer.in_features)
    if got != (want.out_features, want.in_features):
        raise CheckpointError(f"{name} is {got[0]} x {got[1]} but config.json implies {want.out_features} x "
                              f"{want.in_features}: checkpoint and config do not match", file=reader.root,
                              tensor=next(iter(layer.tensors.values())))
    if layer.has_bias != want.bias:
        raise CheckpointError(f"{name} {'stores a bias' if layer.has_bias else 'has no stored bias'} but "
                              f"{_bias_rule(args, name, want.bias)}", file=reader.config_file, tensor=f"{name}.bias")
    return layer


def _bias_rule(args: ModelArgs, name: str, bias: bool) -> str:
    if ".self_attn." in name and args.model_type in ("llama", "qwen3", "qwen3_5_text"):
        return f"'attention_bias' is {'true' if bias else 'false'}"
    return f"{args.architecture} has {'a bias' if bias else 'none'} there"


def _check_tensor(reader: CheckpointReader, name: str, shape: tuple[int, ...]) -> None:
    if name not in reader.index:
        raise CheckpointError("tensor the model needs is missing", file=reader.root, tensor=name)
    info = reader.index[name]
    if info.dtype not in FLOAT_DTYPES:
        raise CheckpointError(f"must be a float tensor (bf16, fp16 or fp32; a quantized embedding or norm is not "
                              f"read), found {info.dtype}", file=info.file, tensor=name)
    if info.shape != shape:
        raise CheckpointError(f"shape {list(info.shape)}, config.json implies {list(shape)}", file=info.file,
                              tensor=name)


def _check_nothing_else(reader: CheckpointReader, read: set[str], args: ModelArgs) -> None:
    extra = [n for n in reader.index.names() if n not in read and not n.endswith(UNREAD_SUFFIXES)
             and not (args.layer_types and n.startswith(MTP_PREFIX))
             and not (args.vision_prefix and n.startswith(args.vision_prefix))]
    if extra:
        raise CheckpointError(f"{len(extra)} stored tensor(s) that the model for config.json would not read, e.g. "
                              f"{extra[:3]}: config.json and the weights describe different models",
                              file=reader.root, tensor=extra[0])


def plan_model(reader: CheckpointReader) -> ModelPlan:
    """The model the runner builds for ``reader``'s checkpoint, refused (``CheckpointError`` /
    ``UnsupportedModelError``) unless its config and tensors agree. Reads headers only."""
    args = ModelArgs.from_hf(reader.config, reader.config_file)
    _check_layer_count(reader, args)
    _check_head(reader, args)
    linears, tensors = model_needs(args, untied_head=not args.tie_word_embeddings)
    read: set[str] = set()
    routers = {router(args, layer_prefix(args, i)) for i in range(args.num_layers) if args.has_experts(i)}
    for name, want in linears.items():
        layer = _check_linear(reader, args, name, want)
        if name in routers and layer.format is not WeightFormat.NONE:
            raise CheckpointError(f"router {name} is stored {layer.format.value}; a mixture of experts' router is "
                                  "run in floating point (quantizers leave it out: exclude it when quantizing)",
                                  file=reader.root, tensor=next(iter(layer.tensors.values())))
        read.update(layer.tensors.values())
    for name, shape in tensors.items():
        _check_tensor(reader, name, shape)
        read.add(name)
    _check_nothing_else(reader, read, args)
    return ModelPlan(reader, args, MappingProxyType(linears), MappingProxyType(tensors))


MTP_LAYER = MTP_PREFIX + "layers.0."
MTP_NORMS = tuple(f"{MTP_PREFIX}{n}.weight" for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"))


def plan_mtp(plan: ModelPlan) -> ModelPlan:
    """The checkpoint's multi-token-prediction head (``mtp.*``: fc, its two input norms, one full-attention decoder
    layer, a final norm) checked against the config like the model's own layers; refused, naming what is missing,
    for a checkpoint without one."""
    reader, args = plan.reader, plan.args
    stored = [n for n in reader.index.names() if n.startswith(MTP_PREFIX)]
    if not args.layer_types or not stored:
        raise CheckpointError("--speculate mtp needs the checkpoint's multi-token-prediction head (mtp.* tensors), "
                              "which it does not store", file=reader.root, tensor=f"{MTP_PREFIX}fc.weight")
    layers = sorted({int(m.group(1)) for n in stored if (m := re.match(r"mtp\.layers\.(\d+)\.", n))})
    if layers != [0]:
        raise UnsupportedModelError(f"an MTP head of {len(layers)} decoder layers ({layers}) is not supported (one is)",
                                    file=reader.root)
    h = args.hidden_size
    linears = {f"{MTP_PREFIX}fc": LinearPlan(h, 2 * h, False), **block_linears(args, 0, MTP_LAYER)}
    tensors = {**{n: (h,) for n in MTP_NORMS}, **block_tensors(args, 0, MTP_LAYER)}
    for name, want in linears.items():
        _check_linear(reader, args, name, want)
    for name, shape in tensors.items():
        _check_tensor(reader, name, shape)
    return ModelPlan(reader, args, MappingProxyType(linears), MappingProxyType(tensors))


def plan_checkpoint(path: str | Path) -> ModelPlan:
    """The plan of the checkpoint at ``path``; what its reader tolerated is said as a warning, a line each."""
    reader = CheckpointReader(path)
    for note in reader.notes:
        warnings.warn(f"anyfp4: {note}", stacklevel=2)
    return plan_model(reader)
