"""Malformed config.json, quantization configs, generation_config.json and tokenizers: one-line errors
naming the file and the key, never a traceback; the tokenizer is checked before the weights load."""

import json

import pytest

from anyfp4.checkpoint.errors import CheckpointError
from anyfp4.cli import main
from anyfp4.runtime import session as session_module
from helpers import TINY_LLAMA, edit_json, expect_refused, write_float_checkpoint, write_tiny_tokenizer


def drop(key):
    return lambda c: c.pop(key)


def config(**changes):
    return lambda c: c.update(changes)


LLAMA3 = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}

CONFIG_CASES = [
    ("intermediate-size-missing", drop("intermediate_size"), "missing 'intermediate_size'"),
    ("llama3-without-factor", config(rope_scaling=LLAMA3), "missing 'factor'"),
    ("llama3-low-above-high", config(rope_scaling=dict(LLAMA3, factor=8.0, low_freq_factor=4.0)),
     "llama3 RoPE needs 'high_freq_factor' > 'low_freq_factor', found 4 <= 4"),
    ("layers-as-string", config(num_hidden_layers="30"), "'num_hidden_layers' must be an integer >= 1, found '30'"),
    ("layers-as-bool", config(num_hidden_layers=True), "'num_hidden_layers' must be an integer >= 1, found True"),
    ("zero-heads", config(num_attention_heads=0), "'num_attention_heads' must be an integer >= 1, found 0"),
    ("zero-kv-heads", config(num_key_value_heads=0), "'num_key_value_heads' must be an integer >= 1, found 0"),
    ("heads-not-multiple", config(num_key_value_heads=3),
     "'num_attention_heads' 4 is not a multiple of 'num_key_value_heads' 3"),
    ("odd-head-dim", config(head_dim=15), "head_dim 15 ('head_dim' or hidden_size / num_attention_heads) must be even"),
    ("vocab-as-float", config(vocab_size=128.5), "'vocab_size' must be an integer >= 1, found 128.5"),
    ("eps-nan", config(rms_norm_eps=float("nan")), "'rms_norm_eps' must be a number in [1.17549e-38, 1], found nan"),
    ("eps-zero", config(rms_norm_eps=0), "'rms_norm_eps' must be a number in [1.17549e-38, 1], found 0"),
    ("theta-zero", config(rope_theta=0), "'rope_theta' must be a number in [1, 1e+300], found 0"),
    ("theta-string", config(rope_theta="big"), "'rope_theta' must be a number in [1, 1e+300], found 'big'"),
    ("tie-as-string", config(tie_word_embeddings="yes"), "'tie_word_embeddings' must be true or false, found 'yes'"),
    ("rope-scaling-list", config(rope_scaling=[1, 2]), "'rope_scaling' must be a JSON object or null, found [1, 2]"),
    ("rope-type-yarn", config(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
     "RoPE type 'yarn' is not supported (default and llama3 are)"),
    ("architectures-string", config(architectures="LlamaForCausalLM"),
     "'architectures' must be a list of class names, found 'LlamaForCausalLM'"),
    ("hidden-act", config(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    ("model-type-list", config(model_type=["llama"]), "model_type ['llama']"),
    ("quantization-config-list", config(quantization_config=["modelopt"]),
     "'quantization_config' must be a JSON object, found ['modelopt']"),
    ("bad-regex", config(quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4",
                                              "ignore": ["re:(unclosed"]}),
     "'ignore' entry 're:(unclosed' is not a valid regular expression: missing ), unterminated subpattern"),
    ("ignore-as-string", config(quantization_config={"quant_method": "compressed-tensors", "format": "float-quantized",
                                                     "ignore": "lm_head"}),
     "'ignore' must be a list of module names or patterns, found 'lm_head'"),
    ("config-groups-list", config(quantization_config={"quant_method": "compressed-tensors",
                                                       "format": "float-quantized", "config_groups": [1]}),
     "'config_groups' must be a JSON object, found [1]"),
    ("quant-algo-list", config(quantization_config={"quant_method": "modelopt", "quant_algo": ["NVFP4"]}),
     "unsupported ModelOpt quant_algo ['NVFP4'] at quant_algo"),
]


@pytest.mark.parametrize("edit, fragment", [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES])
def test_config_json_values(tmp_path, capsys, edit, fragment):
    path = write_float_checkpoint(tmp_path / "ckpt")
    edit_json(path / "config.json", edit)
    expect_refused(path, fragment, capsys, names_file=path / "config.json")


@pytest.mark.parametrize("content, fragment", [("[1, 2, 3]", "expected a JSON object, found list"),
                                               ("42", "expected a JSON object, found int"),
                                               ("{oops", "not valid JSON: Expecting property name"),
                                               ("[" * 100000, "cannot be read as JSON: maximum recursion depth exceeded"),
                                               (b"\xff\xfe{}", "not UTF-8 text: invalid start byte")])
def test_config_json_that_is_not_an_object(tmp_path, capsys, content, fragment):
    path = write_float_checkpoint(tmp_path / "ckpt")
    (path / "config.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    expect_refused(path, fragment, capsys, names_file=path / "config.json")


def test_bad_regex_in_hf_quant_config(tmp_path, capsys):
    path = write_float_checkpoint(tmp_path / "ckpt")
    (path / "hf_quant_config.json").write_text(json.dumps({"quantization": {
        "quant_algo": "NVFP4", "exclude_modules": ["lm_head", "re:(unclosed"]}}))
    expect_refused(path, "'exclude_modules' entry 're:(unclosed' is not a valid regular expression", capsys,
                   names_file=path / "hf_quant_config.json")


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "not valid JSON"),
    (json.dumps({"eos_token_id": "eos"}), "'eos_token_id' must be a token id or a list of token ids, found 'eos'"),
    (json.dumps({"eos_token_id": [2, "x"]}), "'eos_token_id' must be a token id or a list of token ids, found [2, 'x']"),
    (json.dumps({"eos_token_id": -1}), "'eos_token_id' must be a token id or a list of token ids, found -1"),
    ("[2]", "expected a JSON object, found list"),
])
def test_generation_config(tmp_path, capsys, content, fragment):
    path = write_float_checkpoint(tmp_path / "ckpt")
    (path / "generation_config.json").write_text(content)
    expect_refused(path, fragment, capsys, names_file=path / "generation_config.json")


