import json

import pytest

from anyfp4.checkpoint.writer import QuantizeOptions, quantize_checkpoint
from anyfp4.cli import main
from anyfp4.bench.model import weight_bytes_per_token
from anyfp4.runtime.loader import load_model
from anyfp4.bench.random_model import random_model
from helpers import TINY_LLAMA, write_float_checkpoint


def test_bench_compare_checkpoints_json(tmp_path, capsys):
    src = write_float_checkpoint(tmp_path / "src")
    q = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(progress=False)).dst
    assert main(["bench", str(q), "--compare", str(src), "--prompt-len", "8", "--gen-len", "4", "--json",
                 "--device", "cpu"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in results] == [str(q), str(src)]
    for r in results:
        assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and len(r["sha256"]) == 64
    # bytes per step: NVFP4 linears at 0.5625 B/weight, the unquantized lm_head as run, one embedding row
    h, i, v = TINY_LLAMA["hidden_size"], TINY_LLAMA["intermediate_size"], TINY_LLAMA["vocab_size"]
    linears = 2 * (64 * h + 2 * 32 * h + h * 64 + 3 * i * h)
    assert results[0]["weight_bytes_per_step"] == int(linears * 0.5625) + v * h * 4 + h * 4  # float32 on the CPU
    assert results[1]["weight_bytes_per_step"] == linears * 4 + v * h * 4 + h * 4


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "mixed", "bf16"])
def test_random_models_run(fmt):
    import torch

    model = random_model("smollm2-135m", fmt, "cpu", torch.float32, progress=False)
    model.setup_caches(1, 4)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]]), torch.arange(3))
    assert torch.isfinite(logits).all()
    assert weight_bytes_per_token(model) > 0


def test_bench_needs_exactly_one_model(capsys):
    assert main(["bench"]) == 2
    assert "checkpoint directory or --random-weights" in capsys.readouterr().err


def test_bench_reports_speculation(capsys):
    assert main(["bench", "--random-weights", "smollm2-135m", "--format", "nvfp4", "--device", "cpu", "--prompt-len",
                 "32", "--gen-len", "12", "--speculate", "ngram", "--draft-tokens", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    sp = r["speculative"]
    assert sp["draft_tokens"] == 3 and sp["verify_steps"] >= 1 and sp["decode_tok_s"] > 0
    assert sp["same_text"] and len(sp["sha256"]) == 64


def test_random_lm_head_quantized_on_request(capsys):
    """``FORMAT+lm_head``: the lm_head in the weight format too (NVFP4 for mixed); bf16 otherwise; refused for a
    bf16 model and for tied embeddings, and from the CLI as a clear message."""
    import torch

    from anyfp4.formats.fp8 import FP8Weight
    from anyfp4.formats.nvfp4 import NVFP4Weight
    from anyfp4.bench.random_model import RandomSource

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
