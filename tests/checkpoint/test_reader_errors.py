"""Every malformed checkpoint is refused with a clear error naming the file and the tensor."""

import json

import pytest
import torch

from anyfp4.checkpoint.errors import CheckpointError
from anyfp4.checkpoint.reader import CheckpointReader
from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from helpers import edit_json, rewrite_tensors, write_float_checkpoint

LAYER = "model.layers.0.mlp.up_proj"


@pytest.fixture
def nvfp4(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    return quantize_checkpoint(src, tmp_path / "nvfp4", QuantizeOptions(progress=False)).dst


@pytest.fixture
def fp8(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    return quantize_checkpoint(src, tmp_path / "fp8", QuantizeOptions(format=TargetFormat.FP8, progress=False)).dst


def open_and_validate(path):
    reader = CheckpointReader(path)
    reader.validate_values()
    return reader


def expect_error(path, message, tensor=None):
    with pytest.raises(CheckpointError, match=message) as e:
        open_and_validate(path)
    text = str(e.value)
    assert str(path) in text, text
    if tensor is not None:
        assert repr(tensor) in text, text
    return e.value


def test_missing_scale_tensor(nvfp4):
    rewrite_tensors(nvfp4, lambda t: t.pop(f"{LAYER}.weight_scale"))
    expect_error(nvfp4, "missing E4M3 block scales of quantized layer", f"{LAYER}.weight_scale")


def test_missing_global_scale(nvfp4):
    rewrite_tensors(nvfp4, lambda t: t.pop(f"{LAYER}.weight_scale_2"))
    expect_error(nvfp4, "missing global scale", f"{LAYER}.weight_scale_2")


def test_wrong_scale_shape(nvfp4):
    rewrite_tensors(nvfp4, lambda t: t.__setitem__(f"{LAYER}.weight_scale", t[f"{LAYER}.weight_scale"][:, :-1].clone()))
    expect_error(nvfp4, r"must have shape \[96, 4\], found \[96, 3\]", f"{LAYER}.weight_scale")


def test_wrong_scale_dtype(nvfp4):
    rewrite_tensors(nvfp4, lambda t: t.__setitem__(f"{LAYER}.weight_scale", t[f"{LAYER}.weight_scale"].float()))
    expect_error(nvfp4, "must be float8_e4m3fn, found torch.float32", f"{LAYER}.weight_scale")


def test_k_not_multiple_of_16(nvfp4):
    def cut(t):
        t[f"{LAYER}.weight"] = t[f"{LAYER}.weight"][:, :28].clone()  # K = 56
        t[f"{LAYER}.weight_scale"] = t[f"{LAYER}.weight_scale"][:, :3].clone()
    rewrite_tensors(nvfp4, cut)
    expect_error(nvfp4, "K = 56 is not a multiple of 16", f"{LAYER}.weight")


SCALE_RANGE = r"NVFP4 global scale must lie in \[2.22e-11, 24.4\] \(an amax of 5.96e-08 to 65504\), found "


@pytest.mark.parametrize("value, message", [(float("nan"), SCALE_RANGE + "nan"),
                                            (0.0, SCALE_RANGE + "0 "),
                                            (-0.01, SCALE_RANGE + "-0.01"),
                                            (float("inf"), SCALE_RANGE + "inf"),
                                            (1e30, SCALE_RANGE + "1e[+]30"),
                                            (25.0, SCALE_RANGE + "25 "),
                                            (1e-12, SCALE_RANGE + "1e-12")])
def test_bad_global_scale(nvfp4, value, message):
    rewrite_tensors(nvfp4, lambda t: t.__setitem__(f"{LAYER}.weight_scale_2", torch.tensor(value)))
    expect_error(nvfp4, message, f"{LAYER}.weight_scale_2")


def test_nan_and_negative_block_scales(nvfp4):
    def poison(byte):
        def edit(t):
            raw = t[f"{LAYER}.weight_scale"].view(torch.uint8).clone()
            raw[3, 1] = byte
            t[f"{LAYER}.weight_scale"] = raw.view(torch.float8_e4m3fn)
        return edit
    rewrite_tensors(nvfp4, poison(0x7F))
    expect_error(nvfp4, "1 block scale\\(s\\) are NaN", f"{LAYER}.weight_scale")
    rewrite_tensors(nvfp4, poison(0xB8))  # -1.0
    expect_error(nvfp4, "1 block scale\\(s\\) are negative", f"{LAYER}.weight_scale")


def test_fp8_bad_scale_and_nan_weight(fp8):
    rewrite_tensors(fp8, lambda t: t.__setitem__(f"{LAYER}.weight_scale", torch.tensor(-1.0)))
    expect_error(fp8, r"FP8 weight scale must lie in \[1.33e-10, 146\] .*found -1 ", f"{LAYER}.weight_scale")
    rewrite_tensors(fp8, lambda t: t.__setitem__(f"{LAYER}.weight_scale", torch.ones(7)))
    expect_error(fp8, r"must have shape \[\] or \[1\] or \[96\] or \[96, 1\]", f"{LAYER}.weight_scale")


def test_fp8_per_channel_scales_load(fp8):
    rewrite_tensors(fp8, lambda t: t.__setitem__(f"{LAYER}.weight_scale", torch.full((96, 1), 0.01)))
    reader = open_and_validate(fp8)
    q = reader.load_fp8(reader.layer_by_name[LAYER])
    assert q.scale.shape == (96,) and q.per_channel


def test_unknown_quant_algo(nvfp4):
    edit_json(nvfp4 / "hf_quant_config.json", lambda d: d["quantization"].update(quant_algo="NVFP8_MAGIC"))
    expect_error(nvfp4, "unsupported ModelOpt quant_algo 'NVFP8_MAGIC'")


def test_truncated_file(nvfp4):
    file = nvfp4 / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])
    err = expect_error(nvfp4, "corrupt or truncated safetensors file")
    assert err.file.endswith("model.safetensors")


