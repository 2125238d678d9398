"""Quantization configs -> one ``QuantScheme``: which module is NVFP4, FP8 or left unquantized.

Understood configs:

- ModelOpt ``hf_quant_config.json`` (``{"producer", "quantization": {"quant_algo", "exclude_modules", ...}}``)
  or ``config.json``'s ``quantization_config`` with ``quant_method: "modelopt"`` (exclusions in ``ignore``).
  ``quant_algo``: ``NVFP4`` (run weight-only), ``W4A16_NVFP4``, ``FP8`` and ``MIXED_PRECISION``
  (``quantized_layers``: module name -> its own ``quant_algo``; unlisted modules are unquantized).
- compressed-tensors (llm-compressor) ``config.json`` ``quantization_config`` with
  ``format: "nvfp4-pack-quantized"`` (NVFP4A16 / NVFP4 presets) or ``"float-quantized"``
  (FP8 weights, per tensor or per channel); exclusions in ``ignore`` (``re:`` regexes allowed).
- No quantization config at all: a plain float checkpoint (every module unquantized).

When both ``hf_quant_config.json`` and ``config.json``'s ``quantization_config`` are present they must
agree on every stored module's format (``check_schemes_agree``); exclusion regexes are compiled when read.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from .errors import CheckpointError
from .files import read_json_object, regular_file

HF_QUANT_CONFIG = "hf_quant_config.json"
CONFIG = "config.json"


class WeightFormat(enum.Enum):
    NVFP4 = "nvfp4"
    FP8 = "fp8"
    NONE = "none"


class TensorNaming(enum.Enum):
    """How a producer names an NVFP4 layer's tensors."""

    MODELOPT = "modelopt"  # weight, weight_scale, weight_scale_2 (multiply), input_scale
    COMPRESSED_TENSORS = "compressed-tensors"  # weight_packed, weight_scale, weight_global_scale (divide)


_MODELOPT_ALGOS = {
    "NVFP4": WeightFormat.NVFP4,
    "W4A16_NVFP4": WeightFormat.NVFP4,
    "FP8": WeightFormat.FP8,
}
SUPPORTED_ALGOS = tuple(_MODELOPT_ALGOS) + ("MIXED_PRECISION",)


def module_matches(name: str, pattern: str) -> bool:
    """Exclusion-list matching as ModelOpt and compressed-tensors write it.

    ``re:<regex>`` is a full regex match; a pattern with ``*``/``?`` is a glob; a plain name
    matches that module and everything below it (``model.layers.0`` covers its projections).
    """
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern or name.startswith(pattern + ".")


