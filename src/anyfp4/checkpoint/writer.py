"""Write a ModelOpt-format NVFP4 / FP8 / mixed checkpoint from a float Hugging Face checkpoint.

Streaming: source tensors are read lazily one fusion group at a time and output shards are
flushed at ``max_shard_bytes``, so host memory stays near one shard plus one group. Where the
checkpoint may go is ``destination``'s decision; it is built beside the destination and swapped
in by ``replace``, so that a failure or a kill never leaves a half-written or a lost checkpoint.

Codes and scales equal NVIDIA ModelOpt 0.47's export (``NVFP4_DEFAULT_CFG`` /
``FP8_DEFAULT_CFG``) for the same weights: NVFP4 projections that run fused (q/k/v and
gate/up) share one global scale; FP8 scales stay per projection, as ModelOpt leaves them.
No activation scales are written: anyfp4 runs these checkpoints weight-only.
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from tqdm import tqdm

from .. import __version__
from ..formats.fp8 import fp8_weight_scale, quantize_fp8
from ..formats.nvfp4 import GROUP_SIZE, quantize_nvfp4, shared_global_scale
from . import replace
from .destination import check_replaceable, resolve_destination
from .errors import CheckpointError
from .quant_config import CONFIG, HF_QUANT_CONFIG, WeightFormat, module_matches, parse_quant_scheme
from .tensor_index import INDEX_FILE, SINGLE_FILE, TensorIndex

# Left unquantized unless asked (as ModelOpt's defaults leave them): the head, the embeddings, a Gated DeltaNet's
# two per-head projections (its decay and write-strength inputs), a mixture of experts' router (Qwen3-MoE's
# ``mlp.gate``, Mixtral's ``block_sparse_moe.gate``), a multi-token-prediction head (``mtp``) and a
# vision-language checkpoint's vision tower (``model.visual``: the runner reads only the text model).
DEFAULT_EXCLUDE = ("lm_head", "*embed_tokens", "*linear_attn.in_proj_a", "*linear_attn.in_proj_b", "*mlp.gate",
                   "*block_sparse_moe.gate", "mtp", "model.visual")
# Sibling projections that read the same input and run as one fused GEMM (NVFP4: one global scale); Mixtral's
# experts name their gate and up projections w1 and w3.
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("in_proj_qkv", "in_proj_z"),
                  ("w1", "w3"))
EXPERT_PARENT = re.compile(r".*\.experts\.\d+")  # the module holding one expert's projections
ATTENTION_PATTERNS = ("*self_attn.*", "*attention.*", "*attn.*")
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".gguf")
SKIPPED_FILES = {CONFIG, HF_QUANT_CONFIG, INDEX_FILE, "pytorch_model.bin.index.json", replace.MARKER}
# The smallest --max-shard-size: below it a model turns into thousands of files, one per tensor.
MIN_SHARD_BYTES = 1024**2


class TargetFormat(enum.Enum):
    NVFP4 = "nvfp4"
    FP8 = "fp8"
    MIXED = "mixed"  # NVFP4 MLP projections, FP8 attention projections


@dataclass(frozen=True)
class QuantizeOptions:
    format: TargetFormat = TargetFormat.NVFP4
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    max_shard_bytes: int = 5 * 1024**3
    force: bool = False
    progress: bool = True

    def __post_init__(self):
        if not isinstance(self.max_shard_bytes, int) or self.max_shard_bytes <= 0:
            raise ValueError(f"max_shard_bytes must be a positive integer, got {self.max_shard_bytes!r}")


def max_shard_bytes(gib: float) -> int:
    """``--max-shard-size`` (GiB) in bytes, refused unless finite and at least ``MIN_SHARD_BYTES``."""
    if not math.isfinite(gib) or gib * 1024**3 < MIN_SHARD_BYTES:
        raise ValueError(f"--max-shard-size must be a finite number of GiB, at least 1/1024 (1 MiB); got {gib:g}")
    return int(gib * 1024**3)


@dataclass
class QuantizeSummary:
    dst: Path
    layer_formats: dict[str, WeightFormat] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)
    bytes_written: int = 0


def layer_format(module: str, fmt: TargetFormat) -> WeightFormat:
    """The format ``fmt`` gives a linear ``module`` that the exclusions leave in (mixed: FP8 attention projections,
    a hybrid's Gated DeltaNet ones among them, NVFP4 the rest)."""
    if fmt is TargetFormat.NVFP4:
        return WeightFormat.NVFP4
    if fmt is TargetFormat.FP8:
        return WeightFormat.FP8
    attention = any(module_matches(module, p) for p in ATTENTION_PATTERNS)
    return WeightFormat.FP8 if attention else WeightFormat.NVFP4


def plan_layers(index: TensorIndex, options: QuantizeOptions) -> dict[str, WeightFormat]:
    """Module -> target format for every 2-D float ``.weight`` that the exclusions leave in."""
    plan = {}
    for name in index.names():
        module, _, suffix = name.rpartition(".")
        info = index[name]
        if suffix != "weight" or len(info.shape) != 2:
            continue
        if any(module_matches(module, p) for p in options.exclude):
            continue
        if info.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise CheckpointError(f"cannot quantize a {info.dtype} weight; the source must be float", file=info.file,
                                  tensor=name)
        fmt = layer_format(module, options.format)
        if fmt is WeightFormat.NVFP4 and info.shape[1] % GROUP_SIZE:
            raise CheckpointError(
                f"in_features {info.shape[1]} is not a multiple of {GROUP_SIZE}, so this layer cannot be NVFP4; "
                f"leave it unquantized with --exclude {module}", file=info.file, tensor=name)
        plan[module] = fmt
    return plan


def _fusion_groups(plan: dict[str, WeightFormat]) -> dict[str, tuple[str, ...]]:
    """Module -> the siblings of its format (itself included) that share its scale: NVFP4 siblings their global
    scale; an expert's FP8 gate and up their per-tensor scale (ModelOpt quantizes an expert's gate and up as one
    fused tensor; a dense MLP's are two modules with a scale each)."""
    groups = {}
    for module, fmt in plan.items():
        parent, _, leaf = module.rpartition(".")
        if fmt is WeightFormat.FP8 and not EXPERT_PARENT.fullmatch(parent):
            continue
        for siblings in FUSED_SIBLINGS:
            if leaf in siblings:
                groups[module] = tuple(f"{parent}.{s}" for s in siblings if plan.get(f"{parent}.{s}") is fmt)
    return {m: g for m, g in groups.items() if plan[m] is WeightFormat.NVFP4 or len(g) > 1}


def _hf_quant_config(options: QuantizeOptions, plan: dict[str, WeightFormat], exclude: list[str]) -> dict:
    quant: dict = {"quant_algo": None, "kv_cache_quant_algo": None}
    if options.format is TargetFormat.MIXED:
        quant["quant_algo"] = "MIXED_PRECISION"
        quant["quantized_layers"] = {
            m: ({"quant_algo": "NVFP4", "group_size": GROUP_SIZE} if f is WeightFormat.NVFP4 else {"quant_algo": "FP8"})
            for m, f in _listed_layers(plan).items()
        }
    elif options.format is TargetFormat.NVFP4:
        quant.update(quant_algo="NVFP4", group_size=GROUP_SIZE)
    else:
        quant["quant_algo"] = "FP8"
    quant["exclude_modules"] = exclude
    return {"producer": {"name": "anyfp4", "version": __version__}, "quantization": quant}


def _listed_layers(plan: dict[str, WeightFormat]) -> dict[str, WeightFormat]:
    """The modules a MIXED_PRECISION config lists, as ModelOpt lists them: a mixture of experts' projections as their
    ``experts`` module when they all have one format (the reader gives modules below a listed one its format)."""
    by_container: dict[str, set] = {}
    for module, fmt in plan.items():
        parent = module.rpartition(".")[0]
        if EXPERT_PARENT.fullmatch(parent):
            by_container.setdefault(parent.rpartition(".")[0], set()).add(fmt)
    listed = {}
    for module, fmt in plan.items():
        container = module.rpartition(".")[0].rpartition(".")[0]
        single = EXPERT_PARENT.fullmatch(module.rpartition(".")[0]) and len(by_container[container]) == 1
        listed[container if single else module] = fmt
    return listed


def _config_quantization(hf_quant: dict) -> dict:
    """``config.json``'s ``quantization_config``: vLLM reads exclusions from ``ignore`` there."""
    quant = hf_quant["quantization"]
    weights_nvfp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP_SIZE}
    weights_fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    if quant["quant_algo"] == "MIXED_PRECISION":
        by_algo: dict[str, list[str]] = {}
        for module, cfg in quant["quantized_layers"].items():
            by_algo.setdefault(cfg["quant_algo"], []).append(module)
        groups = {
            f"group_{i}": {"weights": weights_nvfp4 if algo == "NVFP4" else weights_fp8, "targets": sorted(mods)}
            for i, (algo, mods) in enumerate(by_algo.items())
        }
    else:
        groups = {"group_0": {"weights": weights_nvfp4 if quant["quant_algo"] == "NVFP4" else weights_fp8,
                              "targets": ["Linear"]}}
    out = {"config_groups": groups, "ignore": quant["exclude_modules"], "quant_algo": quant["quant_algo"],
           "producer": hf_quant["producer"], "quant_method": "modelopt"}
    if quant["quant_algo"] == "MIXED_PRECISION":
        out["quantized_layers"] = quant["quantized_layers"]
    return out


