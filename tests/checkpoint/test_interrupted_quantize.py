"""`anyfp4 quantize` killed (SIGKILL) or interrupted (SIGINT, SIGTERM) at every step of writing a checkpoint
and of replacing an existing one with 10,000 files: the destination always holds one complete checkpoint
(the old or the new one), the source and its neighbours are untouched, and after the next run nothing is
left beside the destination.

The runs stop at a chosen step through the ``replace.reached`` hook (``helpers.pause_at``); most are forked
from the test process (fast), the exit-status tests run the real command line in a fresh interpreter.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from anyfp4 import cli
from anyfp4.checkpoint import replace
from anyfp4.checkpoint.reader import CheckpointReader
from anyfp4.checkpoint import writer as writer_module
from helpers import ForkedCli, pause_at, snapshot, write_float_checkpoint

OLD_FILES = 10_000
SHARDS = ["--max-shard-size", "0.00002"]  # about 21 kB: several shards (with the 1 MiB floor lowered)
PAUSED = Path(__file__).with_name("paused_quantize.py")


@pytest.fixture(scope="module")
def old_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint-looking directory of 10,000 small files, hard-linked into each test (cheap to copy)."""
    path = tmp_path_factory.mktemp("old") / "ckpt"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "old": True}))
    save_file({"w": torch.zeros(4)}, str(path / "model.safetensors"))
    for i in range(OLD_FILES):
        (path / f"shard-{i:05d}.txt").write_text(str(i))
    return path


@pytest.fixture(scope="module")
def new_checkpoint(tmp_path_factory) -> dict[str, bytes]:
    """What a complete run writes: file name -> bytes."""
    root = tmp_path_factory.mktemp("reference")
    src = write_float_checkpoint(root / "src")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(writer_module, "MIN_SHARD_BYTES", 1)
        assert cli.main(["quantize", str(src), str(root / "dst"), "--quiet", *SHARDS]) == 0
    files = {p.name: p.read_bytes() for p in (root / "dst").iterdir()}
    assert len([n for n in files if n.endswith(".safetensors")]) > 2
    return files


@pytest.fixture
def area(tmp_path, old_checkpoint, monkeypatch):
    monkeypatch.setattr(writer_module, "MIN_SHARD_BYTES", 1)
    area = tmp_path / "area"
    write_float_checkpoint(area / "src")
    (area / "notes.txt").write_text("a neighbour")
    (tmp_path / "control").mkdir()
    return area


def link_old(old: Path, dst: Path) -> None:
    dst.mkdir()
    for name in os.listdir(old):
        os.link(old / name, dst / name)


def state(dst: Path, old: Path, new: dict[str, bytes]) -> str:
    """"old" or "new" when ``dst`` holds that checkpoint complete (an interrupted swap's marker aside)."""
    if not dst.is_dir():
        return "missing"
    names = set(os.listdir(dst)) - {replace.MARKER}
    if names == set(os.listdir(old)):
        return "old" if (dst / "config.json").read_bytes() == (old / "config.json").read_bytes() else "broken"
    if names == set(new) and all((dst / n).read_bytes() == data for n, data in new.items()):
        return "new"
    return f"broken ({len(names)} files)"


def beside(area: Path) -> list[str]:
    return sorted(n for n in os.listdir(area) if n not in ("src", "notes.txt", "dst"))


def stop_and_signal(area: Path, step: str, nth: int, signum: int, fallback: bool) -> tuple[int, str, int]:
    control = area.parent / "control"

    def prepare():
        # a thread beside the main one, as the command has (torch's OpenMP workers): a signal that the main thread
        # holds goes to it. Started here, the child has one whatever torch did in this process before the fork.
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        writer_module.MIN_SHARD_BYTES = 1
        replace.reached = pause_at(step, nth, control)
        if fallback:  # a file system without RENAME_EXCHANGE: two renames
            replace._exchange = lambda a, b: False

    run = ForkedCli(["quantize", str(area / "src"), str(area / "dst"), "--force", "--quiet", *SHARDS],
                    control / "stderr", prepare)
    deadline = time.monotonic() + 60
    while not (control / "ready").exists():
        if run.poll() is not None:
            pytest.fail(f"the run ended ({run.code}) before step {step} #{nth}: {(control / 'stderr').read_text()}")
        if time.monotonic() > deadline:
            os.kill(run.pid, signal.SIGKILL)
            run.wait()
            pytest.fail(f"step {step} #{nth} not reached in 60 s")
        time.sleep(0.002)
    os.kill(run.pid, signum)
    (control / "go").touch()
    return run.wait(), (control / "stderr").read_text(), run.pid


