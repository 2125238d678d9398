"""Which directories ``quantize_checkpoint`` may write to, and which an existing one it may replace.

The checkpoint is built beside its destination and swapped in (``replace``), so the destination
must be a directory of its own: never the source, a folder holding the source or inside it, the
current directory or one above it, the home directory or ``/``. An existing non-empty destination
is replaced only when it is a checkpoint and the caller passed ``force``: replacing deletes the
whole directory, so anything else (a parent folder, a project) is refused even then.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import CheckpointError
from .quant_config import CONFIG

# Subdirectories a downloaded Hugging Face checkpoint may hold next to its files.
CHECKPOINT_SUBDIRS = {".cache", "original"}


def resolve_destination(src: Path, dst: Path) -> Path:
    """``dst`` as an absolute path with symlinks resolved, once it is known to be a directory of its own."""
    source, target = src.resolve(), dst.resolve()

    def refuse(why: str):
        return CheckpointError(f"refusing to write the checkpoint there: {why}", file=dst)

    if target == source:
        raise refuse("it is the source checkpoint")
    if target.parent == target:
        raise refuse("it is the root directory")
    if target == Path.home().resolve():
        raise refuse("it is the home directory")
    if Path.cwd().resolve().is_relative_to(target):
        raise refuse("it is the current directory or holds it; give a directory of its own")
    if source.is_relative_to(target):
        raise refuse(f"it holds the source checkpoint {src}")
    if target.is_relative_to(source):
        raise refuse(f"it is inside the source checkpoint {src}")
    return target


def not_a_checkpoint(path: Path) -> str | None:
    """Why the directory ``path`` does not look like a Hugging Face / ModelOpt / anyfp4 checkpoint
    (None when it does): ``config.json``, safetensors weights, no other subdirectories."""
    config = path / CONFIG
    if not config.is_file():
        return f"it has no {CONFIG}"
    try:
        if not isinstance(json.loads(config.read_text()), dict):
            return f"its {CONFIG} is not a JSON object"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return f"its {CONFIG} is not valid JSON"
    entries = list(path.iterdir())
    if not any(e.is_file() and e.name.endswith(".safetensors") for e in entries):
        return "it has no .safetensors weights"
    for entry in sorted(entries):
        if entry.is_dir() and entry.name not in CHECKPOINT_SUBDIRS:
            return f"it holds the directory {entry.name!r}"
    return None


def check_replaceable(dst: Path, shown: Path, force: bool) -> None:
    """Refuse an existing ``dst`` that must not be replaced; ``shown`` is the path as the user gave it."""
    if not dst.exists():
        return
    if not dst.is_dir():
        raise CheckpointError("destination exists and is not a directory", file=shown)
    if not any(dst.iterdir()):
        return
    reason = not_a_checkpoint(dst)
    if reason is not None:
        raise CheckpointError(f"destination is not empty and is not a checkpoint ({reason}); --force replaces "
                              f"only a checkpoint directory: give a new or empty directory", file=shown)
    if not force:
        raise CheckpointError("destination is not empty (it holds a checkpoint); pass --force to replace it",
                              file=shown)
