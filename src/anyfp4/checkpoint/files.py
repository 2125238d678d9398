"""Opening a checkpoint's files safely: regular files only, inside the checkpoint, JSON objects where JSON.

A FIFO or device named like a checkpoint file would block or stream forever when opened, a symbolic
link loop fails deep inside a library, and an index entry such as ``../../x.safetensors`` would read
outside the directory: each is refused here, before anything is opened, with the file named.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath

from .errors import CheckpointError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def regular_file(path: Path) -> bool:
    """True for a regular file (through symbolic links), False when nothing is there; anything else
    (a FIFO, a device, a directory, a broken or looping link) is refused."""
    if not os.path.lexists(path):
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise CheckpointError(f"cannot be opened: {e.strerror}", file=path) from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise CheckpointError(f"is {kind}, not a regular file; anyfp4 reads regular files only", file=path)
    return True


def check_entries(directory: Path) -> None:
    """Every top-level entry of a checkpoint directory is a directory or a regular file: the tokenizer
    loader (transformers) opens files by name, so a FIFO or a link loop anywhere there is refused first."""
    try:
        entries = sorted(directory.iterdir())
    except OSError as e:
        raise CheckpointError(f"cannot list the checkpoint directory: {e.strerror}", file=directory) from None
    for entry in entries:
        if entry.is_dir():
            continue
        regular_file(entry)


def inside(root: Path, relative: object, listed_in: Path) -> Path:
    """``root / relative`` for a path named inside a checkpoint file, refused unless it stays in ``root``
    (relative, no ``..``). Symbolic links inside ``root`` are followed, as Hugging Face caches use them."""
    if not isinstance(relative, str) or not relative:
        raise CheckpointError(f"a file name must be a non-empty string, found {relative!r}", file=listed_in)
    parts = PurePosixPath(relative).parts
    if PurePosixPath(relative).is_absolute() or Path(relative).is_absolute() or ".." in parts or "\\" in relative:
        raise CheckpointError(f"file {relative!r} lies outside the checkpoint directory; only paths inside it "
                              "are read", file=listed_in)
    return root / relative


def read_json_object(path: Path) -> dict:
    """A JSON file that must hold an object (a dict), read after the regular-file check."""
    if not regular_file(path):
        raise CheckpointError("file not found", file=path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(f"not UTF-8 text: {e.reason}", file=path) from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"not valid JSON: {e}", file=path) from None
    except (OSError, RecursionError) as e:
        raise CheckpointError(f"cannot be read as JSON: {e}", file=path) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"expected a JSON object, found {type(data).__name__}", file=path)
    return data
