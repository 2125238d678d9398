"""End to end on SmolLM2-135M-Instruct (real weights), CPU: chat template, streaming, the demo."""

import io

import pytest

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.cli import main
from anyfp4.runtime.generate import SamplingParams
from anyfp4.runtime.session import Session, chat_loop


@pytest.mark.slow
def test_chat_answers_through_the_template(smollm2_bf16, tmp_path):
    ckpt = quantize_checkpoint(smollm2_bf16, tmp_path / "fp8", QuantizeOptions(format=TargetFormat.FP8,
                                                                                progress=False)).dst
    session = Session.load(ckpt, "cpu", "fp32", progress=False)
    assert session.stop_token_ids  # eos from the tokenizer / generation config
    out = io.StringIO()
    chat_loop(session, SamplingParams(max_new_tokens=24), stdin=io.StringIO("What is the capital of France?\n\n"),
              stdout=out)
    assert "Paris" in out.getvalue()


@pytest.mark.slow
def test_demo_command(smollm2_bf16, monkeypatch, capsys):
    monkeypatch.setenv("ANYFP4_CACHE", str(smollm2_bf16.parent))  # the bf16 conversion is already there
    assert main(["demo", "--max-tokens", "12", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "valid (structure, config and values checked); runs as LlamaForCausalLM" in out
    answers = {line.split("(")[0].strip(): line.split("): ", 1)[1] for line in out.splitlines()
               if "MB read per token" in line}
    assert list(answers) == ["bf16", "fp8", "nvfp4"] and all(a.strip() for a in answers.values())
    assert "Paris" in answers["bf16"] and "Paris" in answers["fp8"]  # greedy, 12 tokens: "The capital of France is Paris."
    assert "4-bit weights cost a 135M model more than a large one" in out


@pytest.mark.slow
def test_chat_with_speculation_gives_the_same_reply(smollm2_bf16, tmp_path, monkeypatch, capsys):
    ckpt = quantize_checkpoint(smollm2_bf16, tmp_path / "nvfp4", QuantizeOptions(format=TargetFormat.NVFP4,
                                                                                  progress=False)).dst
    turn = "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog.\n\n"
    outputs = []
    for extra in ([], ["--speculate", "ngram", "--draft-tokens", "3"]):
        monkeypatch.setattr("sys.stdin", io.StringIO(turn))
        assert main(["chat", str(ckpt), "--device", "cpu", "--quiet", "--max-tokens", "24", *extra]) == 0
        outputs.append(capsys.readouterr())
    assert outputs[0].out == outputs[1].out and "fox" in outputs[1].out
    assert "[speculation:" in outputs[1].err and "[speculation:" not in outputs[0].err