@dataclass(frozen=True)
class QuantScheme:
    """Where each module's format comes from. ``format_of(module)`` is the only question it answers."""

    producer: str  # "modelopt", "compressed-tensors" or "none"
    algo: str  # quant_algo as written ("NVFP4", "FP8", "MIXED_PRECISION", ...), or the CT format
    naming: TensorNaming = TensorNaming.MODELOPT
    default_format: WeightFormat = WeightFormat.NONE
    exclude: tuple[str, ...] = ()
    layer_formats: Mapping[str, WeightFormat] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""  # the file the scheme was read from

    @property
    def is_mixed(self) -> bool:
        return self.algo == "MIXED_PRECISION"

    def format_of(self, module: str) -> WeightFormat:
        if self.is_mixed:  # the module's own entry, else its nearest listed ancestor's (ModelOpt lists a mixture
            return self.layer_formats.get(self.listed_as(module) or module, WeightFormat.NONE)  # of experts whole)
        if any(module_matches(module, p) for p in self.exclude):
            return WeightFormat.NONE
        return self.default_format

    def listed_as(self, module: str) -> str | None:
        """The ``quantized_layers`` entry that gives ``module`` its format: its own, or its nearest ancestor's."""
        name = module
        while name:
            if name in self.layer_formats:
                return name
            name = name.rpartition(".")[0]
        return None

    def __reduce__(self):
        """Pickled with its layer formats as a plain dict (a mapping proxy does not pickle): vLLM sends the
        quantization config that holds the scheme to its engine process."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["layer_formats"] = dict(self.layer_formats)
        return _unpickle_scheme, (values,)


def _unpickle_scheme(values: dict) -> QuantScheme:
    return QuantScheme(**{**values, "layer_formats": MappingProxyType(values["layer_formats"])})


def _modelopt_format(algo: object, where: str, source: Path) -> WeightFormat:
    if not isinstance(algo, str) or algo not in _MODELOPT_ALGOS:
        raise CheckpointError(
            f"unsupported ModelOpt quant_algo {algo!r} at {where}; anyfp4 runs {', '.join(SUPPORTED_ALGOS)}",
            file=source,
        )
    return _MODELOPT_ALGOS[algo]


def _patterns(value: object, key: str, source: Path) -> tuple[str, ...]:
    """An exclusion list: strings, ``re:`` entries compiled now so a bad regex is named here."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise CheckpointError(f"{key!r} must be a list of module names or patterns, found {value!r}", file=source)
    for pattern in value:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as e:
                raise CheckpointError(f"{key!r} entry {pattern!r} is not a valid regular expression: {e}",
                                      file=source) from None
    return tuple(value)


def _object(value: object, key: str, source: Path) -> dict:
    if not isinstance(value, dict):
        raise CheckpointError(f"{key!r} must be a JSON object, found {value!r}", file=source)
    return value


def _parse_modelopt(quant: dict, source: Path, exclude_key: str) -> QuantScheme:
    algo = quant.get("quant_algo")
    group_size = quant.get("group_size", 16)
    if group_size not in (None, 16) or isinstance(group_size, bool):
        raise CheckpointError(f"NVFP4 group_size must be 16, got {group_size!r}", file=source)
    exclude = _patterns(quant.get(exclude_key), exclude_key, source)
    if algo == "MIXED_PRECISION":
        layers = quant.get("quantized_layers")
        if not isinstance(layers, dict) or not layers:
            raise CheckpointError("MIXED_PRECISION config has no 'quantized_layers' mapping", file=source)
        formats = {}
        for module, cfg in layers.items():
            if not isinstance(cfg, dict):
                raise CheckpointError(f"quantized_layers[{module!r}] must be a dict, got {cfg!r}", file=source)
            formats[module] = _modelopt_format(cfg.get("quant_algo"), f"quantized_layers[{module!r}]", source)
            if cfg.get("group_size", 16) != 16 or isinstance(cfg.get("group_size"), bool):
                raise CheckpointError(f"quantized_layers[{module!r}] group_size must be 16", file=source)
        return QuantScheme("modelopt", algo, exclude=exclude, layer_formats=MappingProxyType(formats), source=str(source))
    return QuantScheme("modelopt", str(algo), default_format=_modelopt_format(algo, "quant_algo", source),
                       exclude=exclude, source=str(source))


def _parse_compressed_tensors(qc: dict, source: Path) -> QuantScheme:
    fmt = qc.get("format")
    groups = _object(qc.get("config_groups") or {}, "config_groups", source)
    weights = [_object(_object(g, f"config_groups.{k}", source).get("weights") or {}, f"config_groups.{k}.weights",
                       source) for k, g in groups.items()]
    exclude = _patterns(qc.get("ignore"), "ignore", source)
    if fmt == "nvfp4-pack-quantized":
        for w in weights:
            if (w.get("num_bits"), w.get("type"), w.get("group_size")) != (4, "float", 16):
                raise CheckpointError(f"nvfp4-pack-quantized group has unexpected weights spec {w}", file=source)
        return QuantScheme("compressed-tensors", fmt, naming=TensorNaming.COMPRESSED_TENSORS,
                           default_format=WeightFormat.NVFP4, exclude=exclude, source=str(source))
    if fmt == "float-quantized":
        for w in weights:
            if (w.get("num_bits"), w.get("type")) != (8, "float") or w.get("strategy") not in ("tensor", "channel"):
                raise CheckpointError(f"float-quantized group has unsupported weights spec {w}", file=source)
        return QuantScheme("compressed-tensors", fmt, default_format=WeightFormat.FP8, exclude=exclude,
                           source=str(source))
    raise CheckpointError(
        f"unsupported compressed-tensors format {fmt!r}; anyfp4 reads 'nvfp4-pack-quantized' and 'float-quantized'",
        file=source,
    )


