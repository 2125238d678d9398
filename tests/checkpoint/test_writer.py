import json

import pytest
import torch
from safetensors import safe_open

from anyfp4.checkpoint import writer as writer_module
from anyfp4.checkpoint.errors import CheckpointError
from anyfp4.checkpoint.quant_config import WeightFormat
from anyfp4.checkpoint.reader import CheckpointReader
from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.formats.nvfp4 import quantize_nvfp4, shared_global_scale
from helpers import TINY_LLAMA, llama_tensors, write_float_checkpoint

QUIET = dict(progress=False)


@pytest.fixture
def src(tmp_path):
    return write_float_checkpoint(tmp_path / "src")


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed"])
def test_round_trip_through_reader(src, tmp_path, fmt):
    dst = tmp_path / "dst"
    summary = quantize_checkpoint(src, dst, QuantizeOptions(format=TargetFormat(fmt), **QUIET))
    assert summary.shards == ["model.safetensors"]
    reader = CheckpointReader(dst)
    originals = llama_tensors(TINY_LLAMA)
    formats = {layer.name: layer.format for layer in reader.layers}
    assert formats["model.embed_tokens"] is WeightFormat.NONE and formats["lm_head"] is WeightFormat.NONE
    expect_attn = {"nvfp4": WeightFormat.NVFP4, "fp8": WeightFormat.FP8, "mixed": WeightFormat.FP8}[fmt]
    expect_mlp = {"nvfp4": WeightFormat.NVFP4, "fp8": WeightFormat.FP8, "mixed": WeightFormat.NVFP4}[fmt]
    assert formats["model.layers.1.self_attn.k_proj"] is expect_attn
    assert formats["model.layers.1.mlp.down_proj"] is expect_mlp
    for layer in reader.layers:
        w = originals[layer.name + ".weight"].float()
        deq = reader.dequantize(layer)
        rel = ((deq - w).norm() / w.norm()).item()
        limit = {WeightFormat.NVFP4: 0.12, WeightFormat.FP8: 0.04, WeightFormat.NONE: 0.0}[layer.format]
        assert rel <= limit, (layer.name, rel)
    # side files copied, configs written
    assert (dst / "generation_config.json").is_file() and (dst / "tokenizer_config.json").is_file()
    hf_quant = json.loads((dst / "hf_quant_config.json").read_text())["quantization"]
    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "modelopt"
    assert config["ignore"] == hf_quant["exclude_modules"] == ["lm_head", "model.embed_tokens"]
    if fmt == "mixed":
        assert hf_quant["quant_algo"] == "MIXED_PRECISION"
        assert hf_quant["quantized_layers"]["model.layers.0.mlp.up_proj"] == {"quant_algo": "NVFP4", "group_size": 16}
        assert hf_quant["quantized_layers"]["model.layers.0.self_attn.o_proj"] == {"quant_algo": "FP8"}


def test_fused_projections_share_one_global_scale(src, tmp_path):
    dst = tmp_path / "dst"
    quantize_checkpoint(src, dst, QuantizeOptions(**QUIET))
    originals = llama_tensors(TINY_LLAMA)
    with safe_open(str(dst / "model.safetensors"), "pt") as f:
        for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            parent = "self_attn" if "q_proj" in group else "mlp"
            names = [f"model.layers.0.{parent}.{p}" for p in group]
            scales = [f.get_tensor(n + ".weight_scale_2") for n in names]
            assert all(torch.equal(s, scales[0]) for s in scales)
            expected = shared_global_scale([originals[n + ".weight"] for n in names])
            assert torch.equal(scales[0], expected)
            for n in names:  # and the codes are those of the reference with that shared scale
                ref = quantize_nvfp4(originals[n + ".weight"], expected)
                assert torch.equal(f.get_tensor(n + ".weight"), ref.packed)
        o = f.get_tensor("model.layers.0.self_attn.o_proj.weight_scale_2")
        assert torch.equal(o, shared_global_scale([originals["model.layers.0.self_attn.o_proj.weight"]]))


