"""Models of real shape with random weights, made directly on the device: speed work without downloads.

Random but valid (``random_weights``): NVFP4 codes uniform over all 16 values with positive normal block
scales (bytes 0x28..0x4F, 0.25 .. 7.5) and one global scale per fused group; FP8 bytes over the finite range
with per-tensor scales (and a static activation scale, as W8A8 checkpoints carry); float weights Gaussian.
Never zeros (a kernel must not be timed on zeros).

On the command line and in reports such a model is named ``random:ARCH:FORMAT`` (``RandomSpec``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpoint.quant_config import module_matches
from ..checkpoint.writer import DEFAULT_EXCLUDE, TargetFormat, layer_format
from ..runtime.config import FULL_ATTENTION, LINEAR_ATTENTION, MOE_LAYOUTS, GDNShape, ModelArgs, MoEShape
from ..runtime.loader import WeightSource, build_model
from .random_weights import random_bf16, random_fp8, random_nvfp4

ARCHS = {
    "llama-3.1-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
                         rope_theta=500000.0, rope_scaling=(8.0, 1.0, 4.0, 8192), max_position_embeddings=131072),
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6,
                     rope_theta=1000000.0, max_position_embeddings=40960, qk_norm=True),
    # the 27B Qwen3.5-style hybrid: Gated DeltaNet in three of every four layers (head counts: transformers' Qwen3.5
    # defaults), gated full attention with RoPE on a quarter of each head in the fourth
    "qwen3.5-27b": dict(model_type="qwen3_5_text", vocab_size=248320, hidden_size=5120, intermediate_size=17408,
                        num_layers=64, num_heads=24, num_kv_heads=4, head_dim=256, rms_norm_eps=1e-6,
                        rope_theta=10000000.0, max_position_embeddings=262144, qk_norm=True,
                        layer_types=tuple(FULL_ATTENTION if i % 4 == 3 else LINEAR_ATTENTION for i in range(64)),
                        gdn=GDNShape(k_heads=16, v_heads=32, k_dim=128, v_dim=128, conv_kernel=4), rotary_dim=64,
                        attn_output_gate=True, zero_centered_norms=True),
    # a mixture of experts: 128 experts of 768 hidden units in every layer, 8 run per token (Qwen3-30B-A3B)
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, rms_norm_eps=1e-6,
                          rope_theta=1000000.0, max_position_embeddings=40960, qk_norm=True,
                          moe=MoEShape(128, 8, 768, True, tuple(range(48)), *MOE_LAYOUTS["qwen3_moe"])),
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                         rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True),
}
FORMATS = ("nvfp4", "fp8", "mixed", "bf16")


QUANTIZED_HEAD = "+lm_head"  # format suffix: the lm_head quantized too (NVFP4 for mixed)
MODEL_NVFP4_SCALE_BYTES = (0x28, 0x50)  # block scales 0.25 .. 7.5: with the global 2e-3, weights up to 0.09
SPEC_PREFIX = "random:"


def check_random_format(fmt: str, tied: bool) -> str:
    """``fmt`` without its ``+lm_head`` suffix; a ValueError for a format random weights do not come in."""
    base = fmt.removesuffix(QUANTIZED_HEAD)
    if base not in FORMATS:
        raise ValueError(f"random weights come as {', '.join(FORMATS)} (optionally {QUANTIZED_HEAD}), not {fmt!r}")
    if base != fmt and (base == "bf16" or tied):
        raise ValueError(f"{fmt!r}: " + ("a bf16 model has no quantized lm_head" if base == "bf16" else
                                         "this architecture ties its lm_head to the embeddings"))
    return base


def random_args(arch: str, fmt: str) -> ModelArgs:
    """The shape of ``arch`` with ``fmt`` checked against it, before any weights are made."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")
    args = ModelArgs(**ARCHS[arch])
    check_random_format(fmt, args.tie_word_embeddings)
    return args


