"""Random-weight models: every format runs, the lm_head quantized on request, the weights' ranges, and the
``random:ARCH:FORMAT`` names."""

import pytest
import torch

from anyfp4.bench.model import weight_bytes_per_token
from anyfp4.bench.random_model import RandomSource, RandomSpec, random_model
from anyfp4.cli import main
from anyfp4.formats.fp8 import FP8Weight
from anyfp4.formats.nvfp4 import NVFP4Weight


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed", "bf16"])
def test_random_models_run(fmt):
    model = random_model("smollm2-135m", fmt, "cpu", torch.float32, progress=False)
    model.setup_caches(1, 4)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]]), torch.arange(3))
    assert torch.isfinite(logits).all()
    assert weight_bytes_per_token(model) > 0


def test_random_lm_head_quantized_on_request(capsys):
    """``FORMAT+lm_head``: the lm_head in the weight format too (NVFP4 for mixed); bf16 otherwise; refused for a
    bf16 model and for tied embeddings, and from the CLI as a clear message."""
    for fmt, kind in [("nvfp4", torch.Tensor), ("nvfp4+lm_head", NVFP4Weight), ("fp8+lm_head", FP8Weight),
                      ("mixed+lm_head", NVFP4Weight)]:
        w, _ = RandomSource(fmt, "cpu").linear("lm_head", 64, 32)
        assert isinstance(w, kind), fmt
    for fmt, tied, why in [("bf16+lm_head", False, "no quantized lm_head"), ("nvfp4+lm_head", True, "ties"),
                           ("nvfp4+head", False, "not 'nvfp4\\+head'")]:
        with pytest.raises(ValueError, match=why):
            RandomSource(fmt, "cpu", tied=tied)
    for tp in ("1", "2"):
        assert main(["bench", "--random-weights", "smollm2-135m", "--quantized-lm-head", "--device", "cpu",
                     "--tp", tp]) == 2
        assert "ties its lm_head" in capsys.readouterr().err


def test_random_source_weights():
    """NVFP4 block scales from bytes 0x28..0x4F and one global scale 2e-3 for every projection; FP8 bytes
    without NaN, of either sign, scale 1e-4 and a static activation scale 0.05; bf16 of std 1 / sqrt(in)."""
    w, _ = RandomSource("nvfp4", "cpu").linear("model.layers.0.mlp.up_proj", 64, 256)
    assert isinstance(w, NVFP4Weight) and w.packed.shape == (64, 128) and w.block_scale.shape == (64, 16)
    scale_bytes = w.block_scale.view(torch.uint8)
    assert scale_bytes.min() >= 0x28 and scale_bytes.max() < 0x50 and float(w.global_scale) == pytest.approx(2e-3)
    w, _ = RandomSource("fp8", "cpu").linear("model.layers.0.mlp.up_proj", 64, 256)
    assert isinstance(w, FP8Weight) and not w.per_channel
    codes = w.weight.view(torch.uint8)
    assert (codes & 0x7F).max() < 0x7E and (codes >= 0x80).any()
    assert float(w.scale) == pytest.approx(1e-4) and float(w.input_scale) == pytest.approx(0.05)
    w, _ = RandomSource("bf16", "cpu").linear("model.layers.0.mlp.up_proj", 256, 1024)
    assert w.dtype == torch.bfloat16 and float(w.float().std()) == pytest.approx(1024**-0.5, rel=0.05)
    a, _ = RandomSource("nvfp4", "cpu", seed=3).linear("lm_head", 8, 32)
    b, _ = RandomSource("nvfp4", "cpu", seed=3).linear("lm_head", 8, 32)
    assert torch.equal(a, b)  # seeded


def test_random_spec_names():
    spec = RandomSpec.parse("random:llama-3.1-8b:nvfp4+lm_head")
    assert spec == RandomSpec("llama-3.1-8b", "nvfp4+lm_head") and str(spec) == "random:llama-3.1-8b:nvfp4+lm_head"
    assert RandomSpec.parse("/checkpoints/random") is None  # a directory
    assert spec.args().hidden_size == 4096
    with pytest.raises(ValueError, match="random:ARCH:FORMAT"):
        RandomSpec.parse("random:llama-3.1-8b")
    with pytest.raises(ValueError, match="unknown architecture 'gpt-9'"):
        RandomSpec("gpt-9", "nvfp4").args()
    with pytest.raises(ValueError, match="not 'nvfp4:x'"):
        RandomSpec.parse("random:smollm2-135m:nvfp4:x").args()