def test_sharded_output_and_index(src, tmp_path):
    dst = tmp_path / "dst"
    summary = quantize_checkpoint(src, dst, QuantizeOptions(max_shard_bytes=20_000, **QUIET))
    assert len(summary.shards) > 2
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(summary.shards)
    reader = CheckpointReader(dst)
    reader.validate_values()
    assert len(reader.index.files) == len(summary.shards)


@pytest.mark.parametrize("force", [False, True])
def test_never_replaces_a_directory_that_is_not_a_checkpoint(src, tmp_path, force):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("precious")
    with pytest.raises(CheckpointError, match=r"not empty and is not a checkpoint \(it has no config.json\)"):
        quantize_checkpoint(src, dst, QuantizeOptions(force=force, **QUIET))
    assert [p.name for p in dst.iterdir()] == ["keep.txt"]


def test_replaces_a_checkpoint_only_when_forced(src, tmp_path):
    dst = tmp_path / "dst"
    quantize_checkpoint(src, dst, QuantizeOptions(format=TargetFormat.FP8, **QUIET))
    (dst / "keep.txt").write_text("goes with the checkpoint")
    with pytest.raises(CheckpointError, match=r"not empty \(it holds a checkpoint\); pass --force to replace it"):
        quantize_checkpoint(src, dst, QuantizeOptions(**QUIET))
    assert (dst / "keep.txt").exists()
    quantize_checkpoint(src, dst, QuantizeOptions(force=True, **QUIET))
    assert not (dst / "keep.txt").exists() and (dst / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]


@pytest.mark.parametrize("value", [0, -1, 2.5, None])
def test_max_shard_bytes_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match=f"max_shard_bytes must be a positive integer, got {value!r}"):
        QuantizeOptions(max_shard_bytes=value)


def test_failure_leaves_nothing_behind(src, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = writer_module.quantize_nvfp4

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("disk on fire")
        return real(*args, **kwargs)

    monkeypatch.setattr(writer_module, "quantize_nvfp4", failing)
    dst = tmp_path / "dst"
    with pytest.raises(RuntimeError, match="disk on fire"):
        quantize_checkpoint(src, dst, QuantizeOptions(**QUIET))
    assert not dst.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # no partial directory left


def test_failure_keeps_existing_destination(src, tmp_path, monkeypatch):
    dst = tmp_path / "dst"
    quantize_checkpoint(src, dst, QuantizeOptions(**QUIET))
    before = (dst / "model.safetensors").read_bytes()
    monkeypatch.setattr(writer_module, "quantize_nvfp4", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError):
        quantize_checkpoint(src, dst, QuantizeOptions(force=True, **QUIET))
    assert (dst / "model.safetensors").read_bytes() == before


def test_k_not_multiple_of_16_names_the_tensor(tmp_path):
    config = dict(TINY_LLAMA, intermediate_size=40)
    src = write_float_checkpoint(tmp_path / "src", config)
    with pytest.raises(CheckpointError, match="in_features 40 is not a multiple of 16.*down_proj.weight"):
        quantize_checkpoint(src, tmp_path / "dst", QuantizeOptions(**QUIET))
    assert not (tmp_path / "dst").exists()
    # FP8 has no such restriction, and --exclude gets NVFP4 through
    quantize_checkpoint(src, tmp_path / "fp8", QuantizeOptions(format=TargetFormat.FP8, **QUIET))
    quantize_checkpoint(src, tmp_path / "ok", QuantizeOptions(exclude=("lm_head", "*embed_tokens", "*down_proj"),
                                                              **QUIET))
    assert "model.layers.0.mlp.down_proj" in json.loads((tmp_path / "ok" / "hf_quant_config.json").read_text())[
        "quantization"]["exclude_modules"]


def test_refuses_quantized_source(src, tmp_path):
    quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(**QUIET))
    with pytest.raises(CheckpointError, match="already quantized"):
        quantize_checkpoint(tmp_path / "q", tmp_path / "qq", QuantizeOptions(**QUIET))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_source_dtypes(tmp_path, dtype):
    src = write_float_checkpoint(tmp_path / "src", dtype=dtype)
    quantize_checkpoint(src, tmp_path / "dst", QuantizeOptions(**QUIET))
    reader = CheckpointReader(tmp_path / "dst")
    assert reader.load("model.norm.weight").dtype == dtype  # unquantized tensors keep their dtype
    reader.validate_values()
