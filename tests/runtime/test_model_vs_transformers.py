"""The runner's decoder against transformers on the same (dequantized) weights, CPU, float32.

Teacher-forced: one forward pass over a fixed token sequence; top-1 agreement and logits.
"""

import pytest
import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.loader import load_model
from helpers import (MOE_CLASSES, copy_expert_weights, tiny_moe_config, tiny_qwen3_5_config,
                     tiny_qwen3_5_vision_language_config)

# float32 on the CPU: the same operations as transformers, so the logits agree to rounding noise.
LOGIT_ATOL = 1e-3


def reference_logits(hf_class, float_ckpt, reader, ids, dtype=torch.float32, device="cpu"):
    hf = hf_class.from_pretrained(str(float_ckpt), dtype=torch.float32)
    sd = hf.state_dict()
    with torch.no_grad():
        for layer in reader.layers:
            key = layer.name.replace(".block_sparse_moe.", ".mlp.") + ".weight"  # Mixtral's router
            if key in sd:
                sd[key].copy_(reader.dequantize(layer))
            else:
                copy_expert_weights(sd, layer.name, reader.dequantize(layer))
        hf = hf.to(device=device, dtype=dtype)
        return hf(ids.to(device)).logits.float().cpu()


def compare(hf_class, float_ckpt, ckpt, ids, min_top1=0.99):
    model, reader = load_model(ckpt, "cpu", torch.float32, progress=False)
    model.setup_caches(1, ids.shape[1])
    with torch.no_grad():
        logits = model(ids, torch.arange(ids.shape[1]))
    ref = reference_logits(hf_class, float_ckpt, reader, ids)
    top1 = (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert top1 >= min_top1, top1
    assert (logits - ref).abs().max().item() <= LOGIT_ATOL
    return logits


def smollm2_case(smollm2_bf16, tmp_path, fmt):
    """SmolLM2 quantized to ``fmt`` and 256 tokens of English to teacher-force it with."""
    from transformers import AutoTokenizer

    ckpt = quantize_checkpoint(smollm2_bf16, tmp_path / fmt, QuantizeOptions(format=TargetFormat(fmt),
                                                                              progress=False)).dst
    tok = AutoTokenizer.from_pretrained(str(smollm2_bf16))
    text = ("Quantization stores each weight in fewer bits. A 4-bit weight with a shared scale per block of "
            "sixteen keeps most of the information, and the model still answers questions. ") * 8
    ids = tok(text, return_tensors="pt").input_ids[:, :256]
    assert ids.shape[1] == 256
    return ckpt, ids


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed"])
def test_smollm2_teacher_forced(smollm2_bf16, tmp_path, fmt):
    from transformers import LlamaForCausalLM

    ckpt, ids = smollm2_case(smollm2_bf16, tmp_path, fmt)
    compare(LlamaForCausalLM, smollm2_bf16, ckpt, ids)


def random_hf_checkpoint(tmp_path, hf_class, config):
    torch.manual_seed(0)
    model = hf_class(config)
    with torch.no_grad():  # norms, decay rates and biases off their initial values (zero-centered norms start at 0)
        for name, t in model.named_parameters():
            if t.dim() == 1:
                t.add_(0.3 * torch.randn_like(t))
    model.to(torch.bfloat16).save_pretrained(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("arch", ["llama3", "qwen2", "qwen3", "mistral", "qwen3_5", "qwen3_5_vision_language",
                                  "qwen3_moe", "mixtral"])
def test_architectures_match_transformers(tmp_path, arch):
    import transformers as tf

    common = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, tie_word_embeddings=False)
    if arch == "llama3":
        cls, config = tf.LlamaForCausalLM, tf.LlamaConfig(**common, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}, rope_theta=500000.0)
    elif arch == "qwen2":
        cls, config = tf.Qwen2ForCausalLM, tf.Qwen2Config(**common)
    elif arch == "qwen3":
        cls, config = tf.Qwen3ForCausalLM, tf.Qwen3Config(**common, head_dim=32)
    elif arch == "qwen3_5":  # a hybrid: Gated DeltaNet in three of four layers, gated attention with partial RoPE
        cls, config = tf.Qwen3_5ForCausalLM, tiny_qwen3_5_config(max_position_embeddings=256)
    elif arch == "qwen3_5_vision_language":  # the same text model under model.language_model, beside a vision tower
        cls, config = tf.Qwen3_5ForConditionalGeneration, tiny_qwen3_5_vision_language_config()
    elif arch in MOE_CLASSES:  # mixtures of experts (Qwen3-MoE with a dense layer among them)
        cls, config = getattr(tf, MOE_CLASSES[arch]), tiny_moe_config(arch)
    else:
        cls, config = tf.MistralForCausalLM, tf.MistralConfig(**common)
    config.architectures = [cls.__name__]
    src = random_hf_checkpoint(tmp_path / "src", cls, config)
    ids = torch.randint(0, 512, (1, 160), generator=torch.Generator().manual_seed(1))
    compare(cls, src, src, ids, min_top1=1.0)  # the float checkpoint itself
    q = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(format=TargetFormat.MIXED, progress=False)).dst
    compare(cls, src, q, ids, min_top1=1.0)


