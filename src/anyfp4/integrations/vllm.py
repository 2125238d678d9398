"""vLLM plugin: serve ModelOpt NVFP4 / W4A16_NVFP4 / FP8 / MIXED_PRECISION and compressed-tensors
``nvfp4-pack-quantized`` / ``float-quantized`` checkpoints through anyfp4's ops.

``register()`` (the ``vllm.general_plugins`` entry point; safe to call more than once) registers the
quantization method ``anyfp4`` with vLLM's public ``register_quantization_config``. It claims a
checkpoint when the user asks for it (``quantization="anyfp4"``), or, with ``ANYFP4_VLLM_AUTO=1``, when
the GPU has no native kernels for the checkpoint's format (NVFP4 below sm_100, FP8 below sm_89) or
vLLM runs on the CPU. Nothing in vLLM is patched: without the plugin asked for, vLLM picks its own
methods as before.

Checkpoint parsing (formats per layer, exclusions from ``ignore`` / ``exclude_modules``) is anyfp4's
own (``checkpoint.quant_config``). Parameters carry the checkpoint's tensor names and vLLM's parameter
classes, so vLLM's loaders take each tensor-parallel shard (column-parallel: rows; row-parallel: K,
which must stay on 16-element group boundaries). After loading, every layer is prepacked once; a
merged layer (q/k/v, gate/up) whose parts carry different NVFP4 global scales keeps one prepack per
run of equal scales and concatenates their outputs, so no scale is approximated. ``apply`` calls
``torch.ops.anyfp4.*``, whose own M dispatch keeps decode and prefill paths under vLLM's compile and
CUDA graphs. Expert layers of mixtures of experts get ``vllm_experts.AnyFP4ExpertsMethod``.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    UnquantizedLinearMethod,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.parameter import (
    ChannelQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)

from .. import ops as _ops  # noqa: F401  (registers torch.ops.anyfp4.*, which apply() calls)
from ..checkpoint.errors import CheckpointError
from ..checkpoint.modules import quantized_suffixes
from ..checkpoint.quant_config import QuantScheme, WeightFormat, scheme_from_config
from ..runtime.config import MOE_LAYOUTS

NAME = "anyfp4"
# apply() calls per format in this process (tests read it to prove the plugin's path really ran)
APPLY_CALLS = {"nvfp4": 0, "fp8": 0}  # expert layers count theirs in vllm_experts.APPLY_CALLS
# vLLM fuses these projections; the checkpoint (and its exclusion / mixed-precision lists) names the parts
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def parse_scheme(config: dict[str, Any]) -> QuantScheme:
    """anyfp4's reading of the quantization config vLLM hands over (config.json's ``quantization_config``
    or ModelOpt's ``hf_quant_config.json``)."""
    return scheme_from_config(config, "quantization_config")


def _native_support_missing(scheme: QuantScheme) -> bool:
    if not torch.cuda.is_available():
        return True
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    formats = set(scheme.layer_formats.values()) if scheme.is_mixed else {scheme.default_format}
    return (WeightFormat.NVFP4 in formats and sm < 100) or (WeightFormat.FP8 in formats and sm < 89)


def _is_moe(layer: torch.nn.Module) -> bool:
    """vLLM's expert layers (``FusedMoE`` in older releases, ``RoutedExperts`` in newer ones)."""
    return any(c.__name__ in ("FusedMoE", "RoutedExperts") for c in type(layer).__mro__)