def test_bench_takes_a_random_model_by_name(capsys):
    import json

    assert main(["bench", "random:smollm2-135m:fp8", "--device", "cpu", "--prompt-len", "8", "--gen-len", "2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "random:smollm2-135m:fp8"


@pytest.mark.parametrize("fmt", ["mixed", "nvfp4", "bf16"])
def test_the_hybrid_shape_builds_and_runs_shrunk(fmt):
    """qwen3.5-27b: its layer pattern and Gated DeltaNet shape; four layers of it at a smaller width build from random
    weights (mixed: FP8 attention and Gated DeltaNet projections, NVFP4 MLPs) and give finite logits for a prefill
    and a decode step."""
    from dataclasses import replace

    from anyfp4.bench.random_model import RandomSource, random_args
    from anyfp4.runtime.loader import build_model

    args = random_args("qwen3.5-27b", fmt)
    assert args.layer_types.count("full_attention") == 16 and args.layer_types[3] == "full_attention"
    assert args.rope_dim == 64 and args.gdn.conv_channels == 8192 and args.num_heads * args.head_dim == 6144
    small = replace(args, num_layers=4, layer_types=args.layer_types[:4], vocab_size=1024, hidden_size=512,
                    intermediate_size=1024, num_heads=4, num_kv_heads=2, head_dim=64, rotary_dim=16)
    src = RandomSource(fmt, "cpu", zero_centered=True)
    model = build_model(small, src, torch.device("cpu"), torch.bfloat16, progress=False)
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"GatedDeltaNet", "FP8Linear" if fmt == "mixed" else "Attention"} <= kinds, kinds
    model.setup_caches(1, 48)
    with torch.no_grad():
        prefill = model(torch.arange(40)[None], torch.arange(40))
        step = model(torch.tensor([[4]]), torch.tensor([40]))
    assert torch.isfinite(prefill).all() and torch.isfinite(step).all() and prefill.std() > 0.1


def test_a_random_hybrid_has_a_random_mtp_head():
    """random_mtp_head: bf16 weights of the head's shapes for a hybrid arch (a shrunk one here), refused for others."""
    from dataclasses import replace
    from unittest import mock

    from anyfp4.bench import random_model as rm

    args = rm.random_args("qwen3.5-27b", "mixed")
    small = replace(args, num_layers=4, layer_types=args.layer_types[:4], vocab_size=1024, hidden_size=256,
                    intermediate_size=512, num_heads=4, num_kv_heads=2, head_dim=64, rotary_dim=16)
    with mock.patch.object(rm, "random_args", return_value=small):
        head = rm.random_mtp_head("qwen3.5-27b", "mixed", "cpu", torch.float32)
    assert head.fc.__class__.__name__ == "DenseLinear" and head.layer.attn.args.attn_output_gate
    with pytest.raises(ValueError, match="no multi-token-prediction head"):
        rm.random_mtp_head("smollm2-135m", "nvfp4", "cpu", torch.float32)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "bf16"])
def test_the_moe_shape_builds_and_runs_shrunk(fmt):
    """qwen3-30b-a3b: 128 experts of 768, 8 per token, in every layer; shrunk to two layers of 16 smaller experts it
    builds from random weights (the routers bf16) and a decode step reads top_k / experts of the experts' bytes."""
    from dataclasses import replace

    from anyfp4.bench.random_model import random_args
    from anyfp4.runtime.experts import MixtureOfExperts
    from anyfp4.runtime.loader import build_model

    args = random_args("qwen3-30b-a3b", fmt)
    assert (args.moe.experts, args.moe.top_k, args.moe.intermediate, len(args.moe.sparse_layers)) == (128, 8, 768, 48)
    small = replace(args, num_layers=2, vocab_size=1024, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                    moe=replace(args.moe, experts=16, top_k=4, intermediate=128, sparse_layers=(0, 1)))
    model = build_model(small, RandomSource(fmt, "cpu"), torch.device("cpu"), torch.bfloat16, progress=False)
    moes = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    assert len(moes) == 2 and all(type(m.router).__name__ == "DenseLinear" for m in moes)
    model.setup_caches(1, 48)
    with torch.no_grad():
        prefill = model(torch.arange(40)[None], torch.arange(40))
        step = model(torch.tensor([[4]]), torch.tensor([40]))
    assert torch.isfinite(prefill).all() and torch.isfinite(step).all() and prefill.std() > 0.1
    per_expert = {"nvfp4": 3 * 128 * 256 * 9 // 16, "fp8": 3 * 128 * 256, "bf16": 3 * 128 * 256 * 2}[fmt]
    every = replace(small, moe=replace(small.moe, top_k=16))  # the same shapes, every expert run per token
    dense_too = build_model(every, RandomSource(fmt, "cpu"), torch.device("cpu"), torch.bfloat16, progress=False)
    assert weight_bytes_per_token(dense_too) - weight_bytes_per_token(model) == 2 * (16 - 4) * per_expert
