"""Putting a finished checkpoint at its destination so that no crash loses one.

For a destination DST, the new checkpoint is built in the sibling directory ``.DST.partial-PID``.
Once it is complete it takes DST's place in one atomic exchange (Linux ``renameat2`` with
``RENAME_EXCHANGE``); where the file system cannot exchange, DST is renamed to ``.DST.old-PID`` and
the new checkpoint renamed in, and a crash between those two renames is undone by the next run.
The replaced checkpoint is deleted last.

Every directory made or moved aside here holds ``MARKER``: the process that wrote it and what the
directory is (the new checkpoint, the replaced one, or a replaced one being deleted). ``recover``
runs before each write and removes, beside DST, only marked directories whose process has ended;
when DST is missing it puts a marked replaced checkpoint back, so the last complete copy is never
deleted.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import json
import os
import shutil
import socket
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, TypeVar

from ..interrupts import Interrupted, signals_held

MARKER = ".anyfp4-replace.json"
STAGING, REPLACED = "partial", "old"
AT_FDCWD, RENAME_EXCHANGE = -100, 2
T = TypeVar("T")


class Role(enum.Enum):
    NEW = "new"  # the checkpoint being built (or built and not yet at the destination)
    OLD = "old"  # a complete checkpoint that is being replaced
    DISCARD = "discard"  # a replaced checkpoint being deleted: never put back


def reached(step: str) -> None:
    """Called at each step of building and swapping in a checkpoint; does nothing. Tests replace it
    to stop the process at a chosen step."""


def sibling(dst: Path, kind: str, pid: int | None = None) -> Path:
    return dst.parent / f".{dst.name}.{kind}-{pid or os.getpid()}"


def _start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (Linux ``/proc``); None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rpartition(")")[2].split()[19])  # field 22; fields 1-2 end at the ")" of the name
    except (OSError, ValueError, IndexError):
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


@dataclass(frozen=True)
class Owner:
    """The process that wrote a marker. pid and start time tell a reused pid apart (a container's
    pid 1, say); the boot id tells a reboot from another machine sharing the file system."""

    pid: int
    started: int | None
    boot: str | None
    host: str

    @classmethod
    def this_process(cls) -> Owner:
        return cls(os.getpid(), _start_time(os.getpid()), _boot_id(), socket.gethostname())

    def ended(self) -> bool:
        """True only when sure that the process no longer runs; another machine's are never ended."""
        me = Owner.this_process()
        if self.boot and me.boot and self.boot != me.boot:
            return self.host == me.host  # same host, rebooted since
        if not (self.boot and me.boot) and self.host != me.host:
            return False
        if not _pid_exists(self.pid):
            return True
        return self.started is not None and _start_time(self.pid) not in (None, self.started)


@dataclass(frozen=True)
class Marker:
    role: Role
    dst: str  # the destination's name: siblings of two destinations in one folder stay apart
    owner: Owner


def _write_marker(directory: Path, role: Role, dst: Path) -> None:
    """Write (or rewrite, atomically) ``directory``'s marker."""
    tmp = directory / (MARKER + ".tmp")
    try:
        tmp.write_text(json.dumps({"role": role.value, "dst": dst.name, **asdict(Owner.this_process())}))
        os.replace(tmp, directory / MARKER)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_marker(directory: Path) -> Marker | None:
    try:
        data = json.loads((directory / MARKER).read_text())
        owner = Owner(int(data["pid"]), data.get("started"), data.get("boot"), str(data["host"]))
        marker = Marker(Role(data["role"]), str(data["dst"]), owner)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return marker if owner.pid > 0 else None


def _drop_marker(directory: Path) -> None:
    (directory / MARKER).unlink(missing_ok=True)
    (directory / (MARKER + ".tmp")).unlink(missing_ok=True)


def _is_ours(directory: Path, dst: Path, role: Role | None = None) -> bool:
    """``directory`` holds a marker that this process wrote for ``dst`` (with ``role``, if given)."""
    marker = _read_marker(directory)
    return (marker is not None and marker.dst == dst.name and marker.owner == Owner.this_process()
            and (role is None or marker.role is role))


def _remove(directory: Path) -> None:
    """Delete a marked directory with its marker last, so that a removal cut short stays marked and
    the next run finishes it."""
    for name in os.listdir(directory):
        if name != MARKER:
            path = directory / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            reached("removing")
    (directory / MARKER).unlink(missing_ok=True)
    directory.rmdir()