class AnyFP4Config(QuantizationConfig):
    """The ``anyfp4`` quantization method (module level: vLLM pickles it to its engine process)."""

    def __init__(self, scheme: QuantScheme, fp8_per_channel: bool = False):
        super().__init__()
        self.scheme = scheme
        self.fp8_per_channel = fp8_per_channel  # compressed-tensors float-quantized, "channel" strategy

    def __repr__(self) -> str:
        return f"AnyFP4Config(producer={self.scheme.producer}, algo={self.scheme.algo})"

    def get_name(self) -> str:
        return NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16, torch.float32]  # float32 on the CPU only

    @classmethod
    def get_min_capability(cls) -> int:
        return 70

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["hf_quant_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AnyFP4Config:
        scheme = parse_scheme(config)
        groups = config.get("config_groups") or {}
        per_channel = scheme.producer == "compressed-tensors" and any(
            (g.get("weights") or {}).get("strategy") == "channel" for g in groups.values() if isinstance(g, dict))
        return cls(scheme, per_channel)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        from ..env import vllm_auto

        if user_quant not in (NAME, None) or (user_quant is None and not vllm_auto()):
            return None
        try:
            scheme = parse_scheme(hf_quant_cfg)
        except CheckpointError as e:
            if user_quant == NAME:  # asked for by name: say why not, instead of vLLM's generic mismatch
                raise ValueError(f"anyfp4 cannot serve this checkpoint: {e}") from None
            return None
        if user_quant == NAME or _native_support_missing(scheme):
            return NAME
        return None

    def format_of(self, prefix: str) -> WeightFormat:
        """The weight format of the vLLM module ``prefix`` (fused modules: all parts must agree). The parts of a
        fused module come from the model's ``packed_modules_mapping`` (vLLM sets it on the config before the model
        is built), else from ``FUSED_PARTS``."""
        parent, _, leaf = prefix.rpartition(".")
        packed = getattr(self, "packed_modules_mapping", None) or {}
        parts = [f"{parent}.{p}" if parent else p for p in packed.get(leaf, FUSED_PARTS.get(leaf, (leaf,)))]
        formats = {self.scheme.format_of(p) for p in parts}
        if len(formats) > 1:
            raise ValueError(f"anyfp4: the parts of {prefix} ({', '.join(parts)}) have different formats "
                             f"({', '.join(sorted(f.value for f in formats))}); vLLM runs them as one layer")
        return formats.pop()

    def experts_format(self, prefix: str, experts: int) -> WeightFormat:
        """The weight format of vLLM's expert layer ``prefix``: every expert's gate, up and down (named as in any
        layout the runner knows) must agree."""
        formats = {self.scheme.format_of(f"{prefix}.{e}.{part}") for e in range(experts)
                   for _, parts in MOE_LAYOUTS.values() for part in parts}
        if len(formats) > 1:
            raise ValueError(f"anyfp4: the experts of {prefix} have different formats "
                             f"({', '.join(sorted(f.value for f in formats))}); vLLM runs them as one layer")
        return formats.pop()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if _is_moe(layer):
            from .vllm_experts import AnyFP4ExpertsMethod

            fmt = self.experts_format(prefix, layer.moe_config.num_experts)
            if fmt is WeightFormat.NONE:
                return None  # vLLM's own method for float experts
            return AnyFP4ExpertsMethod(self, fmt, prefix, layer.moe_config)
        if isinstance(layer, LinearBase):
            fmt = self.format_of(prefix)
            if fmt is WeightFormat.NONE:
                return UnquantizedLinearMethod()
            return AnyFP4LinearMethod(self, fmt, prefix)
        return None


class AnyFP4LinearMethod(LinearMethodBase):
    """One vLLM linear layer in NVFP4 or FP8 through ``torch.ops.anyfp4``."""

    def __init__(self, config: AnyFP4Config, fmt: WeightFormat, prefix: str = ""):
        self.config, self.fmt, self.prefix = config, fmt, prefix

    def _names(self) -> dict[str, str]:
        return quantized_suffixes(self.config.scheme.naming, self.fmt)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        loader = extra_weight_attrs.get("weight_loader")
        n, k, parts = sum(output_partition_sizes), input_size_per_partition, len(output_partition_sizes)
        names = self._names()
        layer.anyfp4_partitions = list(output_partition_sizes)
        layer.anyfp4_in_features = k
        layer.anyfp4_names = names

        def nan(*shape):  # unloaded scales stay NaN and are reported after loading
            return torch.full(shape, float("nan"), dtype=torch.float32)

        if self.fmt is WeightFormat.NVFP4:
            if k % 16:
                raise ValueError(f"anyfp4: {self.prefix} has {k} input features per tensor-parallel rank; NVFP4 "
                                 "needs whole 16-element groups (choose a tensor-parallel size that splits K so)")
            layer.register_parameter(names["codes"], ModelWeightParameter(
                data=torch.empty(n, k // 2, dtype=torch.uint8), input_dim=1, output_dim=0, weight_loader=loader))
            layer.register_parameter(names["scale"], ModelWeightParameter(
                data=torch.empty(n, k // 16, dtype=torch.float8_e4m3fn), input_dim=1, output_dim=0,
                weight_loader=loader))
            layer.register_parameter(names["global"], PerTensorScaleParameter(data=nan(parts), weight_loader=loader))
        else:
            layer.register_parameter(names["codes"], ModelWeightParameter(
                data=torch.empty(n, k, dtype=torch.float8_e4m3fn), input_dim=1, output_dim=0, weight_loader=loader))
            if self._per_channel():
                scale = ChannelQuantScaleParameter(data=nan(n, 1), output_dim=0, weight_loader=loader)
            else:
                scale = PerTensorScaleParameter(data=nan(parts), weight_loader=loader)
            layer.register_parameter(names["scale"], scale)
        # activation scales are loaded (when the checkpoint has them) and not used: weight-only
        layer.register_parameter(names["input"], PerTensorScaleParameter(data=nan(parts), weight_loader=loader))
        if names["input"] != "input_scale":  # compressed-tensors twins of ModelOpt exports keep input_scale
            layer.register_parameter("input_scale", PerTensorScaleParameter(data=nan(parts), weight_loader=loader))

    def _per_channel(self) -> bool:
        return self.config.fp8_per_channel

    def process_weights_after_loading(self, layer) -> None:
        from ..formats.fp8 import FP8Weight
        from ..formats.nvfp4 import NVFP4Weight
        from ..kernels.cuda.counters import reserve_counters_for
        from ..packing.fp8 import prepack_fp8
        from ..packing.nvfp4 import prepack_nvfp4

        names, sizes = layer.anyfp4_names, layer.anyfp4_partitions
        weight = getattr(layer, names["codes"]).data
        offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        prepacks = []
        if self.fmt is WeightFormat.NVFP4:
            scales = getattr(layer, names["scale"]).data
            g = getattr(layer, names["global"]).data.float()
            if torch.isnan(g).any() or not bool((g > 0).all()) or not bool(torch.isfinite(g).all()):
                raise ValueError(f"anyfp4: {self.prefix}.{names['global']} is missing or not a positive finite "
                                 f"value per part: {g.tolist()}")
            if names["global"] == "weight_global_scale":  # compressed-tensors stores the reciprocal
                g = 1.0 / g
            start = 0
            for i in range(1, len(sizes) + 1):  # runs of parts sharing one global scale
                if i == len(sizes) or not torch.equal(g[i], g[start]):
                    lo, hi = offsets[start], offsets[i]
                    prepacks.append(prepack_nvfp4(NVFP4Weight(weight[lo:hi].contiguous(),
                                                              scales[lo:hi].contiguous(), g[start].clone())))
                    start = i
        else:
            s = getattr(layer, names["scale"]).data.float()
            if torch.isnan(s).any():
                raise ValueError(f"anyfp4: {self.prefix}.{names['scale']} was not loaded")
            rows = s.reshape(-1) if s.dim() == 2 else torch.cat([s[i].expand(sizes[i]) for i in range(len(sizes))])
            prepacks.append(prepack_fp8(FP8Weight(weight.contiguous(), rows.contiguous())))
        reserve_counters_for(prepacks[0].codes)  # on a GPU: before vLLM captures its CUDA graphs
        for name in [*names.values(), "input_scale"]:  # the prepacks replace the checkpoint tensors
            if hasattr(layer, name):
                delattr(layer, name)
        layer.anyfp4_prepacks = prepacks

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        APPLY_CALLS[self.fmt.value] += 1
        outs = []  # the ops' .default overloads, as nn.linear calls them (no overload resolution per call)
        for p in layer.anyfp4_prepacks:
            if self.fmt is WeightFormat.NVFP4:
                outs.append(torch.ops.anyfp4.nvfp4_linear.default(x, p.codes, p.scales, p.global_scale, None,
                                                                  p.out_features, p.in_features))
            else:
                outs.append(torch.ops.anyfp4.fp8_linear.default(x, p.codes, p.scales, None, p.out_features,
                                                                p.in_features))
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y + bias if bias is not None else y


_REGISTERED = False


def register() -> None:
    """Register the ``anyfp4`` quantization method with vLLM (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    register_weight_loader_v2_supported_method(AnyFP4LinearMethod)
    register_quantization_config(NAME)(AnyFP4Config)
    _REGISTERED = True