def test_a_hybrids_decode_steps_follow_its_prefill(tmp_path):
    """Qwen3.5 hybrid: a prefill (chunked Gated DeltaNet) then token-by-token steps from its states and caches give
    the logits of one pass over the whole sequence; a new setup_caches starts from empty states."""
    import transformers as tf

    config = tiny_qwen3_5_config()
    src = random_hf_checkpoint(tmp_path, tf.Qwen3_5ForCausalLM, config)
    model, _ = load_model(src, "cpu", torch.float32, progress=False)
    ids = torch.randint(0, 512, (1, 48), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for _ in range(2):  # the second time from a fresh setup_caches
            model.setup_caches(1, 64)
            whole = model(ids, torch.arange(48))
            model.setup_caches(1, 64)
            steps = [model(ids[:, :40], torch.arange(40))]
            steps += [model(ids[:, i:i + 1], torch.tensor([i])) for i in range(40, 48)]
            stepped = torch.cat(steps, 1)
            assert torch.equal(stepped.argmax(-1), whole.argmax(-1))
            assert (stepped - whole).abs().max().item() <= LOGIT_ATOL


# On a GPU in fp16 / bf16 the runner's kernels (not the reference) run: activations are rounded to fp16 /
# bf16 between operations, so the logits move away from the float32 reference by about as much as
# transformers' own model moves in that dtype on the same weights. The bound: no more than twice that.
GPU_MIN_TOP1 = 0.97


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed"])
def test_smollm2_teacher_forced_on_gpu(smollm2_bf16, tmp_path, fmt, dtype):
    from transformers import LlamaForCausalLM

    ckpt, ids = smollm2_case(smollm2_bf16, tmp_path, fmt)
    model, reader = load_model(ckpt, "cuda", dtype, progress=False)
    model.setup_caches(1, 256)
    logits = []
    with torch.no_grad():  # prefill half, then token by token: both the prefill and the decode kernels run
        logits.append(model(ids[:, :128].cuda(), torch.arange(128, device="cuda")).float().cpu())
        for i in range(128, 256):
            logits.append(model(ids[:, i:i + 1].cuda(), torch.tensor([i], device="cuda")).float().cpu())
    logits = torch.cat(logits, dim=1)
    ref = reference_logits(LlamaForCausalLM, smollm2_bf16, reader, ids)
    theirs = reference_logits(LlamaForCausalLM, smollm2_bf16, reader, ids, dtype, "cuda")
    top1 = (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert top1 >= GPU_MIN_TOP1, top1
    ours_err, their_err = (logits - ref).abs().max().item(), (theirs - ref).abs().max().item()
    assert ours_err <= 2 * their_err, (ours_err, their_err)


def test_a_hybrid_config_that_disagrees_with_its_tensors_names_the_layer(tmp_path):
    import json

    import transformers as tf

    from anyfp4.checkpoint.errors import CheckpointError
    from anyfp4.runtime.plan import plan_checkpoint

    config = tiny_qwen3_5_config(64, vocab_size=256)
    src = random_hf_checkpoint(tmp_path, tf.Qwen3_5ForCausalLM, config)
    plan_checkpoint(src)
    original = json.loads((src / "config.json").read_text())
    for edit, match in [({"layer_types": ["full_attention"] + original["layer_types"][1:]},
                         "model.layers.0.self_attn.q_proj"),
                        ({"linear_num_value_heads": 2}, "model.layers.0.linear_attn.in_proj_qkv is 128 x 64 but "
                                                        "config.json implies 96 x 64")]:
        (src / "config.json").write_text(json.dumps({**original, **edit}))
        with pytest.raises(CheckpointError, match=match):
            plan_checkpoint(src)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed"])
def test_a_quantized_hybrid_matches_transformers_on_256_positions(tmp_path, fmt):
    """A Qwen3.5 hybrid quantized by ``anyfp4 quantize`` to each format: greedy top-1 of 256 teacher-forced positions
    as transformers with the same dequantized weights (float32)."""
    import transformers as tf

    config = tiny_qwen3_5_config(max_position_embeddings=512)
    src = random_hf_checkpoint(tmp_path / "src", tf.Qwen3_5ForCausalLM, config)
    q = quantize_checkpoint(src, tmp_path / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    ids = torch.randint(0, 512, (1, 256), generator=torch.Generator().manual_seed(3))
    compare(tf.Qwen3_5ForCausalLM, src, q, ids, min_top1=0.99)


def test_a_hybrids_mtp_head_is_kept_and_left_unquantized(tmp_path, capsys):
    """mtp.* tensors (the multi-token-prediction head of a Qwen3.5 checkpoint) are tolerated by the plan, listed by
    inspect, and copied unquantized by quantize (as ModelOpt leaves them)."""
    import transformers as tf
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from anyfp4.cli import main
    from anyfp4.runtime.plan import plan_checkpoint

    config = tiny_qwen3_5_config(64, vocab_size=256)
    src = random_hf_checkpoint(tmp_path / "src", tf.Qwen3_5ForCausalLM, config)
    tensors = load_file(str(src / "model.safetensors"))
    tensors["mtp.fc.weight"] = torch.randn(64, 128).to(torch.bfloat16)
    tensors["mtp.norm.weight"] = torch.zeros(64, dtype=torch.bfloat16)
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    plan_checkpoint(src)
    q = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(format=TargetFormat.NVFP4, progress=False)).dst
    with safe_open(str(q / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("mtp.fc.weight"), tensors["mtp.fc.weight"])
        assert "mtp.fc.weight_scale" not in f.keys()
    assert main(["inspect", str(q)]) == 0
    assert "2 mtp.* tensors stored (drafts for --speculate mtp)" in capsys.readouterr().out


def test_a_vision_language_checkpoint_runs_as_its_text_model_alone(tmp_path, capsys):
    """A Qwen3_5ForConditionalGeneration checkpoint: quantize leaves its vision tower unquantized, inspect calls it
    valid, runs it as the text model and counts only the text model's bytes per token, and its logits equal, bit for
    bit, those of a Qwen3_5ForCausalLM checkpoint of the same text weights (the twin)."""
    import json

    import transformers as tf
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from anyfp4.checkpoint.inspection import inspect_checkpoint
    from anyfp4.cli import main

    vl = random_hf_checkpoint(tmp_path / "vl", tf.Qwen3_5ForConditionalGeneration,
                              tiny_qwen3_5_vision_language_config(64, vocab_size=256))
    text = {n.replace("model.language_model.", "model."): t for n, t in load_file(str(vl / "model.safetensors")).items()
            if not n.startswith("model.visual.")}
    twin = tmp_path / "twin"
    twin.mkdir()
    save_file(text, str(twin / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((vl / "config.json").read_text())["text_config"]
    (twin / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3_5ForCausalLM"]}))
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(3))
    logits = []
    for src in (vl, twin):
        q = quantize_checkpoint(src, tmp_path / f"{src.name}_q", QuantizeOptions(format=TargetFormat.MIXED,
                                                                                 progress=False)).dst
        model, _ = load_model(q, "cpu", torch.float32, progress=False)
        model.setup_caches(1, ids.shape[1])
        with torch.no_grad():
            logits.append(model(ids, torch.arange(ids.shape[1])))
        report = inspect_checkpoint(q)
        assert report["valid"], report["error"]
        logits.append(report["bytes_per_token"])
    assert torch.equal(logits[0], logits[2]) and logits[1] == logits[3]
    with safe_open(str(tmp_path / "vl_q" / "model.safetensors"), "pt") as f:
        visual = [n for n in f.keys() if n.startswith("model.visual.")]
        assert visual and not any(n.endswith(("_scale", "_scale_2")) for n in visual)
    assert main(["inspect", str(tmp_path / "vl_q")]) == 0
    out = capsys.readouterr().out
    assert "decoder layers: 3 linear attention, 1 full attention" in out
    assert "Qwen3_5ForConditionalGeneration's text model (Qwen3_5ForCausalLM)" in " ".join(out.split())


@pytest.mark.parametrize("arch", list(MOE_CLASSES))
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed"])
def test_a_quantized_moe_matches_transformers_on_256_positions(tmp_path, arch, fmt):
    """A Qwen3-MoE / Mixtral checkpoint quantized by ``anyfp4 quantize`` (routers left in bf16): greedy top-1 of 256
    teacher-forced positions as transformers with the same dequantized weights (float32)."""
    import transformers as tf

    cls = getattr(tf, MOE_CLASSES[arch])
    src = random_hf_checkpoint(tmp_path / "src", cls, tiny_moe_config(arch))
    q = quantize_checkpoint(src, tmp_path / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
    ids = torch.randint(0, 512, (1, 256), generator=torch.Generator().manual_seed(4))
    compare(cls, src, q, ids, min_top1=0.99)
