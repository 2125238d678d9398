"""Model architecture from a Hugging Face ``config.json``: one frozen dataclass, validated."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..checkpoint.errors import CheckpointError

# model_type -> the transformers classes whose computation the generic decoder reproduces.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "mixtral": "MixtralForCausalLM"}
SUPPORTED_MODEL_TYPES = set(ARCHITECTURES)
HYBRID_MODEL_TYPES = ("qwen3_5_text",)  # Gated DeltaNet layers beside gated full attention
LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"
# Hybrids whose MLPs are mixtures of experts: refused with their own message until experts are supported.
HYBRID_MOE_MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
# A vision-language checkpoint whose text model the runner runs (the vision tower is not read).
HYBRID_VISION_LANGUAGE_MODEL_TYPE, VISION_LANGUAGE_ARCHITECTURE = "qwen3_5", "Qwen3_5ForConditionalGeneration"
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok")
# Mixtures of experts the runner builds: model_type -> (the MLP's module name, its experts' gate / up / down names)
MOE_LAYOUTS = {"qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
               "mixtral": ("block_sparse_moe", ("w1", "w3", "w2"))}
FLOAT32_TINY = 2.0**-126  # the smallest normal float32: the RMSNorm epsilon is added in float32


class UnsupportedModelError(CheckpointError):
    """A readable checkpoint of an architecture or feature the runner does not build."""


_REQUIRED = object()


@dataclass(frozen=True)
class GDNShape:
    """The head counts and sizes of a Gated DeltaNet layer: value head h reads key head h // (v_heads / k_heads)."""
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int

    @property
    def conv_channels(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim


@dataclass(frozen=True)
class MoEShape:
    """A mixture-of-experts MLP: ``experts`` SwiGLU experts of ``intermediate`` hidden units, each token summing the
    outputs of its ``top_k`` highest-scored (softmax of the router's logits, renormalized over the k when
    ``norm_topk_prob``). ``sparse_layers``: the decoder layers with experts (the others have a dense MLP of the
    model's intermediate_size). Tensor names: ``{block}.gate`` (the router), ``{block}.experts.E.{names}``."""
    experts: int
    top_k: int
    intermediate: int
    norm_topk_prob: bool
    sparse_layers: tuple
    block: str
    names: tuple  # the experts' gate, up and down projections


class _Fields:
    """Typed reads of config.json keys; every refusal names the key and the file."""

    def __init__(self, config: dict, source: Path):
        self.config, self.source = config, source

    def fail(self, message: str) -> CheckpointError:
        return CheckpointError(message, file=self.source)

    def get(self, key: str, default=_REQUIRED):
        value = self.config.get(key)
        if value is None:
            if default is _REQUIRED:
                raise self.fail(f"missing {key!r}")
            return default
        return value

    def int(self, key: str, default=_REQUIRED, minimum: int = 1, where: dict | None = None) -> int:
        value = (where if where is not None else self.config).get(key)
        if value is None and default is not _REQUIRED:
            return default
        if value is None:
            raise self.fail(f"missing {key!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(f"{key!r} must be an integer >= {minimum}, found {value!r}")
        return value

    def float(self, key: str, default=_REQUIRED, minimum: float = -math.inf, maximum: float = math.inf,
              where: dict | None = None) -> float:
        value = (where if where is not None else self.config).get(key)
        if value is None and default is not _REQUIRED:
            return default
        if value is None:
            raise self.fail(f"missing {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not minimum <= value <= maximum:
            raise self.fail(f"{key!r} must be a number in [{minimum:g}, {maximum:g}], found {value!r}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"{key!r} must be true or false, found {value!r}")
        return value

    def object(self, key: str) -> dict:
        value = self.config.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"{key!r} must be a JSON object or null, found {value!r}")
        return value


@dataclass(frozen=True)
class ModelArgs:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple = ()  # llama3: (factor, low_freq_factor, high_freq_factor, original_max_positions)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 always; Llama / Qwen3 with attention_bias
    o_bias: bool = False  # Llama / Qwen3 with attention_bias
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k
    # Qwen3.5 hybrids: each layer's token mixer (LINEAR_ATTENTION: a Gated DeltaNet of shape ``gdn``, or
    # FULL_ATTENTION); empty: every layer full attention
    layer_types: tuple = ()
    gdn: GDNShape | None = None
    rotary_dim: int = 0  # the leading dims of a head that RoPE rotates (0: all of them)
    attn_output_gate: bool = False  # q_proj also gives a gate: attention output * sigmoid(gate)
    zero_centered_norms: bool = False  # RMSNorm weights stored as w, applied as 1 + w
    # Where the decoder's tensors are stored (embed_tokens, layers.N, norm), and a vision tower's, which the runner
    # does not read: a vision-language checkpoint's text model is stored under model.language_model.
    weights_prefix: str = "model."
    vision_prefix: str = ""
    wrapper: str = ""  # the transformers class that holds the text model ("": the model is the checkpoint's class)
    moe: MoEShape | None = None  # mixtures of experts (Qwen3-MoE, Mixtral); None: dense MLPs

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(f"{self.num_heads} attention heads are not a multiple of "
                                        f"{self.num_kv_heads} key/value heads")

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    def layer_type(self, i: int) -> str:
        return self.layer_types[i] if self.layer_types else FULL_ATTENTION

    def has_experts(self, i: int) -> bool:
        """Whether decoder layer ``i``'s MLP is a mixture of experts."""
        return self.moe is not None and i in self.moe.sparse_layers

    @property
    def architecture(self) -> str:
        """The transformers class this model computes as."""
        if self.wrapper:
            return f"{self.wrapper}'s text model ({ARCHITECTURES[self.model_type]})"
        return ARCHITECTURES[self.model_type]

    @classmethod
    def from_hf(cls, config: dict, source: str | Path = "config.json") -> "ModelArgs":
        """The architecture of a Hugging Face ``config.json`` (``source`` names it in errors). Refuses
        what the runner would not compute as transformers does: other model types or architectures,
        mixtures of experts other than Qwen3-MoE's and Mixtral's, MLP biases, sliding-window attention, RoPE types
        other than default / llama3."""
        source = Path(source)
        if not isinstance(config, dict):
            raise CheckpointError(f"expected a JSON object, found {type(config).__name__}", file=source)
        f = _Fields(config, source)
        model_type = config.get("model_type")
        archs = config.get("architectures")
        if model_type in HYBRID_MOE_MODEL_TYPES:
            raise UnsupportedModelError(f"model_type {model_type!r}: hybrid models with mixture-of-experts MLPs are not "
                                        "supported yet (their dense Qwen3.5 relatives, 'qwen3_5_text', are)",
                                        file=source)
        if model_type == HYBRID_VISION_LANGUAGE_MODEL_TYPE:
            return _text_model_of_vision_language(cls, f)
        if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type {model_type!r} ({archs}) is not supported; anyfp4 runs "
                f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))} decoders (Llama 1/2/3, Mistral, Qwen2/2.5, Qwen3, "
                "Qwen3.5 text, SmolLM, and the mixtures of experts Qwen3-MoE and Mixtral)",
                file=source)
        _check_architecture(f, model_type, archs)
        if f.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {config['hidden_act']!r} is not supported (SwiGLU with silu only)",
                                        file=source)
        if model_type == "llama" and f.bool("mlp_bias", False):
            raise UnsupportedModelError("'mlp_bias' true (biases on the MLP projections) is not supported", file=source)
        heads = f.int("num_attention_heads")
        hidden = f.int("hidden_size")
        kv_heads = f.int("num_key_value_heads", heads)
        if heads % kv_heads:
            raise UnsupportedModelError(f"'num_attention_heads' {heads} is not a multiple of 'num_key_value_heads' "
                                        f"{kv_heads}", file=source)
        head_dim = f.int("head_dim", hidden // heads, minimum=0)
        if head_dim < 2 or head_dim % 2:
            raise f.fail(f"head_dim {head_dim} ('head_dim' or hidden_size / num_attention_heads) must be even and "
                         ">= 2 (rotary embeddings rotate pairs)")
        attention_bias = f.bool("attention_bias", False)
        hybrid = _hybrid_fields(f, f.int("num_hidden_layers"), head_dim) if model_type in HYBRID_MODEL_TYPES else {}
        moe = _moe_shape(f, model_type, f.int("num_hidden_layers")) if model_type in MOE_LAYOUTS else None
        return cls(
            model_type=model_type,
            vocab_size=f.int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=f.int("intermediate_size", 0 if moe and len(moe.sparse_layers) == f.int(
                "num_hidden_layers") else _REQUIRED),
            num_layers=f.int("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=f.float("rms_norm_eps", 1e-6, minimum=FLOAT32_TINY, maximum=1.0),
            rope_theta=_rope_theta(f),
            rope_scaling=_rope_scaling(f),
            max_position_embeddings=_context(f, model_type),
            tie_word_embeddings=f.bool("tie_word_embeddings", False),
            qkv_bias=model_type == "qwen2" or (attention_bias and model_type != "mistral"),
            o_bias=attention_bias and model_type in ("llama", "qwen3", "qwen3_moe") + HYBRID_MODEL_TYPES,
            qk_norm=model_type in ("qwen3", "qwen3_moe") + HYBRID_MODEL_TYPES,
            moe=moe,
            **hybrid,
        )


def _text_model_of_vision_language(cls, f: _Fields) -> ModelArgs:
    """A Qwen3.5 vision-language checkpoint (``Qwen3_5ForConditionalGeneration``): its text model, read from
    ``text_config`` and stored under ``model.language_model.``; the vision tower (``model.visual.``) is not run."""
    archs = f.config.get("architectures")
    if archs is not None and archs != [VISION_LANGUAGE_ARCHITECTURE]:
        raise UnsupportedModelError(f"'architectures' {archs} does not match model_type "
                                    f"{HYBRID_VISION_LANGUAGE_MODEL_TYPE!r}: anyfp4 would run the text model of "
                                    f"{VISION_LANGUAGE_ARCHITECTURE}", file=f.source)
    text = f.object("text_config")
    if not text:
        raise f.fail(f"model_type {HYBRID_VISION_LANGUAGE_MODEL_TYPE!r} needs a 'text_config' object (its text model)")
    if text.get("model_type", HYBRID_MODEL_TYPES[0]) != HYBRID_MODEL_TYPES[0]:
        raise UnsupportedModelError(f"'text_config' has model_type {text['model_type']!r}; a Qwen3.5 vision-language "
                                    f"model's text model is {HYBRID_MODEL_TYPES[0]!r}", file=f.source)
    tie = {k: c["tie_word_embeddings"] for k, c in (("config.json", f.config), ("text_config", text))
           if c.get("tie_word_embeddings") is not None}
    if len(set(tie.values())) > 1:
        raise f.fail(f"'tie_word_embeddings' is {tie['config.json']} at the top and {tie['text_config']} in "
                     "'text_config': they disagree on the output head")
    inner = {**text, "model_type": HYBRID_MODEL_TYPES[0], "architectures": None,
             "tie_word_embeddings": next(iter(tie.values()), False)}
    args = cls.from_hf(inner, f.source)
    return replace(args, weights_prefix="model.language_model.", vision_prefix="model.visual.",
                   wrapper=VISION_LANGUAGE_ARCHITECTURE)


def _check_architecture(f: _Fields, model_type: str, archs: object) -> None:
    if archs is not None:
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise f.fail(f"'architectures' must be a list of class names, found {archs!r}")
        other = [a for a in archs if a != ARCHITECTURES[model_type]]
        if other:
            raise UnsupportedModelError(
                f"'architectures' {archs} does not match model_type {model_type!r}: anyfp4 would run it as "
                f"{ARCHITECTURES[model_type]}", file=f.source)
    experts = [k for k in MOE_KEYS if f.config.get(k) not in (None, 0, 1, False)]
    if experts and model_type not in MOE_LAYOUTS:
        raise UnsupportedModelError(f"mixture-of-experts models ({experts[0]!r} = {f.config[experts[0]]!r}) are not "
                                    "supported", file=f.source)


def _hybrid_fields(f: _Fields, layers: int, head_dim: int) -> dict:
    """A Qwen3.5 hybrid's layer types, Gated DeltaNet shape, partial rotary dims, output gate and (1 + w) norms
    (keys missing from config.json take transformers' defaults for Qwen3.5)."""
    types = f.config.get("layer_types")
    if types is None:  # every full_attention_interval-th layer full attention, as transformers derives it
        interval = f.int("full_attention_interval", 4)
        types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(t not in (LINEAR_ATTENTION, FULL_ATTENTION)
                                                                   for t in types):
        raise f.fail(f"'layer_types' must list {layers} entries ('num_hidden_layers'), each {LINEAR_ATTENTION!r} or "
                     f"{FULL_ATTENTION!r}; found {types!r}")
    gdn = GDNShape(k_heads=f.int("linear_num_key_heads", 16), v_heads=f.int("linear_num_value_heads", 32),
                   k_dim=f.int("linear_key_head_dim", 128), v_dim=f.int("linear_value_head_dim", 128),
                   conv_kernel=f.int("linear_conv_kernel_dim", 4, minimum=2))
    if gdn.v_heads % gdn.k_heads:
        raise f.fail(f"'linear_num_value_heads' {gdn.v_heads} is not a multiple of 'linear_num_key_heads' "
                     f"{gdn.k_heads}")
    partial = f.float("partial_rotary_factor", 0.25, minimum=0.0, maximum=1.0,
                      where={"partial_rotary_factor": f.object("rope_parameters").get(
                          "partial_rotary_factor", f.config.get("partial_rotary_factor"))})
    rotary = int(head_dim * partial)
    if rotary < 2 or rotary % 2:
        raise f.fail(f"partial_rotary_factor {partial:g} of head_dim {head_dim} rotates {rotary} dims: must be even "
                     "and >= 2")
    return dict(layer_types=tuple(types), gdn=gdn, rotary_dim=rotary, attn_output_gate=True,
                zero_centered_norms=True)


def _moe_shape(f: _Fields, model_type: str, layers: int) -> MoEShape:
    """Qwen3-MoE's or Mixtral's experts, as transformers reads their config (Qwen3-MoE: the layers listed in
    ``mlp_only_layers`` or off the ``decoder_sparse_step`` keep a dense MLP; Mixtral: every layer, top-k
    renormalized). Refuses what their routers would not compute: shared experts, routed scaling, grouped top-k."""
    for key in ("shared_expert_intermediate_size", "n_shared_experts", "routed_scaling_factor", "n_group",
                "topk_group"):
        if f.config.get(key) not in (None, 0):
            raise UnsupportedModelError(f"{key!r} = {f.config[key]!r}: {model_type} routing with shared experts, "
                                        "routed scaling or grouped top-k is not supported", file=f.source)
    block, names = MOE_LAYOUTS[model_type]
    counts = {k: f.config[k] for k in ("num_local_experts", "num_experts") if f.config.get(k) is not None}
    if len(set(map(str, counts.values()))) > 1:
        raise f.fail(f"'num_local_experts' {counts['num_local_experts']!r} and 'num_experts' {counts['num_experts']!r} "
                     "disagree on the number of experts")
    key = next(iter(counts), "num_experts")
    experts = f.int(key)
    top_k = f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.fail(f"'num_experts_per_tok' {top_k} exceeds the {experts} experts ({key!r})")
    if model_type == "mixtral":
        return MoEShape(experts, top_k, f.int("intermediate_size"), True, tuple(range(layers)), block, names)
    step = f.int("decoder_sparse_step", 1)
    dense = f.get("mlp_only_layers", [])
    if not isinstance(dense, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in dense):
        raise f.fail(f"'mlp_only_layers' must be a list of layer indices, found {dense!r}")
    sparse = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    return MoEShape(experts, top_k, f.int("moe_intermediate_size"), f.bool("norm_topk_prob", False), sparse, block,
                    names)


def _rope_theta(f: _Fields) -> float:
    """Real models use 10^4 to 10^7; below 1 the inverse frequencies would grow along the head."""
    where = {"rope_theta": f.object("rope_parameters").get("rope_theta", f.config.get("rope_theta"))}
    return f.float("rope_theta", 10000.0, minimum=1.0, maximum=1e300, where=where)


def _rope_scaling(f: _Fields) -> tuple:
    rope, legacy = f.object("rope_parameters"), f.object("rope_scaling")
    rope_type = rope.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
    if rope_type == "default":
        return ()
    if rope_type != "llama3":
        raise UnsupportedModelError(f"RoPE type {rope_type!r} is not supported (default and llama3 are)",
                                    file=f.source)
    p = {**legacy, **rope}
    factor = f.float("factor", minimum=1.0, maximum=1e30, where=p)
    low = f.float("low_freq_factor", minimum=1e-30, maximum=1e30, where=p)
    high = f.float("high_freq_factor", minimum=1e-30, maximum=1e30, where=p)
    if not high > low:
        raise f.fail(f"llama3 RoPE needs 'high_freq_factor' > 'low_freq_factor', found {high:g} <= {low:g}")
    return factor, low, high, f.int("original_max_position_embeddings", where=p)


def _context(f: _Fields, model_type: str) -> int:
    """The longest sequence the decoder computes as transformers does: Mistral's sliding window caps it
    (the runner attends to every cached token); Qwen's sliding window is refused."""
    context = f.int("max_position_embeddings", 4096)
    if model_type in ("mistral", "mixtral"):
        window = f.int("sliding_window", context)
        return min(context, window)
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and f.bool("use_sliding_window", False):
        raise UnsupportedModelError("'use_sliding_window' true (sliding-window attention) is not supported",
                                    file=f.source)
    return context


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding (float32), llama3 scaling applied when configured."""
    dim = args.rope_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if not args.rope_scaling:
        return inv_freq
    factor, low, high, original = args.rope_scaling
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)
