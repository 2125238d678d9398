"""Open a checkpoint directory: config + tensors -> validated layers, loaded one at a time.

    reader = CheckpointReader("path/to/ckpt")
    for layer in reader.layers:            # LayerSpec: name, format, shape, tensor names
        w = reader.load_nvfp4(layer)       # NVFP4Weight in ModelOpt convention, scales checked

Every tensor is read lazily; scale values are validated as they are loaded (finite,
non-negative block scales, finite positive global / per-tensor scales).
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import torch

from ..formats.fp8 import E4M3_NAN_MASK, FP8Weight
from ..formats.nvfp4 import NVFP4Weight
from .errors import CheckpointError
from .layers import LayerSpec, describe_layers
from .quant_config import CONFIG, QuantScheme, WeightFormat, parse_quant_scheme
from .tensor_index import TensorIndex


class CheckpointReader:
    def __init__(self, checkpoint_dir: str | Path):
        self.root = Path(checkpoint_dir)
        self.scheme: QuantScheme = parse_quant_scheme(self.root)
        self.index = TensorIndex(self.root)
        self.layers: list[LayerSpec] = describe_layers(self.scheme, self.index)
        self.layer_by_name = {layer.name: layer for layer in self.layers}

    @cached_property
    def config(self) -> dict:
        path = self.root / CONFIG
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"cannot read the model config: {e}", file=path) from None

    def load(self, name: str) -> torch.Tensor:
        return self.index.load(name)

    def _check_positive_scalar(self, name: str, value: torch.Tensor, what: str) -> None:
        bad = ~torch.isfinite(value) | (value <= 0)
        if bad.any():
            first = value.flatten()[bad.flatten()][0].item()
            raise CheckpointError(f"{what} must be finite and positive, found {first:.6g}",
                                  file=self.index[name].file, tensor=name)

    def _check_no_nan(self, name: str, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """E4M3 data as bytes, refused when any byte is NaN (s.1111.111)."""
        raw = tensor.view(torch.uint8)
        nan = (raw & E4M3_NAN_MASK) == E4M3_NAN_MASK
        if nan.any():
            raise CheckpointError(f"{int(nan.sum())} {what} are NaN", file=self.index[name].file, tensor=name)
        return raw

    def load_nvfp4(self, layer: LayerSpec) -> NVFP4Weight:
        """Codes, block scales and the global scale in ModelOpt convention (multiply)."""
        t = layer.tensors
        packed = self.load(t["codes"])
        block_scale = self.load(t["block_scale"])
        raw = self._check_no_nan(t["block_scale"], block_scale, "block scale(s)")
        negative = (raw >= 0x80) & (raw != 0x80)
        if negative.any():
            raise CheckpointError(f"{int(negative.sum())} block scale(s) are negative",
                                  file=self.index[t["block_scale"]].file, tensor=t["block_scale"])
        global_scale = self.load(t["global_scale"]).reshape(())
        self._check_positive_scalar(t["global_scale"], global_scale, "NVFP4 global scale")
        if layer.global_scale_is_reciprocal:
            # compressed-tensors stores 2688 / amax; ModelOpt (and anyfp4's kernels) multiply by amax / 2688.
            global_scale = (1.0 / global_scale.double()).float()
        return NVFP4Weight(packed, block_scale, global_scale.float())

    def load_fp8(self, layer: LayerSpec) -> FP8Weight:
        """FP8 weight with its scale as () per tensor or (N,) per channel."""
        t = layer.tensors
        weight = self.load(t["weight"])
        self._check_no_nan(t["weight"], weight, "FP8 weight value(s)")
        scale = self.load(t["scale"])
        self._check_positive_scalar(t["scale"], scale, "FP8 weight scale")
        scale = scale.reshape(-1) if scale.numel() == layer.out_features and scale.numel() > 1 else scale.reshape(())
        input_scale = None
        if "input_scale" in t:
            input_scale = self.load(t["input_scale"]).reshape(())
            self._check_positive_scalar(t["input_scale"], input_scale, "FP8 input scale")
        return FP8Weight(weight, scale.float(), input_scale.float() if input_scale is not None else None)

    def load_dense(self, layer: LayerSpec) -> torch.Tensor:
        weight = self.load(layer.tensors["weight"])
        if not torch.isfinite(weight).all():
            raise CheckpointError("weight holds NaN or Inf", file=self.index[layer.tensors["weight"]].file,
                                  tensor=layer.tensors["weight"])
        return weight

    def load_bias(self, layer: LayerSpec) -> torch.Tensor | None:
        return self.load(layer.tensors["bias"]) if layer.has_bias else None

    def dequantize(self, layer: LayerSpec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The layer's weight as a dense (N, K) tensor through the formats/ reference."""
        from ..formats.fp8 import dequantize_fp8
        from ..formats.nvfp4 import dequantize_nvfp4

        if layer.format is WeightFormat.NVFP4:
            return dequantize_nvfp4(self.load_nvfp4(layer), dtype)
        if layer.format is WeightFormat.FP8:
            return dequantize_fp8(self.load_fp8(layer), dtype)
        return self.load_dense(layer).to(dtype)

    def validate_values(self, progress: bool = False) -> None:
        """Load every quantized layer's scales (and FP8 weights) once, raising on the first bad value."""
        from tqdm import tqdm

        for layer in tqdm(self.layers, desc="validating", disable=not progress, unit="layer"):
            if layer.format is WeightFormat.NVFP4:
                self.load_nvfp4(layer)
            elif layer.format is WeightFormat.FP8:
                self.load_fp8(layer)
