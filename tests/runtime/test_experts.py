"""Mixture-of-experts models (Qwen3-MoE, Mixtral) in the runner, CPU: a row's bits alone and in a batch, the
capturable every-expert path against the eager picked-experts path, decode steps after a prefill, and the refusals
of configs and tensors that disagree."""

import json

import pytest
import torch

from anyfp4.checkpoint.errors import CheckpointError
from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.config import UnsupportedModelError
from anyfp4.runtime.experts import MixtureOfExperts, picked_experts
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from anyfp4.runtime.plan import plan_checkpoint
from helpers import MOE_CLASSES, edit_json, save_random_moe


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def nvfp4_moe(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    src = save_random_moe(root / "src", request.param)
    return quantize_checkpoint(src, root / "q", QuantizeOptions(format=TargetFormat.NVFP4, progress=False)).dst


def experts_of(model):
    return [blk.mlp for blk in model.blocks if isinstance(blk.mlp, MixtureOfExperts)]


def test_rows_alone_equal_rows_in_a_batch(nvfp4_moe):
    """Greedy texts of prompts of different lengths decoded together (left-padded) equal each alone: a row's
    routing, its experts' rows and its weighted sum do not depend on the other rows."""
    model, _ = load_model(nvfp4_moe, "cpu", torch.bfloat16, progress=False)
    prompts = [[5, 9, 2, 7, 1, 3, 8], [11, 4, 4], [42], [7, 7, 7, 7, 300, 2]]
    params = SamplingParams(max_new_tokens=10)
    together = generate(model, prompts, params)
    assert together == [generate(model, [p], params)[0] for p in prompts]
    picks = torch.cat([m.route(torch.randn(64, model.args.hidden_size, dtype=torch.bfloat16))[0].flatten()
                       for m in experts_of(model)])
    assert len(picks.unique()) == model.args.moe.experts  # the random router spreads rows over every expert


def test_the_capturable_path_gives_the_eager_bits(nvfp4_moe, monkeypatch):
    """What a CUDA graph or torch.compile runs (every expert over every row, unpicked ones weighted by zero) gives
    the bits of the eager path (each picked expert over its rows)."""
    model, _ = load_model(nvfp4_moe, "cpu", torch.bfloat16, progress=False)
    moe = experts_of(model)[0]
    x = torch.randn(2, 3, model.args.hidden_size, generator=torch.Generator().manual_seed(1)).bfloat16()
    eager = moe(x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert torch.equal(moe(x), eager) and eager.abs().amax() > 0


def test_decode_steps_follow_the_prefill(nvfp4_moe):
    model, _ = load_model(nvfp4_moe, "cpu", torch.float32, progress=False)
    ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.setup_caches(1, 32)
        whole = model(ids, torch.arange(24))
        model.setup_caches(1, 32)
        steps = [model(ids[:, :16], torch.arange(16))]
        steps += [model(ids[:, i:i + 1], torch.tensor([i])) for i in range(16, 24)]
    stepped = torch.cat(steps, 1)
    assert torch.equal(stepped.argmax(-1), whole.argmax(-1)) and (stepped - whole).abs().max().item() < 1e-3


@pytest.mark.parametrize("arch", list(MOE_CLASSES))
def test_config_and_experts_must_agree(tmp_path, arch):
    src = save_random_moe(tmp_path / "src", arch)
    key = "num_local_experts"  # transformers writes Qwen3-MoE's num_experts under this name too
    block = "block_sparse_moe" if arch == "mixtral" else "mlp"
    original = json.loads((src / "config.json").read_text())
    cases = [({key: 16}, CheckpointError, f"model.layers.0.{block}.gate is 8 x 128 but config.json implies 16 x 128"),
             ({key: 4}, CheckpointError, f"model.layers.0.{block}.gate is 8 x 128 but config.json implies 4 x 128"),
             ({"moe_intermediate_size" if arch == "qwen3_moe" else "intermediate_size": 64}, CheckpointError,
              f"model.layers.0.{block}.experts.0.{'gate_proj' if arch == 'qwen3_moe' else 'w1'} is 128 x 128 but "
              "config.json implies 64 x 128"),
             ({"num_experts_per_tok": 9}, CheckpointError, "'num_experts_per_tok' 9 exceeds the 8 experts"),
             ({"num_experts": 6}, CheckpointError, "'num_local_experts' 8 and 'num_experts' 6 disagree"),
             ({"n_shared_experts": 1}, UnsupportedModelError, "'n_shared_experts' = 1: .* not supported")]
    for edit, error, match in cases:
        (src / "config.json").write_text(json.dumps({**original, **edit}))
        with pytest.raises(error, match=match):
            plan_checkpoint(src)


def test_experts_stored_beyond_the_config_are_refused(tmp_path):
    """A checkpoint with an expert more than its router scores: config and weights describe different models."""
    from helpers import rewrite_tensors

    src = save_random_moe(tmp_path / "src", "mixtral")
    extra = "model.layers.2.block_sparse_moe.experts.8.w1.weight"
    rewrite_tensors(src, lambda t: t.update({extra: t["model.layers.2.block_sparse_moe.experts.7.w1.weight"].clone()}))
    with pytest.raises(CheckpointError, match=f"would not read, e.g. \\['{extra}'\\]"):
        plan_checkpoint(src)


def test_a_quantized_router_is_refused_by_name(tmp_path):
    src = save_random_moe(tmp_path / "src", "qwen3_moe")
    q = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(format=TargetFormat.NVFP4, progress=False,
                                                                  exclude=("lm_head", "*embed_tokens"))).dst
    with pytest.raises(CheckpointError, match="router model.layers.0.mlp.gate is stored nvfp4") as e:
        plan_checkpoint(q)
    assert e.value.tensor == "model.layers.0.mlp.gate.weight"


def test_other_mixtures_of_experts_are_refused(tmp_path):
    src = save_random_moe(tmp_path / "src", "qwen3_moe")
    edit_json(src / "config.json", lambda d: d.update(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"]))
    with pytest.raises(UnsupportedModelError, match="model_type 'qwen2_moe'"):
        plan_checkpoint(src)


def test_inspect_counts_the_experts_a_token_runs(nvfp4_moe):
    from anyfp4.checkpoint.inspection import inspect_checkpoint
    from anyfp4.checkpoint.reader import CheckpointReader

    report = inspect_checkpoint(nvfp4_moe, check_values=False)
    assert report["valid"] and report["experts"]["per_layer"] == 8 and report["experts"]["per_token"] == 2
    reader = CheckpointReader(nvfp4_moe)
    experts = [l for l in reader.layers if ".experts." in l.name]
    groups = {g["group"]: g["count"] for g in report["groups"] if ".experts.*." in g["group"]}
    assert len(groups) == 3 and sum(groups.values()) == len(experts)  # gate, up, down: one row each
    others = sum(l.weight_bytes for l in reader.layers if ".experts." not in l.name and l.format.value != "none"
                 and l.name != "lm_head")
    dense = sum(reader.index[l.tensors["weight"]].nbytes for l in reader.layers if l.format.value == "none"
                and "embed_tokens" not in l.name)
    embedding_row = reader.index["model.embed_tokens.weight"].nbytes // 512
    assert report["bytes_per_token"] == others + dense + embedding_row + sum(l.weight_bytes * 2 // 8 for l in experts)


def test_speculation_keeps_the_greedy_text(nvfp4_moe):
    """A verify pass routes each of its rows as a one-token step would: n-gram speculation's text is plain
    decoding's."""
    from anyfp4.runtime.speculative import generate_speculative

    model, _ = load_model(nvfp4_moe, "cpu", torch.bfloat16, progress=False)
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5] * 2
    params = SamplingParams(max_new_tokens=24)
    spec, stats = generate_speculative(model, prompt, params, 3)
    assert spec == generate(model, [prompt], params)[0] and stats.verify_steps >= 1


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "bf16"])
def test_stacked_experts_are_the_experts(tmp_path, fmt):
    """The stacks the GPU's grouped ops read: the experts' own buffers become views of them (no second copy), and
    the grouped ops' outputs (their pure-torch definitions here) are the picked experts' values."""
    from anyfp4.runtime.experts import StackedDenseExperts, StackedQuantizedExperts

    src = save_random_moe(tmp_path / "src", "qwen3_moe" if fmt != "bf16" else "mixtral")
    ckpt = src if fmt == "bf16" else quantize_checkpoint(src, tmp_path / fmt, QuantizeOptions(
        format=TargetFormat(fmt), progress=False)).dst
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    moe = experts_of(model)[0]
    x = torch.randn(4, model.args.hidden_size, generator=torch.Generator().manual_seed(3))
    ids, _ = moe.route(x)
    picked = picked_experts(moe.experts, x, ids)
    kind = StackedDenseExperts if fmt == "bf16" else StackedQuantizedExperts
    assert moe.stacked is None and kind.fit(list(moe.experts))  # on the CPU the picked experts run
    stacked = kind(list(moe.experts))
    if fmt == "bf16":
        assert moe.experts[6].gate_up.weight.data_ptr() == stacked.gate_up[6].data_ptr()
    else:
        assert moe.experts[3].down.codes.data_ptr() == stacked.down_codes[3].data_ptr()
        assert moe.experts[5].gated.scales.data_ptr() == stacked.gate_up_scales[5].data_ptr()
    assert ((stacked(x, ids) - picked).norm() / picked.norm()).item() < 1e-5
    assert torch.equal(picked_experts(moe.experts, x, ids), picked)  # the experts still compute from the views


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("early", ["0", "1"])
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "bf16"])
def test_on_the_gpu_a_graphed_step_replays_the_eager_step(nvfp4_moe, fmt, early, monkeypatch):
    """NVFP4, FP8 and float experts on a GPU: the grouped launches eagerly and inside the decode step's CUDA graph,
    the same bits — in stream order and early-launched (``ANYFP4_EXPERTS_EARLY``, where replays faulted before its
    blocks waited first thing)."""
    from helpers import graphed_against_eager

    monkeypatch.setenv("ANYFP4_EXPERTS_EARLY", early)

    ckpt = {"nvfp4": nvfp4_moe, "bf16": nvfp4_moe.parent / "src"}.get(fmt) or quantize_checkpoint(
        nvfp4_moe.parent / "src", nvfp4_moe.parent / "fp8", QuantizeOptions(format=TargetFormat.FP8,
                                                                            progress=False)).dst
    model, _ = load_model(ckpt, "cuda", torch.bfloat16, progress=False)
    assert all(m.stacked is not None for m in experts_of(model))
    eager, graph = graphed_against_eager(model, monkeypatch)
    assert torch.isfinite(eager).all() and torch.equal(eager, graph)
