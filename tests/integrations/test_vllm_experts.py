"""The vLLM plugin's expert layers against vLLM's CPU build (run by `.ci/vllm`; skipped where vLLM is not installed):
tiny random Qwen3-MoE and Mixtral checkpoints quantized by anyfp4 give vLLM the greedy tokens of anyfp4's runner, a
tensor-parallel rank's loaders keep its rows / columns of each expert, and bad expert tensors are refused by name."""

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from helpers import save_random_moe, to_compressed_tensors  # noqa: E402

from anyfp4.checkpoint.quant_config import WeightFormat  # noqa: E402
from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint  # noqa: E402
from anyfp4.integrations import vllm as plugin  # noqa: E402
from anyfp4.integrations import vllm_experts  # noqa: E402

PROMPT = [5, 17, 42, 7, 99, 3, 64, 12]


@pytest.fixture(scope="module")
def moe_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_moe")
    out = {}
    for arch in ("qwen3_moe", "mixtral"):
        src = save_random_moe(root / arch, arch)
        for fmt in ("nvfp4", "fp8", "mixed"):
            out[arch, fmt] = quantize_checkpoint(src, root / f"{arch}-{fmt}", QuantizeOptions(
                format=TargetFormat(fmt), progress=False)).dst
    out["qwen3_moe", "ct-nvfp4"] = to_compressed_tensors(Path(out["qwen3_moe", "nvfp4"]), root / "ct-nvfp4")
    return out


def anyfp4_greedy(ckpt, prompt, n):
    from anyfp4.runtime.generate import SamplingParams, generate
    from anyfp4.runtime.loader import load_model

    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    return generate(model, [prompt], SamplingParams(max_new_tokens=n))[0]


def vllm_greedy(ckpt, prompts, n):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(ckpt), quantization="anyfp4", dtype="float32", skip_tokenizer_init=True, enforce_eager=True,
              max_model_len=128, max_num_seqs=4, seed=0, kv_cache_memory_bytes=64 * 1024**2)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=n, detokenize=False))
    del llm
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("arch, fmt", [("qwen3_moe", "nvfp4"), ("qwen3_moe", "fp8"), ("qwen3_moe", "mixed"),
                                       ("qwen3_moe", "ct-nvfp4"), ("mixtral", "nvfp4"), ("mixtral", "fp8")])
def test_vllm_runs_the_experts_as_the_runner_does(moe_checkpoints, arch, fmt):
    plugin.register()
    before = dict(vllm_experts.APPLY_CALLS)
    ckpt = moe_checkpoints[arch, fmt]
    other = [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 13]
    alone, together = vllm_greedy(ckpt, [PROMPT], 12)[0], vllm_greedy(ckpt, [PROMPT, other], 12)
    assert alone == anyfp4_greedy(ckpt, PROMPT, 12)
    assert together[0] == alone and together[1] == anyfp4_greedy(ckpt, other, 12)
    ran = {k: vllm_experts.APPLY_CALLS[k] - before[k] for k in before}
    expert_format = "fp8" if fmt == "fp8" else "nvfp4"  # mixed: NVFP4 experts
    assert ran[expert_format] > 0 and ran["fp8" if expert_format == "nvfp4" else "nvfp4"] == 0, ran


class StandInExperts(torch.nn.Module):
    """vLLM's expert layer as the method sees it: its MoE config (a tensor-parallel rank) and nothing else."""

    def __init__(self, config, rank: int, tp: int):
        super().__init__()
        from types import SimpleNamespace

        parallel = SimpleNamespace(tp_rank=rank, tp_size=tp)
        self.moe_config = SimpleNamespace(num_experts=config.num_experts, moe_parallel_config=parallel,
                                          has_bias=False, activation="silu", is_act_and_mul=True,
                                          in_dtype=torch.float32)
        self.use_ep = False


