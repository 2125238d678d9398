"""`anyfp4 quantize` refuses destinations it could not write without losing data, and changes nothing then."""

import json
import os
from pathlib import Path

import pytest

from anyfp4 import cli
from anyfp4.checkpoint.destination import resolve_destination
from anyfp4.checkpoint.errors import CheckpointError
from helpers import snapshot, write_float_checkpoint

SHOWN = "anyfp4 quantize: error: "


@pytest.fixture
def area(tmp_path, monkeypatch):
    """tmp_path/D holding the source checkpoint and a sibling file; the current directory is an empty tmp_path/cwd."""
    write_float_checkpoint(tmp_path / "D" / "src")
    (tmp_path / "D" / "notes.txt").write_text("keep me")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def quantize(*args: str) -> int:
    return cli.main(["quantize", *map(str, args), "--quiet"])


def checkpoint(path, config=None, folder=None):
    """A float checkpoint at ``path``, optionally with another config.json text or a subdirectory."""
    write_float_checkpoint(path)
    if config is not None:
        (path / "config.json").write_text(config)
    if folder is not None:
        (path / folder).mkdir(parents=True)
    return path


def folder(path, **files):
    path.mkdir()
    for name, text in files.items():
        (path / name.replace("_", ".")).write_text(text)
    return path


def symlink(path, target):
    path.symlink_to(target)
    return path


REFUSED = [
    # (case, the DST argument made under tmp_path, --force, message fragment)
    ("source's parent", lambda t: t / "D", True,
     "refusing to write the checkpoint there: it holds the source checkpoint"),
    ("source's parent, relative", lambda t: "../D/src/..", True, "it holds the source checkpoint"),
    ("current directory", lambda t: ".", True, "it is the current directory or holds it; give a directory of its own"),
    ("current directory, no --force", lambda t: ".", False, "it is the current directory or holds it"),
    ("parent of the current directory", lambda t: "..", True, "it is the current directory or holds it"),
    ("the source", lambda t: t / "D" / "src", True, "it is the source checkpoint"),
    ("a symlink to the source", lambda t: symlink(t / "link", t / "D" / "src"), True, "it is the source checkpoint"),
    ("inside the source", lambda t: t / "D" / "src" / "out", True, "it is inside the source checkpoint"),
    ("home", lambda t: os.environ["HOME"], True, "it is the home directory"),
    ("a file", lambda t: folder(t / "d", f_txt="x") / "f.txt", True, "destination exists and is not a directory"),
    ("not a checkpoint", lambda t: folder(t / "proj", a_py=""), True, "destination is not empty and is not a "
     "checkpoint (it has no config.json); --force replaces only a checkpoint directory: give a new or empty directory"),
    ("config.json without weights", lambda t: folder(t / "c", config_json="{}"), True,
     "is not a checkpoint (it has no .safetensors weights)"),
    ("config.json not JSON", lambda t: checkpoint(t / "c", config="{"), True,
     "is not a checkpoint (its config.json is not valid JSON)"),
    ("config.json not an object", lambda t: checkpoint(t / "c", config="[]"), True,
     "is not a checkpoint (its config.json is not a JSON object)"),
    ("checkpoint holding a folder", lambda t: checkpoint(t / "c", folder="runs"), True,
     "is not a checkpoint (it holds the directory 'runs')"),
    ("checkpoint without --force", lambda t: checkpoint(t / "c"), False,
     "destination is not empty (it holds a checkpoint); pass --force to replace it"),
]


@pytest.mark.parametrize("make, force, message", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_destination_changes_nothing(area, monkeypatch, capsys, make, force, message):
    monkeypatch.setenv("HOME", str(area / "home"))
    (area / "home").mkdir()
    dst = make(area)
    before = snapshot(area)
    assert quantize(area / "D" / "src", dst, *(["--force"] if force else [])) == 2
    err = capsys.readouterr().err
    assert err.startswith(SHOWN) and message in err and err.count("\n") == 1, err
    assert snapshot(area) == before


def test_root_is_refused(tmp_path):
    # Checked on the path alone: a command-line run aimed at / would, with a broken check, delete the machine.
    with pytest.raises(CheckpointError, match=r"refusing to write the checkpoint there: it is the root directory"):
        resolve_destination(tmp_path / "src", Path("/"))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e-9", "1e400"])
def test_bad_max_shard_size(area, capsys, value):
    before = snapshot(area)
    assert quantize(area / "D" / "src", area / "out", f"--max-shard-size={value}") == 2
    err = capsys.readouterr().err
    shown = {"1e400": "inf", "1e-9": "1e-09"}.get(value, value)
    assert err == f"{SHOWN}--max-shard-size must be a finite number of GiB, at least 1/1024 (1 MiB); got {shown}\n"
    assert snapshot(area) == before


@pytest.mark.parametrize("layout", ["anyfp4 output", "downloaded checkpoint", "empty directory"])
def test_replaces_a_checkpoint_or_fills_an_empty_directory(area, capsys, layout):
    src, dst = area / "D" / "src", area / "out"
    if layout == "anyfp4 output":
        assert quantize(src, dst, "--format", "fp8") == 0
    elif layout == "downloaded checkpoint":
        checkpoint(dst, folder=".cache/huggingface")
        (dst / "README.md").write_text("model card")
    else:
        dst.mkdir()
    before = snapshot(area / "D")
    assert quantize(src, dst, *(["--force"] if layout != "empty directory" else [])) == 0
    assert json.loads((dst / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"
    assert not (dst / "README.md").exists() and not (dst / ".cache").exists()  # --force replaces the whole directory
    assert sorted(p.name for p in area.iterdir()) == ["D", "cwd", "out"]  # nothing left beside it
    assert snapshot(area / "D") == before