# (step, nth time, two renames instead of an exchange, replacing an old checkpoint,
#  dst after SIGKILL, dst after SIGINT)
STEPS = [
    ("shard-written", 2, False, True, "old", "old"),
    ("written", 1, False, True, "old", "old"),
    ("old-marked", 1, False, True, "old", "old"),
    ("exchanged", 1, False, True, "new", "new"),  # signals are held there: SIGINT lands once the swap is done
    ("swapped", 1, False, True, "new", "new"),
    ("removing", 1, False, True, "new", "new"),  # deleting the replaced checkpoint
    ("removing", OLD_FILES // 2, False, True, "new", "new"),
    ("old-marked", 1, True, True, "old", "old"),
    ("old-aside", 1, True, True, "missing", "new"),  # between the two renames; the next run puts the old one back
    ("swapped", 1, True, True, "new", "new"),
    ("removing", OLD_FILES // 2, True, True, "new", "new"),
    ("shard-written", 1, False, False, "missing", "missing"),
    ("written", 1, False, False, "missing", "missing"),
    ("swapped", 1, False, False, "new", "new"),
]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
@pytest.mark.parametrize("step, nth, fallback, replacing, killed, interrupted", STEPS,
                         ids=[f"{s[0]}#{s[1]}{'-renames' if s[2] else ''}{'' if s[3] else '-new'}" for s in STEPS])
def test_killed_or_interrupted_at_every_step(area, old_checkpoint, new_checkpoint, signum, step, nth, fallback,
                                             replacing, killed, interrupted):
    dst = area / "dst"
    if replacing:
        link_old(old_checkpoint, dst)
    source = snapshot(area / "src")
    code, err, pid = stop_and_signal(area, step, nth, signum, fallback)

    if signum == signal.SIGKILL:
        assert code == -signal.SIGKILL, err
        assert state(dst, old_checkpoint, new_checkpoint) == killed
        replace.recover(dst)  # what the next run does first
        assert state(dst, old_checkpoint, new_checkpoint) == ("old" if killed == "missing" and replacing else killed)
        assert beside(area) == []
    else:
        assert code == 130
        outcome = f"the new checkpoint is in place at {dst}" if interrupted == "new" else f"{dst} is unchanged"
        if step == "removing":
            outcome += "; the next run deletes the rest of the old one"
        assert err == f"anyfp4 quantize: interrupted by SIGINT; {outcome}\n"
        assert state(dst, old_checkpoint, new_checkpoint) == interrupted
        # only a deletion cut short leaves something: the rest of the replaced checkpoint, still marked
        assert beside(area) == ([f".dst.old-{pid}"] if step == "removing" else [])
    assert not (dst / replace.MARKER).exists()
    assert snapshot(area / "src") == source and (area / "notes.txt").read_text() == "a neighbour"

    assert cli.main(["quantize", str(area / "src"), str(dst), "--force", "--quiet", *SHARDS]) == 0
    assert state(dst, old_checkpoint, new_checkpoint) == "new" and beside(area) == []
    assert snapshot(area / "src") == source


@pytest.mark.parametrize("signum, step, replacing, status, outcome", [
    (signal.SIGINT, "shard-written", False, 130, "{dst} is unchanged"),
    (signal.SIGTERM, "shard-written", True, 143, "{dst} is unchanged"),
    (signal.SIGTERM, "removing", True, 143, "the new checkpoint is in place at {dst}; the next run deletes the rest "
                                            "of the old one"),
], ids=["SIGINT-writing", "SIGTERM-writing", "SIGTERM-deleting-the-old"])
def test_command_line_exit_status(area, old_checkpoint, new_checkpoint, signum, step, replacing, status, outcome):
    """The real command, in its own interpreter: 128 + the signal, one line on stderr, no traceback."""
    dst, control = area / "dst", area.parent / "control"
    if replacing:
        link_old(old_checkpoint, dst)
    proc = subprocess.Popen([sys.executable, str(PAUSED), step, "1", str(control), str(area / "src"), str(dst),
                             "--force", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (control / "ready").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "never reached the step"
        time.sleep(0.01)
    proc.send_signal(signum)
    (control / "go").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status
    name = signal.Signals(signum).name
    assert (out, err) == ("", f"anyfp4 quantize: interrupted by {name}; {outcome.format(dst=dst)}\n")
    if step == "removing":  # one shard here (no lowered floor): check it as a checkpoint, not against the reference
        CheckpointReader(dst).validate_values()
        assert beside(area) == [f".dst.old-{proc.pid}"]
    else:
        assert state(dst, old_checkpoint, new_checkpoint) == ("old" if replacing else "missing")
        assert beside(area) == []
