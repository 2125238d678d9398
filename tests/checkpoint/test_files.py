"""Files: only regular files inside the checkpoint directory are opened; inspect's exit codes."""

import json
import os
import shutil

import pytest

from anyfp4.checkpoint.writer import QuantizeOptions, quantize_checkpoint
from anyfp4.cli import main
from helpers import edit_json, expect_refused, hard_timeout, write_float_checkpoint


@pytest.fixture
def sharded(tmp_path):
    src = write_float_checkpoint(tmp_path / "src")
    return quantize_checkpoint(src, tmp_path / "ckpt" / "sharded",
                               QuantizeOptions(max_shard_bytes=20_000, progress=False)).dst


@pytest.mark.parametrize("outside", ["../../outside/weights.safetensors", "../weights.safetensors",
                                     "/tmp/weights.safetensors", "sub/../../weights.safetensors"])
def test_index_entries_stay_inside_the_checkpoint(sharded, capsys, outside):
    index = sharded / "model.safetensors.index.json"
    first = sorted(set(json.loads(index.read_text())["weight_map"].values()))[0]
    target = (sharded / outside) if not outside.startswith("/") else None
    if target is not None:  # the file really is there: refusing it is not "missing"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sharded / first, target)
    edit_json(index, lambda d: d["weight_map"].update({k: outside for k, v in d["weight_map"].items() if v == first}))
    expect_refused(sharded, f"file {outside!r} lies outside the checkpoint directory; only paths inside it are read",
                   capsys, names_file=index)


def test_symlinked_shards_as_in_the_hugging_face_cache_are_read(sharded, capsys):
    blobs = sharded.parent / "blobs"
    blobs.mkdir()
    for shard in sharded.glob("*.safetensors"):
        shutil.move(shard, blobs / shard.name)
        os.symlink(os.path.relpath(blobs / shard.name, sharded), shard)
    assert main(["inspect", str(sharded), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"]


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json", "generation_config.json"])
def test_a_fifo_is_refused_before_it_is_opened(tmp_path, capsys, name):
    path = write_float_checkpoint(tmp_path / "ckpt")
    (path / name).unlink()
    os.mkfifo(path / name)
    with hard_timeout(60):
        expect_refused(path, "is a FIFO, not a regular file; anyfp4 reads regular files only", capsys,
                       names_file=path / name)


@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors", "config.json"])
def test_a_symlink_loop_is_refused(tmp_path, capsys, name):
    path = write_float_checkpoint(tmp_path / "ckpt")
    (path / name).unlink()
    os.symlink(name, path / name)
    expect_refused(path, "cannot be opened: Too many levels of symbolic links", capsys, names_file=path / name)


def test_inspect_exit_codes(tmp_path, capsys):
    good = write_float_checkpoint(tmp_path / "good")
    assert main(["inspect", str(good)]) == 0
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("[1, 2]")
    assert main(["inspect", str(tmp_path / "bad")]) == 1
    assert main(["inspect", str(tmp_path / "absent")]) == 2
    assert main(["inspect", str(good / "config.json")]) == 2
    captured = capsys.readouterr()
    assert "invalid: expected a JSON object, found list" in captured.out
    assert captured.err.count("anyfp4 inspect: error: not a checkpoint directory (file") == 2
    assert main(["inspect"]) == 2  # usage error


def test_inspect_exits_2_not_1_when_it_crashes(tmp_path, monkeypatch, capsys):
    good = write_float_checkpoint(tmp_path / "good")
    monkeypatch.setattr("anyfp4.runtime.plan.plan_model", lambda reader: 1 / 0)
    assert main(["inspect", str(good)]) == 2
    assert "ZeroDivisionError" in capsys.readouterr().err
