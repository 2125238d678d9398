"""Every environment variable anyfp4 reads, in one place (documented in README.md)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted demo checkpoints live: ``$ANYFP4_CACHE``, else ``$XDG_CACHE_HOME/anyfp4``, else ~/.cache/anyfp4."""
    explicit = os.environ.get("ANYFP4_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "anyfp4"
