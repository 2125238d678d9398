"""config.json against the stored tensors: one check (runtime/plan.py) refuses every disagreement, for
generate and for inspect alike, and inspect says which architecture a valid checkpoint runs as."""

import json

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.cli import main
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from helpers import TINY_LLAMA, edit_json, expect_refused, rewrite_tensors, write_float_checkpoint

L0 = "model.layers.0."


def config(**changes):
    return lambda c: c.update(changes)


def pop(*names):
    def edit(t):
        for n in names:
            t.pop(n)
    return edit


def put(name, make):
    return lambda t: t.__setitem__(name, make(t))


# (id, config edit, tensor edit, expected fragment)
CASES = [
    ("fewer-layers", config(num_hidden_layers=1), None,
     "'num_hidden_layers' is 1 but the weights hold decoder layers 0-1 (2 of them)"),
    ("more-layers", config(num_hidden_layers=3), None,
     "'num_hidden_layers' is 3 but the weights hold decoder layers 0-1 (2 of them)"),
    ("zero-layers", config(num_hidden_layers=0), None, "'num_hidden_layers' must be an integer >= 1, found 0"),
    ("negative-layers", config(num_hidden_layers=-1), None, "'num_hidden_layers' must be an integer >= 1, found -1"),
    ("a-layer-missing", None, lambda t: [t.pop(n) for n in [n for n in t if n.startswith("model.layers.1.")]],
     "'num_hidden_layers' is 2 but the weights hold decoder layers 0-0 (1 of them)"),
    ("mlp-bias", config(mlp_bias=True), put(L0 + "mlp.down_proj.bias", lambda t: torch.zeros(64)),
     "'mlp_bias' true (biases on the MLP projections) is not supported"),
    ("stored-mlp-bias", None, put(L0 + "mlp.down_proj.bias", lambda t: torch.zeros(64)),
     "model.layers.0.mlp.down_proj stores a bias but LlamaForCausalLM has none there"),
    ("o-bias-without-attention-bias", None, put(L0 + "self_attn.o_proj.bias", lambda t: torch.zeros(64)),
     "model.layers.0.self_attn.o_proj stores a bias but 'attention_bias' is false"),
    ("attention-bias-without-biases", config(attention_bias=True), None,
     "model.layers.0.self_attn.q_proj has no stored bias but 'attention_bias' is true"),
    ("mixtral-as-llama", config(architectures=["MixtralForCausalLM"]), None,
     "'architectures' ['MixtralForCausalLM'] does not match model_type 'llama': anyfp4 would run it as "
     "LlamaForCausalLM"),
    ("moe-model-type", config(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"]), None,
     "model_type 'qwen2_moe' (['Qwen2MoeForCausalLM']) is not supported"),
    ("mixtral-config-dense-tensors", config(model_type="mixtral", architectures=["MixtralForCausalLM"],
                                            num_local_experts=4, num_experts_per_tok=2), None,
     "the model needs linear 'model.layers.0.block_sparse_moe.gate', which the checkpoint does not hold"),
    ("moe-keys", config(num_local_experts=8), None,
     "mixture-of-experts models ('num_local_experts' = 8) are not supported"),
    ("moe-tensors", None, put(L0 + "mlp.experts.0.w1.weight", lambda t: torch.zeros(96, 64)),
     "1 stored tensor(s) that the model for config.json would not read, e.g. "
     "['model.layers.0.mlp.experts.0.w1.weight']"),
    ("vocab", config(vocab_size=100), None, "lm_head is 128 x 64 but config.json implies 100 x 64"),
    ("heads", config(num_attention_heads=2, num_key_value_heads=2), None,
     "model.layers.0.self_attn.q_proj is 64 x 64 but config.json implies 32 x 64"),
    ("kv-heads", config(num_key_value_heads=4), None,
     "model.layers.0.self_attn.k_proj is 32 x 64 but config.json implies 64 x 64"),
    ("hidden", config(hidden_size=32, head_dim=16), None,
     "model.layers.0.self_attn.q_proj is 64 x 64 but config.json implies 64 x 32"),
    ("untied-without-head", None, pop("lm_head.weight"), "'tie_word_embeddings' is false but no lm_head is stored"),
    ("tied-with-head", config(tie_word_embeddings=True), None,
     "'tie_word_embeddings' is true but lm_head is stored too"),
    ("missing-linear", None, pop("model.layers.1.mlp.gate_proj.weight"),
     "the model needs linear 'model.layers.1.mlp.gate_proj', which the checkpoint does not hold"),
    ("missing-final-norm", None, pop("model.norm.weight"), "tensor the model needs is missing"),
    ("missing-layer-norm", None, pop(L0 + "input_layernorm.weight"), "tensor the model needs is missing"),
    ("norm-shape", None, put("model.norm.weight", lambda t: torch.ones(32)), "shape [32], config.json implies [64]"),
    ("integer-norm", None, put("model.norm.weight", lambda t: torch.ones(64, dtype=torch.int32)),
     "must be a float tensor (bf16, fp16 or fp32; a quantized embedding or norm is not read), found torch.int32"),
    ("3d-weight", None, put(L0 + "mlp.up_proj.weight", lambda t: t[L0 + "mlp.up_proj.weight"].reshape(96, 4, 16)),
     "linear model.layers.0.mlp.up_proj must store a 2-D weight, found [96, 4, 16]"),
    ("qwen3-without-qk-norm", config(model_type="qwen3", architectures=["Qwen3ForCausalLM"]), None,
     "tensor the model needs is missing (file"),
    ("qwen2-sliding-window", config(model_type="qwen2", architectures=["Qwen2ForCausalLM"], use_sliding_window=True),
     None, "'use_sliding_window' true (sliding-window attention) is not supported"),
]


@pytest.mark.parametrize("edit_config, edit_tensors, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_config_and_tensors_must_agree(tmp_path, capsys, edit_config, edit_tensors, fragment):
    path = write_float_checkpoint(tmp_path / "ckpt")
    if edit_config is not None:
        edit_json(path / "config.json", edit_config)
    if edit_tensors is not None:
        rewrite_tensors(path, edit_tensors)
    expect_refused(path, fragment, capsys)


@pytest.fixture
def nvfp4(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    return quantize_checkpoint(src, tmp_path / "nvfp4", QuantizeOptions(progress=False)).dst


def test_two_quantization_configs_must_agree(nvfp4, capsys):
    edit_json(nvfp4 / "hf_quant_config.json", lambda d: d["quantization"].update(quant_algo="FP8"))
    expect_refused(nvfp4, "the quantization configs disagree: hf_quant_config.json makes model.layers.0.mlp.down_proj "
                   "FP8, config.json's quantization_config makes it NVFP4 (modelopt tensors)", capsys,
                   names_file=nvfp4 / "config.json")


def test_3d_packed_codes(nvfp4, capsys):
    name = L0 + "mlp.up_proj.weight"
    rewrite_tensors(nvfp4, put(name, lambda t: t[name].reshape(96, 2, 16)))
    expect_refused(nvfp4, "linear model.layers.0.mlp.up_proj must store a 2-D weight, found [96, 2, 16]", capsys)


def test_quantized_embedding_is_refused(tmp_path, capsys):
    src = write_float_checkpoint(tmp_path / "src")
    dst = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(exclude=("lm_head",), progress=False)).dst
    expect_refused(dst, "must be a float tensor (bf16, fp16 or fp32; a quantized embedding or norm is not read), "
                   "found torch.uint8 (file", capsys)


def test_mistral_sliding_window_caps_the_context(tmp_path):
    path = write_float_checkpoint(tmp_path / "m", dict(TINY_LLAMA, model_type="mistral",
                                                       architectures=["MistralForCausalLM"], sliding_window=64))
    model, _ = load_model(path, "cpu", torch.float32, progress=False)
    assert model.args.max_position_embeddings == 64
    with pytest.raises(ValueError, match="exceeds the model's context of 64 tokens"):
        generate(model, [[5, 6]], SamplingParams(max_new_tokens=80))


@pytest.mark.parametrize("arch, extra", [("llama", {}), ("qwen2", {}), ("mistral", {}),
                                         ("llama", {"attention_bias": True})])
def test_inspect_names_the_architecture_it_runs(tmp_path, capsys, arch, extra):
    classes = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
    path = write_float_checkpoint(tmp_path / arch, dict(TINY_LLAMA, model_type=arch, architectures=[classes[arch]],
                                                        **extra))
    biased = ("q", "k", "v", "o") if extra else ("q", "k", "v") if arch == "qwen2" else ()

    def add_biases(t):
        for i in range(2):
            for p in biased:
                rows = t[f"model.layers.{i}.self_attn.{p}_proj.weight"].shape[0]
                t[f"model.layers.{i}.self_attn.{p}_proj.bias"] = torch.full((rows,), 0.01, dtype=torch.bfloat16)
    rewrite_tensors(path, add_biases)
    assert main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "valid" and report["architecture"] == classes[arch]
    model, _ = load_model(path, "cpu", torch.float32, progress=False)  # and the loader builds it
    assert main(["inspect", str(path)]) == 0
    assert f"valid (structure, config and values checked); runs as {classes[arch]}" in capsys.readouterr().out