def no_tokenizer(path):
    (path / "tokenizer.json").unlink()
    (path / "tokenizer_config.json").unlink()


def corrupt_tokenizer(path):
    (path / "tokenizer.json").write_text("{corrupt")


def big_tokenizer(path):
    write_tiny_tokenizer(path, 200)


@pytest.mark.parametrize("damage, fragment", [
    (no_tokenizer, "cannot load the tokenizer: "),
    (corrupt_tokenizer, "cannot load the tokenizer: "),
    (big_tokenizer, "the tokenizer has 200 tokens but config.json 'vocab_size' is 128"),
])
def test_tokenizer_is_checked_before_the_weights_load(tmp_path, capsys, monkeypatch, damage, fragment):
    path = write_float_checkpoint(tmp_path / "ckpt")
    damage(path)

    def must_not_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the tokenizer was checked")
    monkeypatch.setattr(session_module, "load_planned", must_not_load)
    expect_refused(path, fragment, capsys)
    assert main(["generate", str(path), "--prompt", "w5", "--quiet", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("anyfp4 generate: error: ") and fragment in err and err.count("\n") == 1


def test_generate_refuses_nan_weights_instead_of_printing_nothing(tmp_path, capsys):
    import torch

    from helpers import rewrite_tensors

    path = write_float_checkpoint(tmp_path / "ckpt")
    rewrite_tensors(path, lambda t: t.__setitem__("model.norm.weight", torch.full((64,), float("nan"))))
    assert main(["generate", str(path), "--prompt", "w5 w6", "--max-tokens", "4", "--quiet", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "tensor holds 64 NaN/Inf value(s), e.g. nan" in err and "'model.norm.weight'" in err


def test_a_valid_tiny_checkpoint_generates(tmp_path, capsys):
    path = write_float_checkpoint(tmp_path / "ckpt", dict(TINY_LLAMA))
    assert main(["generate", str(path), "--prompt", "w5 w6", "--max-tokens", "4", "--quiet", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip()


def test_prefill_logits_that_overflow_are_an_error(tmp_path):
    import torch

    from anyfp4.runtime.generate import SamplingParams, generate
    from anyfp4.runtime.loader import load_model

    path = write_float_checkpoint(tmp_path / "ckpt")
    model, _ = load_model(path, "cpu", torch.float16, progress=False)
    model.lm_head.weight.fill_(60000.0)  # finite weights whose logits overflow fp16
    with pytest.raises(ValueError, match="the model's logits after the prompt are NaN or Inf"):
        generate(model, [[5, 6]], SamplingParams(max_new_tokens=2))


def test_library_errors_are_checkpoint_errors():
    from anyfp4.runtime.config import ModelArgs, UnsupportedModelError

    assert issubclass(UnsupportedModelError, CheckpointError)
    with pytest.raises(CheckpointError, match=r"expected a JSON object, found list \(file config.json\)"):
        ModelArgs.from_hf([1])
