"""The parser: complete help with defaults, no torch imported to print it, usage errors in one line."""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anyfp4.cli import main
from anyfp4.cli.parser import build_parser

SRC = str(Path(__file__).resolve().parents[2] / "src")
COMMANDS = ["quantize", "inspect", "generate", "chat", "bench", "serve", "demo"]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_and_option_has_a_help_text():
    parser = build_parser()
    commands = _subparsers(parser)
    assert sorted(commands) == sorted(COMMANDS)
    for name, sub in [("anyfp4", parser), *commands.items()]:
        for action in sub._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{name} {action.option_strings or action.dest} has no help text"


@pytest.mark.parametrize("command, shown", [
    ("bench", ["--prompt-len PROMPT_LEN", "(default: 128)", "--gen-len", "(default: 64)", "--batch",
               "--device DEVICE", "--dtype", "--json", "(default: 29519)"]),
    ("demo", ["--format", "(default: nvfp4)", "--prompt PROMPT", "--max-tokens", "(default: 48)", "--device"]),
    ("generate", ["--max-tokens MAX_TOKENS", "(default: 256)", "(default: 0.0)", "--draft-tokens", "(default: 4)"]),
    ("chat", ["(default: 512)", "--system SYSTEM"]),
    ("quantize", ["(default: 5.0)", "(default: nvfp4)"]),
    ("serve", ["--host HOST", "(default: 127.0.0.1)", "--port PORT", "(default: 8000)", "--api-key KEY",
               "ANYFP4_API_KEY", "--max-queue MAX_QUEUE", "(default: 16)", "(default: 1024)", "--served-model-name"]),
])
def test_help_shows_options_and_defaults(command, shown, capsys):
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for fragment in shown:
        assert fragment in text, fragment
    assert "(default: None)" not in text and "(default: False)" not in text


def test_top_level_help_describes_the_tool_and_its_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "The ``anyfp4`` command line." not in out
    assert "weight-quantized LLM checkpoints" in out and "--debug" in out
    assert "130 interrupted" in out and "143 terminated" in out


@pytest.mark.parametrize("argv", [["--help"], *[[c, "--help"] for c in COMMANDS]])
def test_help_imports_no_torch_and_is_fast(argv):
    env = dict(os.environ, PYTHONPATH=SRC)
    code = ("import runpy, sys, time; t = time.perf_counter(); sys.argv = ['anyfp4', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('anyfp4', run_name='__main__')\nexcept SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "print('SECONDS', time.perf_counter() - t, file=sys.stderr)\n"
            "print('TORCH', 'torch' in sys.modules, file=sys.stderr)")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=60)
    wall = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    assert "usage: anyfp4" in done.stdout
    assert "TORCH False" in done.stderr
    seconds = float(done.stderr.split("SECONDS")[1].split()[0])
    assert seconds < 0.5, f"help took {seconds:.2f} s in-process ({wall:.2f} s with the interpreter's start)"


@pytest.mark.parametrize("argv, fragment", [
    (["generate", "m", "--max-tokens", "0"], "argument --max-tokens: must be an integer >= 1, got 0"),
    (["generate", "m", "--temperature", "-1"], "argument --temperature: must be a number >= 0, got -1"),
    (["generate", "m", "--top-p", "1.5"], "argument --top-p: must be a number in (0, 1], got 1.5"),
    (["chat", "m", "--top-k", "0"], "argument --top-k: must be an integer >= 1, got 0"),
    (["chat", "m", "--draft-tokens", "0"], "argument --draft-tokens: must be an integer >= 1, got 0"),
    (["bench", "--gen-len", "x"], "argument --gen-len: expected an integer >= 1, got 'x'"),
    (["inspect"], "the following arguments are required: path"),
    (["nope"], "invalid choice: 'nope'"),
])
def test_usage_errors_are_one_line_with_exit_code_2(argv, fragment, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    prog = "anyfp4" if argv[0] == "nope" else f"anyfp4 {argv[0]}"
    assert captured.err.startswith(f"{prog}: error: ") and fragment in captured.err
    assert captured.err.count("\n") == 1 and captured.out == ""