def expert_layer(ckpt: Path, fmt: WeightFormat, rank: int, tp: int, drop: str | None = None,
                 replace: dict | None = None):
    """Layer 0's experts of ``ckpt`` loaded as rank ``rank`` of ``tp`` through the method's own loaders (without the
    tensor ``drop``, with the tensors of ``replace`` in place of the checkpoint's)."""
    import json

    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    config = json.loads((Path(ckpt) / "config.json").read_text())
    cfg = plugin.AnyFP4Config.from_config(config["quantization_config"])
    prefix = "model.layers.0.mlp.experts"
    experts = config.get("num_experts") or config["num_local_experts"]
    shape = type("Shape", (), dict(num_experts=experts))
    layer = StandInExperts(shape, rank, tp)
    method = vllm_experts.AnyFP4ExpertsMethod(cfg, fmt, prefix, layer.moe_config)
    inter, hidden = config["moe_intermediate_size"], config["hidden_size"]
    method.create_weights(layer, experts, hidden, inter // tp, torch.float32, global_num_experts=experts)
    shards = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    for name, t in tensors.items():
        if not name.startswith(prefix + ".") or name == drop:
            continue
        t = (replace or {}).get(name, t)
        e, part, suffix = name[len(prefix) + 1:].split(".", 2)
        param = getattr(layer, f"{'w2' if part == 'down_proj' else 'w13'}_{suffix}")
        param.weight_loader(param=param, loaded_weight=t, weight_name=name, shard_id=shards[part],
                            expert_id=int(e), return_success=True)
    method.process_weights_after_loading(layer)
    return method, layer


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_tensor_parallel_ranks_sum_to_one_rank(moe_checkpoints, fmt):
    """Two ranks' expert layers (each its rows of gate / up and columns of down) add up to the one-rank layer's
    output, for the same routing; poisoned outputs cannot pass."""
    wfmt = WeightFormat(fmt)
    ckpt = moe_checkpoints["qwen3_moe", fmt]
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[0, 3], [7, 1], [2, 2], [5, 6], [4, 0]], dtype=torch.int32)
    weights = torch.rand(5, 2, generator=torch.Generator().manual_seed(2))
    method, layer = expert_layer(ckpt, wfmt, 0, 1)
    whole = method.apply(layer, x, weights, ids)
    assert torch.isfinite(whole).all() and whole.abs().max() > 0
    parts = [method.apply(layer_r, x, weights, ids) for method, layer_r in
             (expert_layer(ckpt, wfmt, r, 2) for r in range(2))]
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(parts[0], whole, rtol=1e-2, atol=1e-2)


def test_a_missing_expert_tensor_is_named(moe_checkpoints):
    ckpt = moe_checkpoints["qwen3_moe", "nvfp4"]
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.5\.up has no w13_weight_scale "):
        expert_layer(ckpt, WeightFormat.NVFP4, 0, 1, drop="model.layers.0.mlp.experts.5.up_proj.weight_scale")


def test_expert_tensors_of_another_shape_are_refused_by_name(moe_checkpoints):
    ckpt = moe_checkpoints["qwen3_moe", "fp8"]
    method, layer = expert_layer(ckpt, WeightFormat.FP8, 0, 1)
    method.create_weights(layer, 8, 128, 128, torch.float32, global_num_experts=8)
    with pytest.raises(ValueError, match=r"experts\.2\.down \(w2_weight\) is \(128, 64\)"):
        layer.w2_weight.weight_loader(param=layer.w2_weight, loaded_weight=torch.zeros(128, 64,
                                      dtype=torch.float8_e4m3fn), weight_name="w2_weight", shard_id="w2", expert_id=2)


def test_experts_of_mixed_formats_and_expert_parallelism_are_refused(moe_checkpoints):
    cfg = plugin.AnyFP4Config.from_config({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                           "quantized_layers": {"model.layers.0.mlp.experts.0.gate_proj":
                                                                {"quant_algo": "FP8"},
                                                                "model.layers.0.mlp.experts.1.gate_proj":
                                                                {"quant_algo": "NVFP4"}}})
    with pytest.raises(ValueError, match=r"the experts of model\.layers\.0\.mlp\.experts have different formats"):
        cfg.experts_format("model.layers.0.mlp.experts", 2)
    layer = StandInExperts(type("Shape", (), dict(num_experts=8)), 0, 1)
    method = vllm_experts.AnyFP4ExpertsMethod(cfg, WeightFormat.NVFP4, "model.layers.0.mlp.experts", layer.moe_config)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts: expert parallelism"):
        method.create_weights(layer, 4, 128, 128, torch.float32, global_num_experts=8)


def test_a_scale_that_is_not_positive_and_finite_is_named(moe_checkpoints):
    name = "model.layers.0.mlp.experts.3.down_proj.weight_scale"
    with pytest.raises(ValueError, match=r"experts\.3: the down w2_weight_scale must be positive and finite"):
        expert_layer(moe_checkpoints["qwen3_moe", "fp8"], WeightFormat.FP8, 0, 1, replace={name: torch.tensor(0.0)})
    name = "model.layers.0.mlp.experts.6.up_proj.weight_scale_2"
    with pytest.raises(ValueError, match=r"experts\.6: the gate / up w13_weight_scale_2 must be positive"):
        expert_layer(moe_checkpoints["qwen3_moe", "nvfp4"], WeightFormat.NVFP4, 0, 1,
                     replace={name: torch.tensor(float("nan"))})