def _honour_umask(path: Path) -> None:
    """safetensors writes through a private (0600) temporary file: give the shard the mode any new file gets."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


class _ShardWriter:
    """Collects output tensors and flushes them as safetensors shards of bounded size."""

    def __init__(self, directory: Path, max_bytes: int):
        self.directory, self.max_bytes = directory, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[tuple[str, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + nbytes > self.max_bytes:
            self.flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += nbytes

    def flush(self) -> None:
        if not self.pending:
            return
        file = f"part-{len(self.files):05d}.safetensors"
        try:
            save_file(self.pending, str(self.directory / file), metadata={"format": "pt"})
        except SafetensorError as e:  # safetensors reports a failed write (a full disk) as its own error
            raise OSError(None, str(e).removeprefix("Error while serializing: "), str(self.directory / file)) from None
        _honour_umask(self.directory / file)
        self.files.append((file, list(self.pending)))
        self.total_bytes += self.pending_bytes
        self.pending, self.pending_bytes = {}, 0
        replace.reached("shard-written")

    def finish(self) -> list[str]:
        """Name the shards as Hugging Face does and write the index when there is more than one."""
        self.flush()
        if len(self.files) == 1:
            os.replace(self.directory / self.files[0][0], self.directory / SINGLE_FILE)
            return [SINGLE_FILE]
        total = len(self.files)
        weight_map, names = {}, []
        for i, (file, tensors) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
            os.replace(self.directory / file, self.directory / final)
            weight_map.update({t: final for t in tensors})
            names.append(final)
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        return names


def quantize_checkpoint(src: str | Path, dst: str | Path, options: QuantizeOptions = QuantizeOptions()) -> QuantizeSummary:
    """Quantize the float checkpoint ``src`` into the directory ``dst``.

    ``dst`` must be new, empty, or (with ``options.force``) a checkpoint, which is then replaced as a
    whole. Whatever fails, and whenever the process is killed, ``dst`` holds its old checkpoint or the
    new one, complete; the next call cleans what a killed one left beside it.
    """
    src, shown = Path(src), Path(dst)
    target = resolve_destination(src, shown)
    try:
        replace.recover(target)
        check_replaceable(target, shown, options.force)
        scheme = parse_quant_scheme(src)
        if scheme.producer != "none":
            raise CheckpointError(f"source is already quantized ({scheme.producer} {scheme.algo}); give a float "
                                  f"checkpoint", file=scheme.source)
        index = TensorIndex(src)
        plan = plan_layers(index, options)
        if not plan:
            raise CheckpointError("no linear weights left to quantize after the exclusions", file=src)
        groups = _fusion_groups(plan)
        summary = replace.install(target, lambda work: _write(src, index, plan, groups, work, options))
    except OSError as e:
        raise CheckpointError(f"could not write the checkpoint: {e.strerror or e}",
                              file=_failed_path(e, target, shown)) from None
    summary.dst = shown
    return summary


def _failed_path(error: OSError, target: Path, shown: Path) -> Path:
    """The file an I/O error names, or the destination where it names one of the destination's
    hidden siblings (the user never sees those)."""
    if error.filename is None:
        return shown
    path = Path(os.fsdecode(error.filename))
    if path.is_absolute() and path.is_relative_to(target.parent) and path != target.parent:
        first = path.relative_to(target.parent).parts[0]
        if first == target.name or first.startswith(f".{target.name}."):
            return shown
    return path


def _write(src: Path, index: TensorIndex, plan: dict, groups: dict, work: Path, options: QuantizeOptions):
    shards = _ShardWriter(work, options.max_shard_bytes)
    global_scales: dict[str, torch.Tensor] = {}  # NVFP4 global scales shared by fused siblings
    fp8_scales: dict[str, torch.Tensor] = {}  # FP8 scales shared by an expert's gate and up
    names = index.names()
    with tqdm(total=sum(index[n].nbytes for n in names), unit="B", unit_scale=True, desc="quantizing",
              disable=not options.progress) as bar:
        for name in names:
            module, _, suffix = name.rpartition(".")
            fmt = plan.get(module) if suffix == "weight" else None
            weight = _load_linear(index, name) if fmt is not None else index.load(name)
            if fmt is WeightFormat.NVFP4:
                if module not in global_scales:
                    members = groups.get(module, (module,))
                    scale = shared_global_scale([_load_linear(index, f"{m}.weight") for m in members])
                    global_scales.update({m: scale for m in members})
                q = quantize_nvfp4(weight, global_scales[module])
                shards.add(f"{module}.weight", q.packed)
                shards.add(f"{module}.weight_scale", q.block_scale)
                shards.add(f"{module}.weight_scale_2", q.global_scale.clone())  # shared within a group
            elif fmt is WeightFormat.FP8:
                members = groups.get(module, (module,))
                if len(members) > 1 and module not in fp8_scales:  # read the group once, for its first member
                    scale = fp8_weight_scale(torch.cat([_load_linear(index, f"{m}.weight") for m in members]))
                    fp8_scales.update({m: scale for m in members})
                q = quantize_fp8(weight, fp8_scales.get(module))
                shards.add(f"{module}.weight", q.weight)
                shards.add(f"{module}.weight_scale", q.scale.clone())  # may be shared within a group
            else:
                shards.add(name, weight)
            bar.update(index[name].nbytes)
    files = shards.finish()
    exclude = _exclude_list(index, plan, options)
    hf_quant = _hf_quant_config(options, plan, exclude)
    (work / HF_QUANT_CONFIG).write_text(json.dumps(hf_quant, indent=4) + "\n")
    config = json.loads((src / CONFIG).read_text())
    config["quantization_config"] = _config_quantization(hf_quant)
    (work / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    _copy_side_files(src, work)
    return QuantizeSummary(work, dict(plan), files, shards.total_bytes)


def _load_linear(index: TensorIndex, name: str) -> torch.Tensor:
    """A weight to quantize, refused if it holds NaN or Inf (no scale can represent those)."""
    weight = index.load(name)
    bad = int((~torch.isfinite(weight)).sum())
    if bad:
        module = name.rpartition(".")[0]
        raise CheckpointError(f"{bad} weight value(s) are NaN or Inf, which cannot be quantized; fix the source or "
                              f"leave the layer unquantized with --exclude {module}", file=index[name].file,
                              tensor=name)
    return weight


def _exclude_list(index: TensorIndex, plan: dict, options: QuantizeOptions) -> list[str]:
    """Module names left unquantized, written out (``lm_head`` always listed, as ModelOpt does): every module with a
    weight of two dimensions or more (a Gated DeltaNet's convolution too) that the plan leaves out."""
    left = []
    for name in index.names():
        module, _, suffix = name.rpartition(".")
        if suffix == "weight" and len(index[name].shape) >= 2 and module not in plan and module not in left:
            left.append(module)
    return ["lm_head"] + sorted(m for m in left if m != "lm_head")


def _copy_side_files(src: Path, dst: Path) -> None:
    """Tokenizer, chat template, generation config: every top-level file that is not weights or configs."""
    for path in src.iterdir():
        if path.is_file() and path.name not in SKIPPED_FILES and not path.name.endswith(WEIGHT_FILE_SUFFIXES):
            shutil.copy2(path, dst / path.name)