def _discard(replaced: Path, dst: Path) -> None:
    _write_marker(replaced, Role.DISCARD, dst)
    _remove(replaced)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic step; False where the C library or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _occupied(dst: Path) -> bool:
    return dst.exists() and (not dst.is_dir() or any(dst.iterdir()))


def _swap_in(work: Path, replaced: Path, dst: Path) -> None:
    """Put the complete checkpoint ``work`` at ``dst``; an existing ``dst`` ends up at ``replaced``."""
    if not _occupied(dst):
        with signals_held():
            os.rename(work, dst)  # POSIX: also replaces an empty directory in one step
            _drop_marker(dst)
        reached("swapped")
        return
    _write_marker(dst, Role.OLD, dst)  # so that the old checkpoint is known wherever a crash leaves it
    try:
        reached("old-marked")
        with signals_held():
            if _exchange(work, dst):
                reached("exchanged")
                os.rename(work, replaced)
            else:
                os.rename(dst, replaced)
                try:  # from here on, whatever fails puts the old checkpoint back
                    reached("old-aside")
                    os.rename(work, dst)
                except BaseException:
                    os.rename(replaced, dst)
                    raise
            _drop_marker(dst)
    except BaseException:
        if _is_ours(dst, dst):
            _drop_marker(dst)
        raise
    reached("swapped")


def install(dst: Path, build: Callable[[Path], T]) -> T:
    """Run ``build(directory)`` in a new staging directory beside ``dst`` and put the result at ``dst``.

    An existing ``dst`` (the caller has decided that it may be replaced) is swapped out and deleted.
    Whatever fails, and whenever the process is killed, ``dst`` holds a complete checkpoint, the old
    or the new one (without an atomic exchange, a kill between the two renames leaves ``dst`` missing
    until ``recover``). On an exception, what this process made beside ``dst`` is removed before it
    propagates; an ``Interrupted`` says in ``outcome`` which checkpoint is at ``dst``.
    """
    work, replaced = sibling(dst, STAGING), sibling(dst, REPLACED)
    work.mkdir(parents=True)
    try:
        _write_marker(work, Role.NEW, dst)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        result = build(work)
        reached("written")
        _swap_in(work, replaced, dst)
    except BaseException as e:
        swapped = not _is_ours(work, dst, Role.NEW)
        if isinstance(e, Interrupted) and not e.outcome:
            e.outcome = f"the new checkpoint is in place at {dst}" if swapped else f"{dst} is unchanged"
        try:  # best effort: what stays is marked, and the next run removes it
            if not swapped:
                _remove(work)  # a replaced checkpoint beside a missing dst (a failed roll-back) is kept
            else:
                for path in (replaced, work):
                    if _is_ours(path, dst, Role.OLD):
                        _discard(path, dst)
        except OSError:
            pass
        raise
    if not _is_ours(replaced, dst, Role.OLD):  # nothing was replaced (or that directory is someone else's)
        return result
    try:
        _discard(replaced, dst)
    except Interrupted as e:
        e.outcome = f"the new checkpoint is in place at {dst}; the next run deletes the rest of the old one"
        raise
    except OSError as e:
        warnings.warn(f"could not delete the replaced checkpoint {replaced} ({e.strerror}); the next run deletes it",
                      stacklevel=2)
    return result


def recover(dst: Path) -> None:
    """Clean up after runs that were killed while writing ``dst``.

    Marked directories beside ``dst`` whose process has ended are removed. If ``dst`` is missing (a
    crash between the two renames of a replacement), the replaced checkpoint is renamed back first.
    """
    parent = dst.parent
    if not parent.is_dir():
        return
    prefixes = (f".{dst.name}.{STAGING}-", f".{dst.name}.{REPLACED}-")
    leftovers: list[tuple[Path, Marker]] = []
    for path in parent.iterdir():
        if path.name.startswith(prefixes) and path.is_dir() and not path.is_symlink():
            marker = _read_marker(path)
            if marker is not None and marker.dst == dst.name and marker.owner.ended():
                leftovers.append((path, marker))
    if not dst.exists() and not dst.is_symlink():
        complete = [p for p, m in leftovers if m.role is Role.OLD]
        if complete:
            latest = max(complete, key=lambda p: p.stat().st_mtime)
            os.rename(latest, dst)
            leftovers = [(p, m) for p, m in leftovers if p != latest]
    if dst.is_dir():
        marker = _read_marker(dst)
        if marker is not None and marker.dst == dst.name and marker.owner.ended():
            _drop_marker(dst)
    else:  # a replaced checkpoint is only deleted once something stands at dst
        leftovers = [(p, m) for p, m in leftovers if m.role is not Role.OLD]
    for path, _ in leftovers:
        _remove(path)
