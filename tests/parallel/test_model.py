"""Tensor parallelism on the CPU (gloo, 2 processes): sharded greedy output equals one process."""

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from anyfp4.parallel.model import generate_tp
from helpers import TINY_LLAMA, free_port, write_float_checkpoint

CONFIG = dict(TINY_LLAMA, intermediate_size=128)  # 64 per rank: whole 16-element groups


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed"])
def test_tp2_equals_single_process(tmp_path, fmt):
    src = write_float_checkpoint(tmp_path / "src", CONFIG)
    ckpt = quantize_checkpoint(src, tmp_path / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3]]
    params = SamplingParams(max_new_tokens=12)
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    single = generate(model, prompts, params)
    assert generate_tp(ckpt, prompts, params, tp=2, port=free_port()) == single


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_vocab_parallel_lm_head_equals_single_process(tmp_path, monkeypatch, tied):
    """ANYFP4_TP_LM_HEAD=vocab: each rank computes its rows of the logits (127 rows: slices of 64 and 63, as
    test_sharding checks), the all-gather puts them back in order; tied embeddings give each rank its rows of
    the embedding."""
    src = write_float_checkpoint(tmp_path / "src", dict(CONFIG, vocab_size=127, tie_word_embeddings=tied))
    ckpt = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(format=TargetFormat.NVFP4, progress=False)).dst
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3]]
    params = SamplingParams(max_new_tokens=12)
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    single = generate(model, prompts, params)
    monkeypatch.setenv("ANYFP4_TP_LM_HEAD", "vocab")
    assert generate_tp(ckpt, prompts, params, tp=2, port=free_port()) == single


@pytest.mark.slow
def test_cli_tp_on_smollm2(smollm2_bf16, tmp_path, capsys, monkeypatch):
    from anyfp4.cli import main

    ckpt = quantize_checkpoint(smollm2_bf16, tmp_path / "fp8", QuantizeOptions(format=TargetFormat.FP8,
                                                                                progress=False)).dst
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert main(["generate", str(ckpt), "--prompt", "What is the capital of France?", "--chat", "--tp", "3",
                 "--max-tokens", "12", "--device", "cpu", "--quiet"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_uneven_split_is_refused_before_spawning(tmp_path):
    src = write_float_checkpoint(tmp_path / "src", dict(CONFIG, num_key_value_heads=1))
    with pytest.raises(ValueError, match="1 key/value heads"):
        generate_tp(src, [[1, 2]], SamplingParams(max_new_tokens=2), tp=2, port=free_port())


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["mixed", "nvfp4", "fp8", "bf16"])
def test_a_hybrid_over_two_ranks_equals_one_process(tmp_path, fmt):
    """A Qwen3.5 hybrid: each rank keeps half the Gated DeltaNet key and value heads (q / k / v sections of
    in_proj_qkv and of the convolution split alike), half the attention heads; a left-padded batch decodes as in one
    process."""
    from helpers import save_random_qwen3_5, tiny_qwen3_5_config

    src = save_random_qwen3_5(tmp_path / "src", tiny_qwen3_5_config(max_position_embeddings=256))
    ckpt = src if fmt == "bf16" else quantize_checkpoint(
        src, tmp_path / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    prompts = [[5, 6, 7, 8, 9, 10, 11], [1, 2, 3]]
    params = SamplingParams(max_new_tokens=12)
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    single = generate(model, prompts, params)
    assert generate_tp(ckpt, prompts, params, tp=2, port=free_port()) == single


@pytest.mark.slow
def test_a_vision_language_checkpoints_text_model_over_two_ranks_equals_one_process(tmp_path):
    """The text model of a Qwen3.5 vision-language checkpoint (under model.language_model., a vision tower beside
    it): two ranks decode a left-padded batch as one process does."""
    import transformers as tf

    from helpers import tiny_qwen3_5_vision_language_config

    torch.manual_seed(0)
    tf.Qwen3_5ForConditionalGeneration(tiny_qwen3_5_vision_language_config()).to(torch.bfloat16).save_pretrained(
        str(tmp_path / "src"))
    ckpt = quantize_checkpoint(tmp_path / "src", tmp_path / "q", QuantizeOptions(format=TargetFormat.MIXED,
                                                                                 progress=False)).dst
    prompts, params = [[5, 6, 7, 8, 9, 10, 11], [1, 2, 3]], SamplingParams(max_new_tokens=8)
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    assert generate_tp(ckpt, prompts, params, tp=2, port=free_port()) == generate(model, prompts, params)


def test_a_hybrid_split_its_heads_do_not_divide_is_refused():
    from anyfp4.parallel.sharding import check_divisible
    from anyfp4.runtime.config import ModelArgs

    args = ModelArgs.from_hf({"model_type": "qwen3_5_text", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                              "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 1,
                              "linear_num_value_heads": 3, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                              "linear_conv_kernel_dim": 4})
    with pytest.raises(ValueError, match="1 Gated DeltaNet key heads, 3 Gated DeltaNet value heads"):
        check_divisible(args, 2)


@pytest.mark.slow
@pytest.mark.parametrize("arch, fmt", [("qwen3_moe", "nvfp4"), ("mixtral", "fp8")])
def test_a_mixture_of_experts_over_two_ranks_equals_one_process(tmp_path, arch, fmt):
    """Every expert's gate / up split by rows and down by columns, the router replicated: a left-padded batch
    decodes as in one process."""
    from helpers import save_random_moe

    src = save_random_moe(tmp_path / "src", arch)
    ckpt = quantize_checkpoint(src, tmp_path / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    prompts = [[5, 6, 7, 8, 9, 10, 11], [1, 2, 3]]
    params = SamplingParams(max_new_tokens=12)
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    single = generate(model, prompts, params)
    assert generate_tp(ckpt, prompts, params, tp=2, port=free_port()) == single
