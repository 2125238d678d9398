"""``replace.recover``: what killed runs left beside a destination is removed only when anyfp4 marked it and
its process has ended, and a replaced checkpoint is put back rather than deleted when the destination is
missing. ``replace.install``'s two-rename fallback rolls back when the second rename fails."""

import dataclasses
import errno
import json
import os
import subprocess
import sys

import pytest

from anyfp4.checkpoint import replace

ME = replace.Owner.this_process()
ENDED = dataclasses.replace(ME, started=(ME.started or 0) + 1)  # this pid, another start: a pid reused since


def mark(path, role, owner=ENDED, dst="dst"):
    path.mkdir(exist_ok=True)
    (path / "data.bin").write_bytes(b"x")
    (path / replace.MARKER).write_text(json.dumps({"role": role, "dst": dst, **dataclasses.asdict(owner)}))
    return path


def names(folder):
    return sorted(p.name for p in folder.iterdir())


def checkpoint(path, text="current"):
    path.mkdir()
    (path / "config.json").write_text(text)
    return path


def test_removes_only_marked_leftovers_of_ended_processes(tmp_path):
    dst = checkpoint(tmp_path / "dst")
    mark(dst, "old")  # a marker left in dst by a swap cut short
    mark(tmp_path / ".dst.partial-11", "new")
    mark(tmp_path / ".dst.old-12", "old")
    mark(tmp_path / ".dst.old-13", "discard")
    kept = [
        mark(tmp_path / ".dst.partial-21", "new", owner=ME),  # a run in progress
        mark(tmp_path / ".dst.partial-22", "new", owner=dataclasses.replace(ENDED, boot="other", host="other")),
        mark(tmp_path / ".dst.partial-23", "new", dst="other"),  # another destination's
        mark(tmp_path / ".dst.partial-24", "nonsense"),
        tmp_path / ".dst.partial-25",  # not anyfp4's: no marker
        tmp_path / ".dst.old-26",  # a file
    ]
    kept[4].mkdir()
    kept[5].write_text("x")
    replace.recover(dst)
    assert names(tmp_path) == sorted(["dst"] + [p.name for p in kept])
    assert names(dst) == ["config.json", "data.bin"]


def test_a_rebooted_machine_ends_every_process(tmp_path):
    dst = checkpoint(tmp_path / "dst")
    mark(tmp_path / ".dst.partial-7", "new", owner=dataclasses.replace(ME, boot="before-the-reboot"))
    replace.recover(dst)
    assert names(tmp_path) == ["dst"]


def test_an_exited_process_has_ended(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    owner = dataclasses.replace(ME, pid=int(proc.stdout), started=None)
    assert owner.ended() and not ME.ended()


def test_missing_destination_gets_the_replaced_checkpoint_back(tmp_path):
    dst = tmp_path / "dst"
    older = mark(tmp_path / ".dst.old-5", "old")
    os.utime(older, (1, 1))
    newest = mark(tmp_path / ".dst.old-6", "old")
    (newest / "config.json").write_text("newest")
    mark(tmp_path / ".dst.partial-6", "new")  # the complete new checkpoint that was never renamed in
    replace.recover(dst)
    assert names(tmp_path) == ["dst"]
    assert (dst / "config.json").read_text() == "newest" and not (dst / replace.MARKER).exists()


def test_a_checkpoint_half_deleted_is_never_put_back(tmp_path):
    mark(tmp_path / ".dst.old-5", "discard")
    replace.recover(tmp_path / "dst")
    assert names(tmp_path) == []


def test_replaced_checkpoint_kept_while_nothing_complete_stands_at_dst(tmp_path):
    (tmp_path / "dst").write_text("a file")
    mark(tmp_path / ".dst.old-5", "old")
    mark(tmp_path / ".dst.partial-5", "new")
    replace.recover(tmp_path / "dst")
    assert names(tmp_path) == [".dst.old-5", "dst"]


def build(work):
    (work / "config.json").write_text("new")
    return "built"


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_install_replaces_and_cleans_up(tmp_path, monkeypatch, exchange):
    dst = checkpoint(tmp_path / "dst", "old")
    if not exchange:
        monkeypatch.setattr(replace, "_exchange", lambda a, b: False)
    assert replace.install(dst, build) == "built"
    assert names(tmp_path) == ["dst"] and names(dst) == ["config.json"] and (dst / "config.json").read_text() == "new"


def test_two_renames_roll_back_when_the_second_fails(tmp_path, monkeypatch):
    dst = checkpoint(tmp_path / "dst", "old")
    monkeypatch.setattr(replace, "_exchange", lambda a, b: False)
    real = os.rename

    def rename(a, b):
        if str(b) == str(dst) and ".partial-" in str(a):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(b))
        return real(a, b)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="Input/output error"):
        replace.install(dst, build)
    assert names(tmp_path) == ["dst"] and names(dst) == ["config.json"] and (dst / "config.json").read_text() == "old"