def scheme_from_config(config: dict, source: str | Path = "quantization_config") -> QuantScheme:
    """A quantization description given as a dict: ModelOpt's ``hf_quant_config.json`` content, or a
    ``config.json`` ``quantization_config`` (ModelOpt or compressed-tensors). ``source`` names it in errors."""
    source = Path(source)
    _object(config, "quantization_config", source)
    if isinstance(config.get("quantization"), dict):  # hf_quant_config.json
        return _parse_modelopt(config["quantization"], source, "exclude_modules")
    method = config.get("quant_method")
    if method == "modelopt":
        return _parse_modelopt(config, source, "ignore" if "ignore" in config else "exclude_modules")
    if method == "compressed-tensors":
        return _parse_compressed_tensors(config, source)
    raise CheckpointError(
        f"unsupported quant_method {method!r}; anyfp4 reads 'modelopt' and 'compressed-tensors' checkpoints",
        file=source,
    )


def quant_schemes(checkpoint_dir: str | Path) -> list[QuantScheme]:
    """Every quantization description of a Hugging Face checkpoint directory, the one that wins first:
    ``hf_quant_config.json`` (ModelOpt's own file), then ``config.json``'s ``quantization_config``;
    a plain float scheme when there is neither."""
    root = Path(checkpoint_dir)
    schemes = []
    hf_quant = root / HF_QUANT_CONFIG
    if regular_file(hf_quant):
        quant = read_json_object(hf_quant).get("quantization")
        if not isinstance(quant, dict):
            raise CheckpointError("missing the 'quantization' object", file=hf_quant)
        schemes.append(_parse_modelopt(quant, hf_quant, "exclude_modules"))
    config = root / CONFIG
    if not regular_file(config):
        raise CheckpointError("not a Hugging Face checkpoint: no config.json", file=root)
    qc = read_json_object(config).get("quantization_config")
    if qc is not None:
        schemes.append(scheme_from_config(qc, config))
    return schemes or [QuantScheme("none", "NONE", source=str(config))]


def parse_quant_scheme(checkpoint_dir: str | Path) -> QuantScheme:
    """The quantization description that wins (see ``quant_schemes``)."""
    return quant_schemes(checkpoint_dir)[0]


def _format_name(scheme: QuantScheme, fmt: WeightFormat) -> str:
    if fmt is WeightFormat.NVFP4:
        return f"NVFP4 ({scheme.naming.value} tensors)"
    return "unquantized" if fmt is WeightFormat.NONE else fmt.name


def check_schemes_agree(schemes: list[QuantScheme], modules: list[str]) -> None:
    """Two quantization configs in one checkpoint must give every stored module the same format (and
    NVFP4 tensor naming): otherwise which one a runner reads decides the numbers."""
    first, *others = schemes
    for other in others:
        for module in modules:
            a, b = first.format_of(module), other.format_of(module)
            if a is not b or (a is WeightFormat.NVFP4 and first.naming is not other.naming):
                raise CheckpointError(
                    f"the quantization configs disagree: {Path(first.source).name} makes {module} "
                    f"{_format_name(first, a)}, {Path(other.source).name}'s quantization_config makes it "
                    f"{_format_name(other, b)}", file=other.source)
