"""Open a checkpoint directory: config + tensors -> validated layers, loaded one at a time.

    reader = CheckpointReader("path/to/ckpt")
    for layer in reader.layers:            # LayerSpec: name, format, shape, tensor names
        w = reader.load_nvfp4(layer)       # NVFP4Weight in ModelOpt convention, scales checked

Every tensor is read lazily and its values are checked as it is loaded (``values.py`` has the
ranges): non-negative, non-NaN block scales, global / per-tensor scales within the range a bf16/fp16
weight implies, finite float tensors within the fp16 range. ``validate_values`` runs the same loads.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import torch

from ..formats.fp8 import E4M3_NAN_MASK, FP8Weight
from ..formats.nvfp4 import NVFP4Weight
from .errors import CheckpointError
from .files import check_entries, read_json_object
from .modules import LayerSpec, describe_layers, linear_modules, listed_but_unstored
from .quant_config import CONFIG, QuantScheme, WeightFormat, check_schemes_agree, quant_schemes
from .tensor_index import TensorIndex
from .values import (FP8_SCALE_RANGE, NVFP4_RECIPROCAL_SCALE_RANGE, NVFP4_SCALE_RANGE, check_float_values,
                     check_scale_range)


class CheckpointReader:
    def __init__(self, checkpoint_dir: str | Path):
        self.root = Path(checkpoint_dir)
        if not self.root.is_dir():
            raise CheckpointError("checkpoint directory does not exist", file=self.root)
        check_entries(self.root)
        schemes = quant_schemes(self.root)
        self.scheme: QuantScheme = schemes[0]
        self.index = TensorIndex(self.root)
        check_schemes_agree(schemes, linear_modules(self.scheme, self.index))
        self.layers: list[LayerSpec] = describe_layers(self.scheme, self.index)
        note = listed_but_unstored(self.scheme, self.index)
        self.notes: tuple[str, ...] = (note,) if note else ()  # one line each: what was tolerated
        self.layer_by_name = {layer.name: layer for layer in self.layers}

    @cached_property
    def config(self) -> dict:
        return read_json_object(self.root / CONFIG)

    @property
    def config_file(self) -> Path:
        return self.root / CONFIG

    def load(self, name: str) -> torch.Tensor:
        """The tensor as stored, unchecked."""
        return self.index.load(name)

    def load_float(self, name: str, what: str = "tensor") -> torch.Tensor:
        """A float tensor (weight, embedding, norm, bias), refused unless finite and within the fp16 range."""
        tensor = self.load(name)
        check_float_values(tensor, what, self.index[name].file, name)
        return tensor

    def _check_scale(self, name: str, value: torch.Tensor, bounds: tuple[float, float], what: str) -> None:
        check_scale_range(value, bounds, what, self.index[name].file, name)

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
        bounds = NVFP4_RECIPROCAL_SCALE_RANGE if layer.global_scale_is_reciprocal else NVFP4_SCALE_RANGE
        self._check_scale(t["global_scale"], global_scale, bounds, "NVFP4 global scale")
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
        self._check_scale(t["scale"], scale, FP8_SCALE_RANGE, "FP8 weight scale")
        scale = scale.reshape(-1) if scale.numel() == layer.out_features and scale.numel() > 1 else scale.reshape(())
        input_scale = None
        if "input_scale" in t:
            input_scale = self.load(t["input_scale"]).reshape(())
            self._check_scale(t["input_scale"], input_scale, FP8_SCALE_RANGE, "FP8 input scale")
        return FP8Weight(weight, scale.float(), input_scale.float() if input_scale is not None else None)

    def load_dense(self, layer: LayerSpec) -> torch.Tensor:
        return self.load_float(layer.tensors["weight"], "weight")

    def load_bias(self, layer: LayerSpec) -> torch.Tensor | None:
        return self.load_float(layer.tensors["bias"], "bias") if layer.has_bias else None

    def load_layer(self, layer: LayerSpec, with_bias: bool = True):
        """(weight, bias) as the runner builds its linear from them, every value checked."""
        if layer.format is WeightFormat.NVFP4:
            weight = self.load_nvfp4(layer)
        elif layer.format is WeightFormat.FP8:
            weight = self.load_fp8(layer)
        else:
            weight = self.load_dense(layer)
        return weight, self.load_bias(layer) if with_bias else None

    def dequantize(self, layer: LayerSpec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The layer's weight as a dense (N, K) tensor through the formats/ reference."""
        from ..formats.fp8 import dequantize_fp8
        from ..formats.nvfp4 import dequantize_nvfp4

        if layer.format is WeightFormat.NVFP4:
            return dequantize_nvfp4(self.load_nvfp4(layer), dtype)
        if layer.format is WeightFormat.FP8:
            return dequantize_fp8(self.load_fp8(layer), dtype)
        return self.load_dense(layer).to(dtype)

    def validate_values(self, layers: list[LayerSpec] | None = None, tensors: tuple[str, ...] = (),
                        progress: bool = False) -> None:
        """Load ``layers`` (default: all) and the other float ``tensors`` once, through the same checked
        loads the model builder uses, raising on the first bad value."""
        from tqdm import tqdm

        layers = self.layers if layers is None else layers
        # counted in layers without a rate: unquantized layers cost nothing here, so a rate would mean nothing
        for layer in tqdm(layers, desc="validating", disable=not progress, unit="layer",
                          bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} layers [{elapsed}]"):
            self.load_layer(layer)
        for name in tensors:
            self.load_float(name)
