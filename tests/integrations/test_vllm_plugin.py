"""The vLLM plugin against vLLM's CPU build (run by `.ci/vllm` in its own virtual environment; skipped where
vLLM is not installed): registration, end-to-end greedy generation equal to anyfp4's own runner for NVFP4,
FP8 and mixed checkpoints, the same greedy tokens for a prompt alone and inside a batch, the config through
vLLM's engine process, tensor-parallel shards of the weight loaders, and clear refusals."""

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from helpers import TINY_LLAMA, to_compressed_tensors, write_float_checkpoint  # noqa: E402

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint  # noqa: E402
from anyfp4.integrations import vllm as plugin  # noqa: E402

CONFIG = dict(TINY_LLAMA, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64, intermediate_size=128)


def test_register_is_idempotent_and_claims_only_when_asked(tmp_path, monkeypatch):
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    plugin.register()
    plugin.register()
    assert QUANTIZATION_METHODS.count("anyfp4") == 1
    assert get_quantization_config("anyfp4") is plugin.AnyFP4Config
    cfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]}
    assert plugin.AnyFP4Config.override_quantization_method(cfg, "anyfp4") == "anyfp4"
    monkeypatch.delenv("ANYFP4_VLLM_AUTO", raising=False)
    assert plugin.AnyFP4Config.override_quantization_method(cfg, None) is None  # vLLM's own modelopt stays
    assert plugin.AnyFP4Config.override_quantization_method(cfg, "modelopt") is None
    monkeypatch.setenv("ANYFP4_VLLM_AUTO", "1")
    assert plugin.AnyFP4Config.override_quantization_method(cfg, None) == "anyfp4"  # no FP4 tensor cores here
    assert plugin.AnyFP4Config.override_quantization_method({"quant_method": "gptq"}, None) is None
    with pytest.raises(ValueError, match="anyfp4 cannot serve this checkpoint: unsupported quant_method 'gptq'"):
        plugin.AnyFP4Config.override_quantization_method({"quant_method": "gptq"}, "anyfp4")


def test_fused_parts_must_agree():
    from anyfp4.checkpoint.quant_config import WeightFormat

    cfg = plugin.AnyFP4Config.from_config({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                           "quantized_layers": {"model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"},
                                                                "model.layers.0.self_attn.k_proj": {"quant_algo": "NVFP4"},
                                                                "model.layers.0.self_attn.v_proj": {"quant_algo": "FP8"},
                                                                "model.layers.0.mlp.gate_proj": {"quant_algo": "NVFP4"},
                                                                "model.layers.0.mlp.up_proj": {"quant_algo": "NVFP4"}}})
    assert cfg.format_of("model.layers.0.mlp.gate_up_proj") is WeightFormat.NVFP4
    assert cfg.format_of("model.layers.0.mlp.down_proj") is WeightFormat.NONE
    with pytest.raises(ValueError, match="qkv_proj .* different formats"):
        cfg.format_of("model.layers.0.self_attn.qkv_proj")


def anyfp4_greedy(ckpt, prompt, n, dtype=torch.float32):
    from anyfp4.runtime.generate import SamplingParams, generate
    from anyfp4.runtime.loader import load_model

    model, _ = load_model(ckpt, "cpu", dtype, progress=False)
    return generate(model, [prompt], SamplingParams(max_new_tokens=n))[0]


def runner_logits(ckpt, tokens, dtype):
    """The runner's logits (float32) after each of ``tokens``, one pass."""
    from anyfp4.runtime.loader import load_model

    model, _ = load_model(ckpt, "cpu", dtype, progress=False)
    model.setup_caches(1, len(tokens) + 8)
    with torch.no_grad():
        return model(torch.tensor([tokens]), torch.arange(len(tokens)))[0].float()


