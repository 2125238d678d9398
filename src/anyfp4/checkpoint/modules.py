"""Per-layer description of a checkpoint: each linear's format, shape and tensor names, validated.

``describe_layers(scheme, index)`` joins the quantization scheme with the tensors that are
actually stored and checks every linear structurally (dtype and shape of each tensor).
Scale *values* are checked when they are loaded (``reader.CheckpointReader``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import torch

from ..formats.nvfp4 import GROUP_SIZE
from .errors import CheckpointError
from .quant_config import QuantScheme, TensorNaming, WeightFormat
from .tensor_index import TensorIndex

# Role -> tensor-name suffix, per naming convention.
NVFP4_NAMES = {
    TensorNaming.MODELOPT: {"codes": "weight", "block_scale": "weight_scale", "global_scale": "weight_scale_2",
                            "input_scale": "input_scale"},
    TensorNaming.COMPRESSED_TENSORS: {"codes": "weight_packed", "block_scale": "weight_scale",
                                      "global_scale": "weight_global_scale", "input_scale": "input_global_scale"},
}
FP8_NAMES = {"weight": "weight", "scale": "weight_scale", "input_scale": "input_scale"}


def quantized_suffixes(naming: TensorNaming, fmt: WeightFormat) -> dict[str, str]:
    """A quantized linear's tensor suffixes under one naming, by role: ``codes`` (the weight), ``scale`` (NVFP4 block
    scales, FP8 scales), ``global`` (NVFP4 global scale; FP8: ``weight_scale_2``, never stored) and ``input`` (the
    activation scale) — what the vLLM integration's parameters are named."""
    if fmt is WeightFormat.NVFP4:
        n = NVFP4_NAMES[naming]
        return {"codes": n["codes"], "scale": n["block_scale"], "global": n["global_scale"], "input": n["input_scale"]}
    return {"codes": FP8_NAMES["weight"], "scale": FP8_NAMES["scale"],
            "global": NVFP4_NAMES[TensorNaming.MODELOPT]["global_scale"], "input": FP8_NAMES["input_scale"]}
DENSE_NAMES = {"weight": "weight"}
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Tensors a linear module may carry that anyfp4 reads but does not need (KV-cache scales, ...).
IGNORED_SUFFIXES = ("k_scale", "v_scale", "input_scale", "input_global_scale")


@dataclass(frozen=True)
class LayerSpec:
    """One linear: ``y = x @ W.T (+ bias)`` with W of shape (out_features, in_features)."""

    name: str
    format: WeightFormat
    out_features: int
    in_features: int
    tensors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # role -> tensor name
    global_scale_is_reciprocal: bool = False  # compressed-tensors stores 1 / global scale

    @property
    def has_bias(self) -> bool:
        return "bias" in self.tensors

    @property
    def weight_bytes(self) -> int:
        """Bytes of weight data read per use (codes + block scales; the scalar scale is ignored)."""
        n, k = self.out_features, self.in_features
        if self.format is WeightFormat.NVFP4:
            return n * k // 2 + n * k // GROUP_SIZE
        if self.format is WeightFormat.FP8:
            return n * k
        return n * k * 2  # as bf16/fp16 at run time


def _module_of(name: str) -> tuple[str, str]:
    module, _, suffix = name.rpartition(".")
    return module, suffix


def _expect(index: TensorIndex, name: str, dtypes: tuple, shape: tuple | None, what: str) -> None:
    if name not in index:
        module, _ = _module_of(name)
        raise CheckpointError(f"missing {what} of quantized layer {module}", file=index.root, tensor=name)
    info = index[name]
    if info.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise CheckpointError(f"{what} must be {want}, found {info.dtype}", file=info.file, tensor=name)
    if shape is not None and info.shape not in shape:
        want = " or ".join(str(list(s)) for s in shape)
        raise CheckpointError(f"{what} must have shape {want}, found {list(info.shape)}", file=info.file, tensor=name)


