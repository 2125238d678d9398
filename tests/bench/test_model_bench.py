import json

from anyfp4.checkpoint.writer import QuantizeOptions, quantize_checkpoint
from anyfp4.cli import main
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


def test_a_hybrids_bench_decodes_what_generate_decodes(tmp_path):
    """The warm-up steps before the timed run advance a hybrid's recurrent states: the timed run starts from zero
    states again, and its tokens are generate's for the same prompt."""
    import hashlib

    import torch

    from anyfp4.bench.model import bench_model
    from anyfp4.runtime.generate import SamplingParams, generate
    from anyfp4.runtime.loader import load_model
    from helpers import rewrite_tensors, save_random_qwen3_5, tiny_qwen3_5_config

    src = save_random_qwen3_5(tmp_path / "src", tiny_qwen3_5_config(64, vocab_size=128, max_position_embeddings=256))

    def no_decay(tensors):  # states that never fade: whatever the warm-ups left would stay in the text
        for name in [n for n in tensors if n.endswith("A_log")]:
            tensors[name] = torch.full_like(tensors[name], -30.0)

    rewrite_tensors(src, no_decay)
    model, _ = load_model(src, "cpu", torch.float32, progress=False)
    r = bench_model(model, prompt_len=12, gen_len=10, batch=1)
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    want = generate(model, prompt.tolist(), SamplingParams(max_new_tokens=10))
    assert r["sha256"] == hashlib.sha256(repr(want).encode()).hexdigest()
