import json

import pytest

from anyfp4.checkpoint.errors import CheckpointError
from anyfp4.checkpoint.quant_config import TensorNaming, WeightFormat, module_matches, parse_quant_scheme


def write(tmp_path, hf_quant=None, quantization_config=None):
    config = {"model_type": "llama"}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return tmp_path


def modelopt(algo, **extra):
    return {"producer": {"name": "modelopt", "version": "0.47.0"},
            "quantization": {"quant_algo": algo, "group_size": 16, **extra}}


@pytest.mark.parametrize("algo, fmt", [("NVFP4", WeightFormat.NVFP4), ("W4A16_NVFP4", WeightFormat.NVFP4),
                                       ("FP8", WeightFormat.FP8)])
def test_modelopt_algos(tmp_path, algo, fmt):
    s = parse_quant_scheme(write(tmp_path, modelopt(algo, exclude_modules=["lm_head", "model.embed_tokens"])))
    assert s.producer == "modelopt" and s.naming is TensorNaming.MODELOPT
    assert s.format_of("model.layers.0.mlp.up_proj") is fmt
    assert s.format_of("lm_head") is WeightFormat.NONE
    assert s.format_of("model.embed_tokens") is WeightFormat.NONE


def test_wildcard_and_prefix_exclusions(tmp_path):
    s = parse_quant_scheme(write(tmp_path, modelopt("NVFP4", exclude_modules=["*lm_head*", "model.layers.1",
                                                                               "re:.*\\.k_proj"])))
    assert s.format_of("lm_head") is WeightFormat.NONE
    assert s.format_of("model.layers.1.mlp.up_proj") is WeightFormat.NONE
    assert s.format_of("model.layers.10.mlp.up_proj") is WeightFormat.NVFP4  # prefix is per dotted component
    assert s.format_of("model.layers.0.self_attn.k_proj") is WeightFormat.NONE
    assert s.format_of("model.layers.0.self_attn.q_proj") is WeightFormat.NVFP4
    assert module_matches("a.b.c", "a.b") and not module_matches("a.bc", "a.b")


def test_mixed_precision(tmp_path):
    layers = {"model.layers.0.mlp.down_proj": {"quant_algo": "NVFP4", "group_size": 16},
              "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"}}
    s = parse_quant_scheme(write(tmp_path, modelopt("MIXED_PRECISION", quantized_layers=layers)))
    assert s.is_mixed
    assert s.format_of("model.layers.0.mlp.down_proj") is WeightFormat.NVFP4
    assert s.format_of("model.layers.0.self_attn.q_proj") is WeightFormat.FP8
    assert s.format_of("model.layers.0.self_attn.k_proj") is WeightFormat.NONE  # unlisted


def test_schemes_pickle(tmp_path):
    """vLLM pickles the quantization config (and so its scheme) to its engine process."""
    import pickle
    from types import MappingProxyType

    layers = {"model.layers.0.mlp.down_proj": {"quant_algo": "NVFP4"}}
    mixed = parse_quant_scheme(write(tmp_path, modelopt("MIXED_PRECISION", quantized_layers=layers)))
    back = pickle.loads(pickle.dumps(mixed))
    assert back == mixed and isinstance(back.layer_formats, MappingProxyType)
    assert back.format_of("model.layers.0.mlp.down_proj") is WeightFormat.NVFP4


def test_config_json_modelopt_reads_ignore(tmp_path):
    qc = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}
    s = parse_quant_scheme(write(tmp_path, quantization_config=qc))
    assert s.format_of("lm_head") is WeightFormat.NONE and s.format_of("x.q_proj") is WeightFormat.FP8


def test_compressed_tensors_nvfp4(tmp_path):
    qc = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float",
                                                                            "strategy": "tensor_group",
                                                                            "group_size": 16}}}}
    s = parse_quant_scheme(write(tmp_path, quantization_config=qc))
    assert s.naming is TensorNaming.COMPRESSED_TENSORS
    assert s.format_of("model.layers.0.mlp.up_proj") is WeightFormat.NVFP4
    assert s.format_of("lm_head") is WeightFormat.NONE


def test_no_quantization_config_is_float(tmp_path):
    s = parse_quant_scheme(write(tmp_path))
    assert s.producer == "none" and s.format_of("anything") is WeightFormat.NONE


@pytest.mark.parametrize("hf_quant, qc, message", [
    (modelopt("INT4_AWQ"), None, "unsupported ModelOpt quant_algo 'INT4_AWQ'"),
    (modelopt("MIXED_PRECISION"), None, "no 'quantized_layers'"),
    (modelopt("MIXED_PRECISION", quantized_layers={"a": {"quant_algo": "W8A8"}}), None, "quantized_layers\\['a'\\]"),
    ({"producer": {}}, None, "missing the 'quantization' object"),
    (None, {"quant_method": "gptq"}, "unsupported quant_method 'gptq'"),
    (None, {"quant_method": "compressed-tensors", "format": "pack-quantized"}, "unsupported compressed-tensors"),
])
def test_bad_configs_name_the_file(tmp_path, hf_quant, qc, message):
    root = write(tmp_path, hf_quant, qc)
    with pytest.raises(CheckpointError, match=message) as e:
        parse_quant_scheme(root)
    assert str(tmp_path) in str(e.value)


def test_invalid_json(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "hf_quant_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON.*hf_quant_config.json"):
        parse_quant_scheme(tmp_path)


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        parse_quant_scheme(tmp_path)