def test_corrupt_header(nvfp4):
    file = nvfp4 / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[10:20] = b"\x00" * 10
    file.write_bytes(bytes(data))
    expect_error(nvfp4, "corrupt or truncated safetensors file")


def test_shard_missing_from_index(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    dst = quantize_checkpoint(src, tmp_path / "sharded", QuantizeOptions(max_shard_bytes=20_000, progress=False)).dst
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (dst / victim).unlink()
    err = expect_error(dst, "shard listed in model.safetensors.index.json is missing")
    assert victim in str(err) and err.tensor is not None


def test_index_names_tensor_absent_from_shard(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    dst = quantize_checkpoint(src, tmp_path / "sharded", QuantizeOptions(max_shard_bytes=20_000, progress=False)).dst
    edit_json(dst / "model.safetensors.index.json",
              lambda d: d["weight_map"].update({"model.layers.9.ghost.weight": next(iter(d["weight_map"].values()))}))
    expect_error(dst, "does not hold it", "model.layers.9.ghost.weight")


def test_config_listing_modules_not_stored_is_tolerated_with_a_note(tmp_path):
    """ModelOpt's quantized_layers may name modules its export leaves out: read, said in one line; a stored
    module missing from the list is still refused."""
    from anyfp4.checkpoint.inspection import inspect_checkpoint
    from anyfp4.runtime.plan import plan_checkpoint

    src = write_float_checkpoint(tmp_path / "src")
    dst = quantize_checkpoint(src, tmp_path / "mixed", QuantizeOptions(format=TargetFormat.MIXED, progress=False)).dst
    edit_json(dst / "hf_quant_config.json", lambda d: d["quantization"]["quantized_layers"].update(
        {"model.layers.7.mlp.up_proj": {"quant_algo": "NVFP4", "group_size": 16}}))
    note = CheckpointReader(dst).notes
    assert len(note) == 1 and "quantized_layers lists 1 module(s) whose weights are not stored" in note[0]
    assert "model.layers.7.mlp.up_proj" in note[0] and "\n" not in note[0]
    report = inspect_checkpoint(dst, check_values=False)
    assert report["valid"] and report["notes"] == list(note), report
    with pytest.warns(UserWarning, match="layers.7.mlp.up_proj; ignored"):
        plan_checkpoint(dst)

    def drop_a_stored_entry(d):
        layers = d["quantization"]["quantized_layers"]
        layers.pop(next(m for m in layers if m.endswith("mlp.down_proj")))
    edit_json(dst / "hf_quant_config.json", drop_a_stored_entry)
    expect_error(dst, "makes model.layers.0.mlp.down_proj unquantized")


def test_quantized_weight_in_an_excluded_layer(nvfp4):
    edit_json(nvfp4 / "hf_quant_config.json", lambda d: d["quantization"]["exclude_modules"].append(LAYER))
    edit_json(nvfp4 / "config.json", lambda d: d["quantization_config"]["ignore"].append(LAYER))
    expect_error(nvfp4, "unquantized by the config but its weight is torch.uint8", f"{LAYER}.weight")


def test_float_weight_where_config_expects_quantized(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    (src / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4",
                                                                           "exclude_modules": ["lm_head"]}}))
    expect_error(src, "packed E2M1 codes must be uint8, found torch.bfloat16", "model.embed_tokens.weight")


def test_no_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no safetensors weights found"):
        CheckpointReader(tmp_path)


def test_fp8_input_scale_is_read_and_checked(fp8):
    rewrite_tensors(fp8, lambda t: t.__setitem__(f"{LAYER}.input_scale", torch.tensor(0.25)))
    reader = open_and_validate(fp8)
    assert reader.load_fp8(reader.layer_by_name[LAYER]).input_scale.item() == 0.25
    assert reader.load_fp8(reader.layer_by_name["model.layers.0.mlp.gate_proj"]).input_scale is None
    rewrite_tensors(fp8, lambda t: t.__setitem__(f"{LAYER}.input_scale", torch.tensor(float("nan"))))
    expect_error(fp8, r"FP8 input scale must lie in \[1.33e-10, 146\] .*found nan", f"{LAYER}.input_scale")
    rewrite_tensors(fp8, lambda t: t.__setitem__(f"{LAYER}.input_scale", torch.ones(3)))
    expect_error(fp8, r"FP8 input scale must have shape \[\] or \[1\]", f"{LAYER}.input_scale")
