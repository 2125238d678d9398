"""Model architecture from a Hugging Face ``config.json``: one frozen dataclass, validated."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUPPORTED_MODEL_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


class UnsupportedModelError(ValueError):
    pass


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
    attention_bias: bool = False  # Qwen2: q/k/v carry biases
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(f"{self.num_heads} attention heads are not a multiple of "
                                        f"{self.num_kv_heads} key/value heads")

    @classmethod
    def from_hf(cls, config: dict) -> "ModelArgs":
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = config.get("architectures")
            raise UnsupportedModelError(
                f"model_type {model_type!r} ({archs}) is not supported; anyfp4 runs "
                f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))} decoders (Llama 1/2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM)")
        if config.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {config['hidden_act']!r} is not supported (SwiGLU with silu only)")
        rope = dict(config.get("rope_parameters") or {})
        legacy = config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        scaling: tuple = ()
        if rope_type == "llama3":
            p = {**legacy, **rope}
            scaling = (float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"]),
                       int(p["original_max_position_embeddings"]))
        elif rope_type != "default":
            raise UnsupportedModelError(f"RoPE type {rope_type!r} is not supported (default and llama3 are)")
        heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        return cls(
            model_type=model_type,
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            qk_norm=model_type == "qwen3",
        )


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding (float32), llama3 scaling applied when configured."""
    dim = args.head_dim
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