@dataclass(frozen=True)
class RandomSpec:
    """A random-weight model by name: ``random:ARCH:FORMAT``, FORMAT one of ``FORMATS``, optionally with
    ``+lm_head`` (e.g. ``random:llama-3.1-8b:nvfp4+lm_head``); ``str()`` writes it back."""

    arch: str
    fmt: str

    @classmethod
    def parse(cls, text: str) -> "RandomSpec | None":
        """The random model ``text`` names, or None when it names none (a checkpoint directory); a ValueError
        for ``random:`` without an architecture and a format."""
        if not text.startswith(SPEC_PREFIX):
            return None
        arch, colon, fmt = text[len(SPEC_PREFIX):].partition(":")
        if not colon:
            raise ValueError(f"{text!r}: a random-weight model is named {SPEC_PREFIX}ARCH:FORMAT")
        return cls(arch, fmt)

    def __str__(self) -> str:
        return f"{SPEC_PREFIX}{self.arch}:{self.fmt}"

    def args(self) -> ModelArgs:
        """The model's shape, architecture and format checked: a ValueError before any weights are made."""
        return random_args(self.arch, self.fmt)

    def model(self, device, dtype, progress: bool = True, rank: int = 0, tp: int = 1):
        return random_model(self.arch, self.fmt, device, dtype, progress=progress, rank=rank, tp=tp)


class RandomSource(WeightSource):
    """``fmt``: one of ``FORMATS``, the lm_head bf16 (as ModelOpt exports keep it), or with the suffix
    ``+lm_head`` quantized like the rest (as ``anyfp4 quantize --no-default-exclude`` writes it)."""

    def __init__(self, fmt: str, device, seed: int = 0, tied: bool = False, zero_centered: bool = False):
        base = check_random_format(fmt, tied)
        self.quantized_head = base != fmt
        self.fmt, self.device, self.tied, self.zero_centered = base, torch.device(device), tied, zero_centered
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def _format_of(self, name: str) -> str:
        if name == "lm_head" and self.quantized_head:
            return "nvfp4" if self.fmt == "mixed" else self.fmt
        if self.fmt == "bf16" or any(module_matches(name, p) for p in DEFAULT_EXCLUDE):  # as quantize leaves them
            return "bf16"
        return layer_format(name, TargetFormat(self.fmt)).value

    def linear(self, name, out_features, in_features):
        fmt, d, g = self._format_of(name), self.device, self.gen
        if fmt == "nvfp4":
            # one global scale for every projection: fused groups (q/k/v, gate/up) share it
            return random_nvfp4(out_features, in_features, d, g, scale_bytes=MODEL_NVFP4_SCALE_BYTES,
                                global_scale=2e-3), None
        if fmt == "fp8":
            # a static activation scale as a W8A8 checkpoint carries one (|x| up to 448 * 0.05 = 22.4)
            return random_fp8(out_features, in_features, d, g, scale=1e-4, input_scale=0.05), None
        return random_bf16(out_features, in_features, d, g, std=in_features**-0.5), None

    def tensor(self, name, shape, device, dtype):
        if name.endswith("norm.weight") or name.startswith("mtp.pre_fc_norm"):  # 1 as applied (stored 0 if zero-centered)
            zero_centered = self.zero_centered and "linear_attn.norm" not in name
            return torch.full(shape, 0.0 if zero_centered else 1.0, device=device, dtype=dtype)
        return (torch.randn(shape, device=self.device, generator=self.gen) * 0.02).to(device=device, dtype=dtype)

    def has_linear(self, name):
        return name == "lm_head" and not self.tied


def random_mtp_head(arch: str, fmt: str, device, dtype, seed: int = 1):
    """A multi-token-prediction head of random weights for a hybrid ``arch`` (as checkpoints store it: bf16)."""
    from ..runtime.loader import build_mtp

    args = random_args(arch, fmt)
    if not args.layer_types:
        raise ValueError(f"random weights of {arch} have no multi-token-prediction head (a Qwen3.5 hybrid's)")
    src = RandomSource(fmt, device, seed, tied=args.tie_word_embeddings, zero_centered=args.zero_centered_norms)
    with torch.no_grad():
        return build_mtp(args, src, device, dtype)


def random_model(arch: str, fmt: str, device, dtype, seed: int = 0, progress: bool = True, rank: int = 0,
                 tp: int = 1):
    """A model of ``arch``'s shape with random ``fmt`` weights made on ``device``; with ``tp`` > 1 rank
    ``rank``'s shard of it (every rank draws the same full tensors and keeps its slice)."""
    args = random_args(arch, fmt)
    src = RandomSource(fmt, device, seed, tied=args.tie_word_embeddings, zero_centered=args.zero_centered_norms)
    if tp > 1:
        from ..parallel.model import build_model_tp

        return build_model_tp(args, src, device, dtype, rank, tp, progress)
    with torch.no_grad():
        return build_model(args, src, torch.device(device), dtype, progress)
