"""anyfp4's writer produces the same bytes as NVIDIA ModelOpt 0.47's export for the same weights, except for
a linear whose whole scale group is zero, which ModelOpt exports as NaN and anyfp4 as exact zeros.

ModelOpt runs in a subprocess (it patches transformers classes on import). Needs the
``interop`` extra; the SmolLM2 case also needs the ``demo`` extra.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from anyfp4.checkpoint.errors import CheckpointError
from anyfp4.checkpoint.reader import CheckpointReader
from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from helpers import MOE_CLASSES, tiny_moe_config, tiny_qwen3_5_config

pytest.importorskip("modelopt", reason="nvidia-modelopt (the 'interop' extra) is not installed")
EXPORT_SCRIPT = Path(__file__).with_name("modelopt_export.py")
FORMATS = ["nvfp4", "fp8", "mixed"]


def modelopt_export(src: Path, dst: Path, fmt: str) -> Path:
    proc = subprocess.run([sys.executable, str(EXPORT_SCRIPT), str(src), str(dst), fmt], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dst


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def assert_same_tensors(ours: Path, theirs: Path) -> int:
    with safe_open(str(ours / "model.safetensors"), "pt") as a, safe_open(str(theirs / "model.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for name in a.keys():
            ta, tb = a.get_tensor(name), b.get_tensor(name)
            assert ta.dtype == tb.dtype and ta.shape == tb.shape, name
            assert torch.equal(raw(ta), raw(tb)), f"{name} differs from ModelOpt's export"
        return len(list(a.keys()))


def assert_same_description(ours: Path, theirs: Path) -> None:
    a, b = CheckpointReader(ours), CheckpointReader(theirs)
    assert [(l.name, l.format, l.out_features, l.in_features) for l in a.layers] == \
           [(l.name, l.format, l.out_features, l.in_features) for l in b.layers]
    qa = json.loads((ours / "hf_quant_config.json").read_text())["quantization"]
    qb = json.loads((theirs / "hf_quant_config.json").read_text())["quantization"]
    assert qa["quant_algo"] == qb["quant_algo"]
    assert qa.get("quantized_layers") == qb.get("quantized_layers")
    if "exclude_modules" in qb:
        assert qa["exclude_modules"] == qb["exclude_modules"]


@pytest.fixture(scope="module")
def random_llama(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, tie_word_embeddings=False,
                         architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    return save_row_spread(LlamaForCausalLM(config), tmp_path_factory.mktemp("random_llama"))


def save_row_spread(model, path: Path) -> Path:
    """``model`` in bf16 with each 2-D weight's rows scaled by random magnitudes (so block scales vary), saved."""
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(torch.exp(torch.randn(p.shape[0], 1) * 1.5).to(p.dtype))
    model.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_llama_matches_modelopt(random_llama, tmp_path, fmt):
    theirs = modelopt_export(random_llama, tmp_path / "modelopt", fmt)
    ours = quantize_checkpoint(random_llama, tmp_path / "anyfp4",
                               QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    assert assert_same_tensors(ours, theirs) > 20
    assert_same_description(ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_smollm2_matches_modelopt(smollm2_bf16, tmp_path, fmt):
    theirs = modelopt_export(smollm2_bf16, tmp_path / "modelopt", fmt)
    ours = quantize_checkpoint(smollm2_bf16, tmp_path / "anyfp4", QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    assert assert_same_tensors(ours, theirs) == {"nvfp4": 692, "fp8": 482, "mixed": 572}[fmt]
    assert_same_description(ours, theirs)


ZEROED = ("model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.o_proj", "model.layers.1.mlp.gate_proj",
          "model.layers.1.mlp.up_proj")
WHOLLY_ZERO = ("model.layers.0.self_attn.o_proj", "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj")


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_all_zero_linears_against_modelopt(random_llama, tmp_path, fmt):
    """Byte for byte as ModelOpt, except where ModelOpt 0.47 writes NaN: a linear whose whole scale group is zero
    (NVFP4: o_proj alone, or gate and up together; FP8: each zero linear). anyfp4 writes scales that decode to
    exact zeros there (ModelOpt's own zero-amax rule); a zero k_proj beside non-zero q/v is identical."""
    src = tmp_path / "src"
    shutil.copytree(random_llama, src)
    tensors = load_file(str(src / "model.safetensors"))
    for module in ZEROED:
        tensors[f"{module}.weight"].zero_()
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    theirs = modelopt_export(src, tmp_path / "modelopt", fmt)
    ours = quantize_checkpoint(src, tmp_path / "anyfp4", QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    nan_in_theirs = ZEROED if fmt == "fp8" else WHOLLY_ZERO
    with safe_open(str(ours / "model.safetensors"), "pt") as a, \
            safe_open(str(theirs / "model.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for name in a.keys():
            if name.rpartition(".")[0] not in nan_in_theirs:
                assert torch.equal(raw(a.get_tensor(name)), raw(b.get_tensor(name))), name
    readers = {"ours": CheckpointReader(ours), "theirs": CheckpointReader(theirs)}
    layers = {who: {layer.name: layer for layer in r.layers} for who, r in readers.items()}
    for module in nan_in_theirs:
        layer = layers["ours"][module]
        assert torch.equal(readers["ours"].dequantize(layer), torch.zeros(layer.out_features, layer.in_features))
        with pytest.raises(CheckpointError, match="are NaN"):  # ModelOpt's export is unreadable there
            readers["theirs"].dequantize(layers["theirs"][module])


@pytest.fixture(scope="module")
def random_qwen3_5(tmp_path_factory) -> Path:
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(1)
    return save_row_spread(Qwen3_5ForCausalLM(tiny_qwen3_5_config(vocab_size=256)),
                           tmp_path_factory.mktemp("random_qwen3_5"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_qwen3_5_hybrid_matches_modelopt(random_qwen3_5, tmp_path, fmt):
    """A Gated DeltaNet hybrid: the same tensors (in_proj_a / in_proj_b and the convolution left as they are,
    in_proj_qkv and in_proj_z sharing an NVFP4 global scale) and the same quantization config as ModelOpt's."""
    theirs = modelopt_export(random_qwen3_5, tmp_path / "modelopt", fmt)
    ours = quantize_checkpoint(random_qwen3_5, tmp_path / "anyfp4",
                               QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    assert assert_same_tensors(ours, theirs) > 75
    assert_same_description(ours, theirs)


@pytest.mark.parametrize("arch, fmt", [("qwen3_moe", "nvfp4"), ("qwen3_moe", "fp8"), ("qwen3_moe", "mixed"),
                                       ("mixtral", "nvfp4")])
def test_random_moe_matches_modelopt(tmp_path, arch, fmt):
    """Mixtures of experts: every expert's gate / up / down stored per expert (gate and up sharing an NVFP4 global
    scale), the routers left in bf16 and listed in exclude_modules, as ModelOpt exports them."""
    import transformers as tf

    torch.manual_seed(2)
    src = save_row_spread(getattr(tf, MOE_CLASSES[arch])(tiny_moe_config(arch, width=64)), tmp_path / "src")
    theirs = modelopt_export(src, tmp_path / "modelopt", fmt)
    ours = quantize_checkpoint(src, tmp_path / "anyfp4", QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    assert assert_same_tensors(ours, theirs) > 100
    assert_same_description(ours, theirs)
    routers = [l for l in CheckpointReader(ours).layers if l.name.endswith(".gate")]
    assert routers and all(l.format.value == "none" for l in routers)
