"""The commands: every check that needs no weights comes before any are read, each error is one line on
stderr with its exit code, and a run on a tiny checkpoint keeps stderr clean when it is not a terminal."""

import io
import json

import pytest
import torch

from anyfp4.cli import main
from helpers import TINY_LLAMA, write_float_checkpoint, write_runnable_checkpoint


def _without_tokenizer(path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink(missing_ok=True)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    return {
        "m": write_runnable_checkpoint(root / "m"),
        "no-template": write_runnable_checkpoint(root / "no-template", chat_template=None),
        "no-tokenizer": _without_tokenizer(write_float_checkpoint(root / "no-tokenizer")),
        "gpt2": write_runnable_checkpoint(root / "gpt2", dict(TINY_LLAMA, model_type="gpt2")),
        "vocab256": write_float_checkpoint(root / "vocab256", dict(TINY_LLAMA, vocab_size=256)),
        "nowhere": root / "nowhere",
    }


class Terminal(io.StringIO):
    """Standard input on a terminal: reading it would wait for the user."""

    def isatty(self):
        return True

    def __iter__(self):
        raise AssertionError("standard input was read")


@pytest.fixture
def no_weights_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr("anyfp4.runtime.loader.build_model", refuse)
    monkeypatch.setattr("anyfp4.bench.random_model.build_model", refuse)
    monkeypatch.setattr("anyfp4.parallel.ranks.spawn_ranks", refuse)
    monkeypatch.setattr("anyfp4.demo.smollm2_quantized", refuse)


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")

EARLY_ERRORS = [
    # (argv with {model} placeholders, standard input, expected fragment of the one-line message)
    (["generate", "{m}", "--prompt", ""], "", "--prompt is empty"),
    (["generate", "{m}"], Terminal(), "no prompt: give --prompt TEXT, or pipe prompts on standard input"),
    (["generate", "{m}"], "\n  \n", "standard input holds no prompt"),
    (["generate", "{m}", "--prompt", "hi", "--speculate", "ngram", "--draft-tokens", "17"], "",
     "--draft-tokens must be between 1 and 16, got 17"),
    (["generate", "{m}", "--prompt", "hi", "--max-tokens", "300"], "",
     "prompt (2 tokens) + max_new_tokens (300) exceeds the model's context of 256 tokens"),
    (["generate", "{m}", "--prompt", "hi", "--max-tokens", "250", "--speculate", "ngram"], "",
     "prompt (2 tokens) + max_new_tokens (250) + 5 for speculation exceeds the model's context of 256 tokens"),
    (["generate", "{m}", "--speculate", "ngram"], "a\nb\n", "--speculate runs one prompt, standard input held 2"),
    (["generate", "{m}", "--prompt", "hi", "--max-tokens", "8", "--speculate", "{nowhere}"], "",
     "neither 'ngram', 'mtp' nor a checkpoint directory"),
    (["generate", "{m}", "--prompt", "hi", "--max-tokens", "8", "--speculate", "{vocab256}"], "",
     "has another vocabulary (256 vs 128 tokens)"),
    (["generate", "{m}", "--prompt", "hi", "--tp", "2", "--speculate", "ngram"], "",
     "--speculate runs on one device only (not with --tp)"),
    (["generate", "{m}", "--prompt", "hi", "--tp", "2", "--max-tokens", "300"], "", "context of 256 tokens"),
    pytest.param(["generate", "{m}", "--prompt", "hi", "--device", "cuda"], "", "no CUDA GPU is available",
                 marks=NO_CUDA),
    (["generate", "{m}", "--prompt", "hi", "--device", "tpu"], "", "unknown device 'tpu'"),
    (["generate", "{no-template}", "--prompt", "hi", "--chat"], "", "tokenizer has no chat template"),
    (["generate", "{gpt2}", "--prompt", "hi"], "", "model_type 'gpt2'"),
    (["generate", "{no-tokenizer}", "--prompt", "hi"], "", "cannot load the tokenizer"),
    (["generate", "{nowhere}", "--prompt", "hi"], "", "checkpoint directory does not exist"),
    (["chat", "{no-template}"], "", "tokenizer has no chat template"),
    (["chat", "{m}", "--max-tokens", "250"], "", "+ max_new_tokens (250) exceeds the model's context of 256"),
    (["chat", "{m}", "--speculate", "ngram", "--draft-tokens", "20"], "", "--draft-tokens must be between 1 and 16"),
    (["bench"], "", "give a checkpoint directory or --random-weights ARCH (not both)"),
    (["bench", "--random-weights", "bogus"], "", "unknown architecture 'bogus'; choose from llama-3.1-8b"),
    (["bench", "--random-weights", "smollm2-135m", "--quantized-lm-head"], "", "ties its lm_head to the embeddings"),
    (["bench", "--random-weights", "smollm2-135m", "--quantized-lm-head", "--tp", "2"], "", "ties its lm_head"),
    (["bench", "--random-weights", "smollm2-135m", "--compare", "bogus"], "", "not 'bogus'"),
    (["bench", "--random-weights", "smollm2-135m", "--speculate", "ngram", "--batch", "2"], "",
     "--speculate runs batch 1"),
    (["bench", "{m}", "--prompt-len", "200", "--gen-len", "100"], "",
     "prompt (200 tokens) + max_new_tokens (100) exceeds the model's context of 256 tokens"),
    (["bench", "{m}", "--quantized-lm-head"], "", "--quantized-lm-head is for --random-weights"),
    (["bench", "{nowhere}"], "", "checkpoint directory does not exist"),
    (["inspect", "{nowhere}"], "", "not a checkpoint directory"),
    pytest.param(["demo", "--device", "cuda"], "", "no CUDA GPU is available", marks=NO_CUDA),
]


@pytest.mark.parametrize("argv, stdin, fragment", EARLY_ERRORS)
def test_bad_input_is_refused_before_any_weights_are_read(argv, stdin, fragment, models, no_weights_read,
                                                          monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", stdin if isinstance(stdin, io.StringIO) else io.StringIO(stdin))
    argv = [a.format(**models) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"anyfp4 {argv[0]}: error: "), captured.err
    assert fragment in captured.err and captured.err.count("\n") == 1
    assert captured.out == ""


def test_generate_streams_one_prompt_and_batches_several(models, monkeypatch, capsys):
    assert main(["generate", str(models["m"]), "--prompt", "hello", "--max-tokens", "8", "--device", "cpu",
                 "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.endswith("\n") and len(captured.out.strip()) > 0
    assert captured.err == ""  # no rate line, no progress: stderr is not a terminal here
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n\nworld\n"))
    assert main(["generate", str(models["m"]), "--max-tokens", "4", "--device", "cpu", "--quiet", "--chat"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2 and captured.err == ""


def test_chat_runs_until_an_empty_line(models, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n\n"))
    assert main(["chat", str(models["m"]), "--max-tokens", "4", "--device", "cpu", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("> ") == 2 and captured.err == ""


def test_inspect_unreadable_is_2_on_stderr_invalid_is_1(models, tmp_path, capsys):
    assert main(["inspect", str(models["m"]), "--headers-only"]) == 0
    assert "valid" in capsys.readouterr().out
    assert main(["inspect", str(models["nowhere"]), "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["valid"] is False  # the machine-readable report still comes
    assert captured.err.startswith("anyfp4 inspect: error: ") and captured.err.count("\n") == 1


def test_quantize_error_is_one_line(models, tmp_path, capsys):
    assert main(["quantize", str(models["nowhere"]), str(tmp_path / "out"), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("anyfp4 quantize: error: ") and captured.err.count("\n") == 1
    assert not (tmp_path / "out").exists()