def _describe_nvfp4(module: str, scheme: QuantScheme, index: TensorIndex) -> LayerSpec:
    names = {role: f"{module}.{suffix}" for role, suffix in NVFP4_NAMES[scheme.naming].items()}
    codes = names["codes"]
    _expect(index, codes, (torch.uint8,), None, "packed E2M1 codes")
    info = index[codes]
    if len(info.shape) != 2:
        raise CheckpointError(f"packed E2M1 codes must be 2-D [N, K/2], found {list(info.shape)}",
                              file=info.file, tensor=codes)
    n, k = info.shape[0], info.shape[1] * 2
    if k % GROUP_SIZE:
        raise CheckpointError(f"NVFP4 in_features K = {k} is not a multiple of {GROUP_SIZE}", file=info.file,
                              tensor=codes)
    _expect(index, names["block_scale"], (torch.float8_e4m3fn,), ((n, k // GROUP_SIZE),), "E4M3 block scales")
    _expect(index, names["global_scale"], (torch.float32,), ((), (1,)), "global scale")
    tensors = {r: names[r] for r in ("codes", "block_scale", "global_scale")}
    _add_bias(module, n, index, tensors)
    return LayerSpec(module, WeightFormat.NVFP4, n, k, MappingProxyType(tensors),
                     global_scale_is_reciprocal=scheme.naming is TensorNaming.COMPRESSED_TENSORS)


def _describe_fp8(module: str, index: TensorIndex) -> LayerSpec:
    weight, scale = f"{module}.weight", f"{module}.weight_scale"
    _expect(index, weight, (torch.float8_e4m3fn,), None, "FP8 weight")
    info = index[weight]
    if len(info.shape) != 2:
        raise CheckpointError(f"FP8 weight must be 2-D, found {list(info.shape)}", file=info.file, tensor=weight)
    n, k = info.shape
    _expect(index, scale, (torch.float32,), ((), (1,), (n,), (n, 1)), "FP8 weight scale")
    tensors = {"weight": weight, "scale": scale}
    if f"{module}.input_scale" in index:  # W8A8 checkpoints: the static activation scale
        _expect(index, f"{module}.input_scale", (torch.float32,), ((), (1,)), "FP8 input scale")
        tensors["input_scale"] = f"{module}.input_scale"
    _add_bias(module, n, index, tensors)
    return LayerSpec(module, WeightFormat.FP8, n, k, MappingProxyType(tensors))


def _describe_dense(module: str, index: TensorIndex) -> LayerSpec:
    weight = f"{module}.weight"
    info = index[weight]
    if info.dtype not in FLOAT_DTYPES:
        raise CheckpointError(
            f"layer {module} is unquantized by the config but its weight is {info.dtype}; "
            "is the config's exclude/ignore list or quantized_layers out of step with the weights?",
            file=info.file, tensor=weight)
    n, k = info.shape
    tensors = {"weight": weight}
    _add_bias(module, n, index, tensors)
    return LayerSpec(module, WeightFormat.NONE, n, k, MappingProxyType(tensors))


def _add_bias(module: str, n: int, index: TensorIndex, tensors: dict) -> None:
    bias = f"{module}.bias"
    if bias in index:
        _expect(index, bias, FLOAT_DTYPES, ((n,),), "bias")
        tensors["bias"] = bias


def linear_modules(scheme: QuantScheme, index: TensorIndex) -> list[str]:
    """Modules that store a 2-D weight (plain, packed or FP8): the linears and the embeddings."""
    weight_suffixes = {"weight", NVFP4_NAMES[scheme.naming]["codes"]}
    modules = []
    for name in index.names():
        module, suffix = _module_of(name)
        if suffix in weight_suffixes and len(index[name].shape) == 2 and module not in modules:
            modules.append(module)
    return modules


def listed_but_unstored(scheme: QuantScheme, index: TensorIndex) -> str | None:
    """A one-line note when a MIXED_PRECISION config's ``quantized_layers`` names modules with no stored weights at
    or below them (an entry for a mixture's ``experts`` covers the experts' projections stored below it; ModelOpt
    lists modules of the quantized model that its export leaves out). Harmless: a stored module is checked against
    its entry, and a module the runner needs but that is not stored is refused by name."""
    if not scheme.is_mixed:
        return None
    covered = {scheme.listed_as(m) for m in linear_modules(scheme, index)}
    missing = [m for m in scheme.layer_formats if m not in covered]
    if not missing:
        return None
    return (f"{Path(scheme.source).name}: quantized_layers lists {len(missing)} module(s) whose weights are not "
            f"stored, e.g. {', '.join(missing[:3])}; ignored")


def describe_layers(scheme: QuantScheme, index: TensorIndex) -> list[LayerSpec]:
    """Every 2-D weight of the checkpoint, as a validated ``LayerSpec``, in storage order."""
    modules = linear_modules(scheme, index)
    layers = []
    for module in modules:
        fmt = scheme.format_of(module)
        if fmt is WeightFormat.NVFP4:
            layers.append(_describe_nvfp4(module, scheme, index))
        elif fmt is WeightFormat.FP8:
            layers.append(_describe_fp8(module, index))
        else:
            layers.append(_describe_dense(module, index))
    return layers