def vision_stub_if_needed():
    """vLLM's Qwen3.5 imports its Qwen3-VL code, which imports torchvision at module level (through transformers);
    this environment has none that loads against CPU torch. Text-only models never call it: a stand-in module
    (tests/support/stubs) lets the import through."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        stubs = str(Path(__file__).resolve().parents[1] / "support" / "stubs")
        sys.path.insert(0, stubs)
        # vLLM inspects a model's architecture in a subprocess (no cached result on a fresh machine): it needs them too
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (stubs, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory):
    """A tiny Qwen3.5 hybrid (vLLM's CPU Gated DeltaNet kernel wants heads of 128 and bf16), bf16 and quantized."""
    from helpers import save_random_qwen3_5, tiny_qwen3_5_config

    root = tmp_path_factory.mktemp("vllm_hybrid")
    config = tiny_qwen3_5_config(128, head_dim=64, linear_key_head_dim=128, linear_value_head_dim=128,
                                 max_position_embeddings=256)
    src = save_random_qwen3_5(root / "src", config)
    out = {fmt: quantize_checkpoint(src, root / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
           for fmt in ("mixed", "nvfp4", "fp8")}
    out["bf16"] = src
    return out


@pytest.mark.parametrize("fmt", ["mixed", "nvfp4", "fp8"])
def test_vllm_serves_a_qwen3_5_hybrid_as_the_runner_does(hybrids, fmt):
    """vLLM's own Qwen3.5 (its CPU Gated DeltaNet kernels, bf16) with the plugin's linears — the fused in_proj_qkvz of
    the checkpoint's in_proj_qkv / in_proj_z, in_proj_ba left in bf16 — gives the greedy tokens of anyfp4's runner."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    vision_stub_if_needed()
    plugin.register()
    before = dict(plugin.APPLY_CALLS)
    prompt = [5, 17, 42, 7, 99, 3, 64, 12]
    llm = LLM(model=str(hybrids[fmt]), quantization="anyfp4", dtype="bfloat16", skip_tokenizer_init=True,
              enforce_eager=True, max_model_len=128, max_num_seqs=4, seed=0, kv_cache_memory_bytes=64 * 1024**2)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(temperature=0.0, max_tokens=12,
                                                                             detokenize=False))
    tokens = list(out[0].outputs[0].token_ids)
    del llm
    runner = anyfp4_greedy(hybrids[fmt], prompt, 12, torch.bfloat16)
    if tokens != runner:  # vLLM's Gated DeltaNet kernels round otherwise than the runner's (bf16): where the runner's
        # two best logits are a rounding apart, greedy may part there (seen: 1 bf16 ulp, 0.004 of a spread of 0.22)
        first = next(i for i, (a, b) in enumerate(zip(tokens, runner)) if a != b)
        logits = runner_logits(hybrids[fmt], prompt + runner[:first], torch.bfloat16)[-1]
        gap = (logits.max() - logits[tokens[first]]).item()
        assert gap <= 0.05 * logits.std().item() and first >= 4, (first, gap, tokens, runner)
    ran = {k: plugin.APPLY_CALLS[k] - before[k] for k in before}
    assert (ran["nvfp4"] > 0) == (fmt != "fp8") and (ran["fp8"] > 0) == (fmt != "nvfp4"), ran


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    src = write_float_checkpoint(root / "src", CONFIG)
    out = {fmt: quantize_checkpoint(src, root / fmt, QuantizeOptions(format=TargetFormat(fmt), progress=False)).dst
           for fmt in ("nvfp4", "fp8", "mixed")}
    out["ct-nvfp4"] = to_compressed_tensors(Path(out["nvfp4"]), root / "ct-nvfp4")
    out["bf16"] = src
    return out


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed", "ct-nvfp4"])
def test_vllm_generates_what_the_anyfp4_runner_generates(checkpoints, fmt):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    plugin.register()
    before = dict(plugin.APPLY_CALLS)
    prompt = [5, 17, 42, 7, 99, 3, 64, 12]
    llm = LLM(model=str(checkpoints[fmt]), quantization="anyfp4", dtype="float32", skip_tokenizer_init=True,
              enforce_eager=True, max_model_len=128, max_num_seqs=4, seed=0,
              kv_cache_memory_bytes=64 * 1024**2)  # explicit: a share of host memory depends on the machine
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(temperature=0.0, max_tokens=12,
                                                                             detokenize=False))
    tokens = list(out[0].outputs[0].token_ids)
    del llm
    assert tokens == anyfp4_greedy(checkpoints[fmt], prompt, 12)
    ran = {k: plugin.APPLY_CALLS[k] - before[k] for k in before}
    assert ran["fp8" if fmt == "fp8" else "nvfp4"] > 0, ran
    if fmt == "mixed":
        assert ran["fp8"] > 0 and ran["nvfp4"] > 0


def test_config_pickles_for_the_engine_process():
    """vLLM (with multiprocessing, its default) pickles the quantization config to its engine process."""
    import pickle

    from anyfp4.checkpoint.quant_config import WeightFormat

    cfg = plugin.AnyFP4Config.from_config({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                           "quantized_layers": {"model.layers.0.mlp.down_proj": {"quant_algo": "FP8"}}})
    back = pickle.loads(pickle.dumps(cfg))
    assert back.scheme == cfg.scheme and back.format_of("model.layers.0.mlp.down_proj") is WeightFormat.FP8


def test_engine_process_serves_the_plugin(checkpoints, monkeypatch):
    """vLLM's default engine in its own process (spawned): the plugin's config reaches it and generates what the
    in-process engine generates."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = LLM(model=str(checkpoints["nvfp4"]), quantization="anyfp4", dtype="float32", skip_tokenizer_init=True,
              enforce_eager=True, max_model_len=128, max_num_seqs=4, seed=0, kv_cache_memory_bytes=64 * 1024**2)
    prompt = [5, 17, 42, 7, 99, 3, 64, 12]
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(temperature=0.0, max_tokens=12,
                                                                             detokenize=False))
    tokens = list(out[0].outputs[0].token_ids)
    llm.llm_engine.engine_core.shutdown()
    del llm
    assert tokens == anyfp4_greedy(checkpoints["nvfp4"], prompt, 12)


