"""The launch tables of the decode kernels, and the one reader of table files.

A table is a JSON file under ``dispatch/tables/`` (package data), one per kernel and GPU, in the shape that
``benchmarks/probes/mma_sweep.py`` writes (the shape of an ``ANYFP4_MMA_TABLE`` file)::

    {"sm": 90, "sources": ["benchmarks/results/....json"], "note": "how the entries were chosen",
     "sweep": [{"format": "nvfp4", "k": 4096, "n": 4096, "m": 1, "best_cfg": {"mt": 1, "warps": 8, ...}}],
     "gated": [...]}

``sweep`` holds plain layers, ``gated`` the gate + up layers (both ``format`` only in the CUDA kernel's
tables); ``best_cfg`` names the fields of the kernel's launch config (``dispatch.configs``); ``m`` is taken to
its M bucket. Files are read at first use, never at import.
"""

from __future__ import annotations

import functools
import json
from dataclasses import fields
from importlib import resources

from .configs import DecodeConfig, MMAConfig

# The M keys of every table: a call of M rows uses the smallest bucket >= M.
M_BUCKETS = (1, 2, 4, 8, 16, 32)

# (sm, format, gated, K, N, M bucket) -> MMAConfig: the CUDA tensor-core decode kernel (kernels/cuda/weight_mma.py)
MMAKey = tuple[int, str, bool, int, int, int]
# (sm, K, N, M bucket) -> DecodeConfig: the Triton tensor-core decode kernel (kernels/triton/nvfp4_decode.py)
DecodeKey = tuple[int, int, int, int]

MMA_TABLE_FILES = ("cuda_mma_h200.json",)
DECODE_TABLE_FILES = ("triton_decode_h200.json",)


def m_bucket(m: int) -> int:
    return next(b for b in M_BUCKETS if b >= m)


def _config(entry: dict, config_type):
    """``entry["best_cfg"]`` as a ``config_type`` (a field not named takes its default; extra keys ignored)."""
    cfg = entry["best_cfg"]
    return config_type(**{f.name: int(cfg[f.name]) for f in fields(config_type) if f.name in cfg})


def mma_entries(report: dict) -> dict[MMAKey, MMAConfig]:
    """The CUDA kernel's table entries of a sweep report (a table file or an ``ANYFP4_MMA_TABLE`` file)."""
    sm = int(report["sm"])
    table = {}
    for gated, rows in ((False, report.get("sweep", [])), (True, report.get("gated", []))):
        for r in rows:
            table[(sm, r["format"], gated, int(r["k"]), int(r["n"]), m_bucket(int(r["m"])))] = _config(r, MMAConfig)
    return table


def decode_entries(report: dict) -> dict[DecodeKey, DecodeConfig]:
    """The Triton decode kernel's table entries of a table file."""
    sm = int(report["sm"])
    return {(sm, int(r["k"]), int(r["n"]), m_bucket(int(r["m"]))): _config(r, DecodeConfig)
            for r in report.get("sweep", [])}


def read_packaged(name: str) -> dict:
    """A table file shipped in ``dispatch/tables/``."""
    return json.loads(resources.files("anyfp4.dispatch").joinpath("tables", name).read_text())


@functools.cache
def builtin_mma_table() -> dict[MMAKey, MMAConfig]:
    table: dict[MMAKey, MMAConfig] = {}
    for name in MMA_TABLE_FILES:
        table.update(mma_entries(read_packaged(name)))
    return table


@functools.cache
def builtin_decode_table() -> dict[DecodeKey, DecodeConfig]:
    table: dict[DecodeKey, DecodeConfig] = {}
    for name in DECODE_TABLE_FILES:
        table.update(decode_entries(read_packaged(name)))
    return table


@functools.lru_cache(maxsize=None)
def user_mma_table(path: str) -> dict[MMAKey, MMAConfig]:
    """The best configs of a ``benchmarks/probes/mma_sweep.py`` output file (``ANYFP4_MMA_TABLE``)."""
    try:
        with open(path) as f:
            return mma_entries(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"ANYFP4_MMA_TABLE={path}: not a launch-sweep file of benchmarks/probes/mma_sweep.py "
                         f"({type(e).__name__}: {e})") from e