PROMPTS = [[5, 17, 42, 7, 99, 3, 64, 12], [9, 8], [100, 3, 77, 21, 4], [33] * 11,
           [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [60, 61, 62]]


def greedy_alone_and_batched(path, quantization):
    """Greedy tokens and their logprobs (compared bit for bit: a token rarely flips where the logits' last bits
    do) of every prompt sent alone, and of all of them sent at once (bfloat16, as vLLM runs on the CPU; no
    prefix caching, so a prompt alone computes its own prefill)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(path), quantization=quantization, dtype="bfloat16", skip_tokenizer_init=True,
              enforce_eager=True, enable_prefix_caching=False, max_model_len=128, max_num_seqs=len(PROMPTS),
              seed=0, kv_cache_memory_bytes=64 * 1024**2)
    params = SamplingParams(temperature=0.0, max_tokens=16, detokenize=False, ignore_eos=True, logprobs=0)

    def result(out):
        c = out.outputs[0]
        return list(c.token_ids), [step[t].logprob for t, step in zip(c.token_ids, c.logprobs)]

    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    batched = [result(o) for o in llm.generate(prompts, params, use_tqdm=False)]
    alone = [result(llm.generate([p], params, use_tqdm=False)[0]) for p in prompts]
    del llm
    return alone, batched


@pytest.fixture(scope="module")
def bf16_batch_invariant(checkpoints):
    """Which prompts vLLM's own bfloat16 model (its linears, attention, norms) keeps batch invariant."""
    alone, batched = greedy_alone_and_batched(checkpoints["bf16"], None)
    return [a == b for a, b in zip(alone, batched)]


@pytest.mark.parametrize("mode", ["c", "reference"])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_greedy_tokens_alone_equal_batched(checkpoints, bf16_batch_invariant, monkeypatch, fmt, mode):
    """A prompt's greedy tokens and logprobs do not depend on the other prompts of the batch, with either CPU
    kernel choice: the plugin's linears give a row the same bits in any batch (tests/ops/test_batch_invariance.py).
    Asserted for the prompts where vLLM's bfloat16 model holds it too (the parts around the linears are vLLM's;
    with vLLM 0.32's CPU build it holds for every prompt here)."""
    from anyfp4.kernels.cpu.linear import library

    monkeypatch.setenv("ANYFP4_CPU_KERNELS", mode)
    if mode == "c" and library() is None:
        pytest.skip("no C compiler builds the CPU kernels")
    plugin.register()
    alone, batched = greedy_alone_and_batched(checkpoints[fmt], "anyfp4")
    held = [i for i, ok in enumerate(bf16_batch_invariant) if ok]
    assert held, "vLLM's own bfloat16 model changed every prompt's tokens in the batch"
    assert [alone[i] for i in held] == [batched[i] for i in held]


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_tensor_parallel_shards_reassemble(checkpoints, fmt, monkeypatch):
    """World size 2 emulated: each rank's parameters are filled by vLLM's own loaders from the full
    checkpoint tensors; column-parallel outputs concatenate and row-parallel outputs sum to the
    single-rank result."""
    import vllm.model_executor.parameter as vparam
    from safetensors.torch import load_file

    from anyfp4.checkpoint.quant_config import WeightFormat

    ckpt = checkpoints[fmt]
    tensors = {}
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    cfg = plugin.AnyFP4Config.from_config(__import__("json").loads((Path(ckpt) / "config.json").read_text())
                                          ["quantization_config"])
    wfmt = WeightFormat.NVFP4 if fmt == "nvfp4" else WeightFormat.FP8
    names = {"weight": "weight", "scale": "weight_scale", "global": "weight_scale_2", "input": "input_scale"}
    h, inter = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    x = torch.randn(3, h)

    def build(prefix, parts, k, rank, tp, column):
        monkeypatch.setattr(vparam, "get_tensor_model_parallel_rank", lambda: rank)
        monkeypatch.setattr(vparam, "get_tensor_model_parallel_world_size", lambda: tp)
        layer = torch.nn.Module()
        method = plugin.AnyFP4LinearMethod(cfg, wfmt, prefix)
        sizes = [tensors[f"{prefix}.{p}.weight"].shape[0] // (tp if column else 1) for p in parts]
        method.create_weights(layer, k // (1 if column else tp), sizes, k, sum(sizes), torch.float32,
                              weight_loader=None)
        offset = 0
        for i, p in enumerate(parts):
            for key, name in names.items():
                full = tensors.get(f"{prefix}.{p}.{name}")
                param = getattr(layer, name, None)
                if full is None or param is None:
                    continue
                if isinstance(param, vparam.PerTensorScaleParameter):
                    param.data[i] = full.reshape(())
                elif column:
                    param.load_merged_column_weight(full, shard_offset=offset, shard_size=sizes[i])
                else:
                    param.load_row_parallel_weight(full)
            offset += sizes[i]
        method.process_weights_after_loading(layer)
        return lambda inp: method.apply(layer, inp)

    gate_up = "model.layers.0.mlp"
    full = build(gate_up, ["gate_proj", "up_proj"], h, 0, 1, True)(x)
    shards = [build(gate_up, ["gate_proj", "up_proj"], h, r, 2, True)(x) for r in range(2)]
    g = inter // 2
    assert torch.equal(torch.cat([shards[0][:, :g], shards[1][:, :g], shards[0][:, g:], shards[1][:, g:]], -1), full)
    xd = torch.randn(3, inter)
    down_full = build(gate_up, ["down_proj"], inter, 0, 1, False)(xd)
    down = [build(gate_up, ["down_proj"], inter, r, 2, False)(xd[:, r * g:(r + 1) * g]) for r in range(2)]
    torch.testing.assert_close(down[0] + down[1], down_full, rtol=1e-5, atol=1e-5)


def test_parts_with_different_global_scales_stay_exact(monkeypatch):
    """q/k/v (or gate/up) shards whose NVFP4 global scales differ: one prepack per run of equal scales,
    each part exactly its own dequantized weight."""
    import vllm.model_executor.parameter as vparam

    from anyfp4.checkpoint.quant_config import WeightFormat
    from anyfp4.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4

    monkeypatch.setattr(vparam, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(vparam, "get_tensor_model_parallel_world_size", lambda: 1)
    cfg = plugin.AnyFP4Config.from_config({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": []})
    method = plugin.AnyFP4LinearMethod(cfg, WeightFormat.NVFP4, "model.layers.0.self_attn.qkv_proj")
    g = torch.Generator().manual_seed(0)
    parts = [quantize_nvfp4(torch.randn(n, 64, generator=g) * s) for n, s in ((32, 1.0), (16, 3.0), (16, 3.0))]
    layer = torch.nn.Module()
    method.create_weights(layer, 64, [32, 16, 16], 64, 64, torch.float32, weight_loader=None)
    offset = 0
    for i, q in enumerate(parts):
        layer.weight.data[offset:offset + q.packed.shape[0]] = q.packed
        layer.weight_scale.data[offset:offset + q.packed.shape[0]] = q.block_scale
        layer.weight_scale_2.data[i] = q.global_scale
        offset += q.packed.shape[0]
    method.process_weights_after_loading(layer)
    assert len(layer.anyfp4_prepacks) == (2 if torch.equal(parts[1].global_scale, parts[2].global_scale) else 3)
    x = torch.randn(5, 64, generator=g)
    ref = torch.cat([x @ dequantize_nvfp4(q).t() for q in parts], -1)
    torch.testing.assert_close(method.apply(layer, x), ref, rtol=1e-5, atol=1e-5)
