"""The launch tables as JSON files (dispatch/tables/, dispatch/launch_tables.py): the lookups give the configs the
tables held as Python literals before (spot checks written out with named fields, table hits and heuristic
fallbacks alike), every table names the results it came from, and nothing is read at import."""

import json
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from anyfp4.dispatch import launch_tables
from anyfp4.dispatch.configs import DecodeConfig, MMAConfig
from anyfp4.dispatch.tuning import decode_config, mma_config

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "src" / "anyfp4" / "dispatch" / "tables"


def padded(k: int) -> int:
    return -(-k // 256) * 256


# (sm, sms, format, gated, K, N, M, split_k argument) -> what mma_config gave with the literal tables (the first
# five: the K-warp re-sweep of 2026-12-01, results/nvfp4_mma_sweep_kw_h200.json; 4096x4096 and gated 2x14336x4096
# from the slice re-sweep, results/nvfp4_mma_sweep_slices_h200.json; wgmma: the warpgroup-mma sweep of 2026-12-07,
# results/nvfp4_mma_sweep_wgmma_h100.json)
MMA_CASES = [
    ((90, 132, "nvfp4", False, 4096, 4096, 1, 0), MMAConfig(mt=1, warps=8, split_k=4, depth=2, kw=2)),
    ((90, 132, "nvfp4", False, 4096, 4096, 2, 0), MMAConfig(mt=1, warps=4, split_k=8, depth=2)),  # M = 1's slices
    ((90, 132, "nvfp4", False, 4096, 4096, 7, 0), MMAConfig(mt=1, warps=8, split_k=8, depth=4, wgmma=1)),  # bucket 8
    ((90, 132, "nvfp4", False, 4096, 14336, 1, 0), MMAConfig(mt=2, warps=8, split_k=2, depth=2, kw=2)),
    ((90, 132, "nvfp4", False, 4096, 14336, 32, 0), MMAConfig(mt=1, warps=8, split_k=4, depth=2, wgmma=1)),
    ((90, 132, "nvfp4", False, 8192, 28672, 1, 0), MMAConfig(mt=1, warps=8, split_k=1, depth=8)),
    ((90, 132, "nvfp4", False, 8192, 28672, 3, 0), MMAConfig(mt=1, warps=8, split_k=1, depth=4)),  # bucket 4
    ((90, 132, "nvfp4", True, 4096, 14336, 1, 0), MMAConfig(mt=1, warps=8, split_k=2, depth=2)),
    ((90, 132, "nvfp4", True, 4096, 14336, 16, 0), MMAConfig(mt=1, warps=8, split_k=2, depth=2)),  # split of M = 1
    ((90, 132, "nvfp4", True, 4096, 7168, 8, 0), MMAConfig(mt=1, warps=8, split_k=8, depth=2)),
    ((90, 132, "fp8", False, 4096, 4096, 32, 0), MMAConfig(mt=1, warps=8, split_k=16, depth=4)),
    ((90, 132, "fp8", False, 5120, 62080, 16, 0), MMAConfig(mt=2, warps=4, split_k=1, depth=2)),
    ((90, 132, "fp8", False, 8192, 28672, 2, 0), MMAConfig(mt=1, warps=8, split_k=8, depth=4)),
    ((90, 132, "fp8", True, 4096, 14336, 2, 0), MMAConfig(mt=1, warps=4, split_k=8, depth=4)),
    ((90, 132, "fp8", False, 14336, 4096, 16, 3), MMAConfig(mt=2, warps=4, split_k=3, depth=2)),  # split named
    # no table entry: the heuristic
    ((90, 132, "nvfp4", False, 576, 1536, 1, 0), MMAConfig(mt=1, warps=8, split_k=1, depth=2)),
    ((90, 132, "nvfp4", False, 576, 1536, 20, 0), MMAConfig(mt=1, warps=8, split_k=1, depth=2)),
    ((90, 108, "nvfp4", False, 1040, 200, 1, 0), MMAConfig(mt=1, warps=8, split_k=2, depth=2)),
    ((90, 132, "fp8", True, 4096, 6144, 32, 0), MMAConfig(mt=1, warps=8, split_k=16, depth=2)),
    ((90, 132, "nvfp4", True, 4096, 6144, 1, 0), MMAConfig(mt=1, warps=8, split_k=8, depth=2)),
    ((80, 108, "nvfp4", False, 4096, 4096, 1, 0), MMAConfig(mt=1, warps=8, split_k=8, depth=2)),  # another GPU
    ((89, 132, "fp8", True, 4096, 14336, 8, 0), MMAConfig(mt=1, warps=8, split_k=4, depth=4)),
]

# (sm, sms, K, N, M) -> what decode_config gave with the literal table
DECODE_CASES = [
    ((90, 132, 4096, 4096, 1), DecodeConfig(block_n=64, block_k=128, split_k=8, num_warps=4, num_stages=3)),
    ((90, 132, 4096, 4096, 32), DecodeConfig(block_n=32, block_k=128, split_k=4, num_warps=4, num_stages=3)),
    ((90, 132, 14336, 4096, 17), DecodeConfig(block_n=128, block_k=128, split_k=8, num_warps=4, num_stages=3)),
    ((90, 132, 4352, 5120, 5), DecodeConfig(block_n=64, block_k=256, split_k=17, num_warps=4, num_stages=3)),
    ((90, 132, 5120, 62080, 32), DecodeConfig(block_n=32, block_k=128, split_k=1, num_warps=4, num_stages=3)),
    ((90, 132, 1536, 5120, 1), DecodeConfig(block_n=64, block_k=256, split_k=6, num_warps=4, num_stages=3)),
    # no table entry: the heuristic
    ((75, 80, 4096, 4096, 8), DecodeConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=3)),
    ((70, 80, 14336, 4096, 1), DecodeConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=3)),
    ((90, 132, 1040, 200, 3), DecodeConfig(block_n=32, block_k=256, split_k=5, num_warps=4, num_stages=3)),
    ((89, 132, 8192, 28672, 32), DecodeConfig(block_n=64, block_k=256, split_k=1, num_warps=4, num_stages=3)),
    ((90, 132, 4096, 6144, 8), DecodeConfig(block_n=64, block_k=256, split_k=4, num_warps=4, num_stages=3)),
]


@pytest.mark.parametrize("key, want", MMA_CASES, ids=lambda v: str(v))
def test_mma_lookups_are_unchanged(monkeypatch, key, want):
    monkeypatch.delenv("ANYFP4_MMA_TABLE", raising=False)
    sm, sms, fmt, gated, k, n, m, split = key
    assert mma_config(sm, sms, fmt, gated, n, k, padded(k), m, split) == want


@pytest.mark.parametrize("key, want", DECODE_CASES, ids=lambda v: str(v))
def test_decode_lookups_are_unchanged(key, want):
    sm, sms, k, n, m = key
    assert decode_config(sm, sms, n, k, padded(k), m) == want


def test_tables_hold_every_entry_they_held():
    mma, decode = launch_tables.builtin_mma_table(), launch_tables.builtin_decode_table()
    assert len(mma) == 144 and len(decode) == 54
    assert sum(1 for key in mma if key[2]) == 16  # gated entries
    assert mma[(90, "fp8", False, 5120, 12288, 1)] == MMAConfig(mt=1, warps=8, split_k=1, depth=2, kw=4)  # Qwen3.5
    assert {key[1] for key in mma} == {"nvfp4", "fp8"} and {key[0] for key in mma} == {90} == {k[0] for k in decode}
    assert mma[(90, "fp8", False, 8192, 28672, 4)] == MMAConfig(mt=1, warps=4, split_k=8, depth=8)
    assert mma[(90, "nvfp4", False, 2048, 4096, 8)] == MMAConfig(mt=1, warps=8, split_k=4, depth=2)
    assert decode[(90, 8192, 28672, 32)] == DecodeConfig(block_n=32, block_k=128, split_k=1, num_warps=4,
                                                         num_stages=3)


def test_every_table_file_names_its_results():
    names = set(launch_tables.MMA_TABLE_FILES + launch_tables.DECODE_TABLE_FILES)
    assert names == {p.name for p in TABLES.glob("*.json")}
    for name in names:
        report = json.loads((TABLES / name).read_text())
        assert report["sources"] and all((ROOT / s).is_file() for s in report["sources"]), name
        assert report["sm"] == 90 and report["note"]


def test_a_table_file_reads_as_a_user_table(tmp_path, monkeypatch):
    """The shipped table is in the shape of an ANYFP4_MMA_TABLE file: read as one, it changes nothing."""
    path = tmp_path / "table.json"
    path.write_text((TABLES / "cuda_mma_h200.json").read_text())
    assert launch_tables.user_mma_table(str(path)) == launch_tables.builtin_mma_table()
    monkeypatch.setenv("ANYFP4_MMA_TABLE", str(path))
    for (sm, sms, fmt, gated, k, n, m, split), want in MMA_CASES:
        assert mma_config(sm, sms, fmt, gated, n, k, padded(k), m, split) == want


def test_the_tables_ship_as_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "tables/*.json" in data["anyfp4.dispatch"]


def test_nothing_is_read_at_import():
    code = ("import anyfp4.ops, anyfp4.dispatch.tuning as t, anyfp4.dispatch.launch_tables as l; "
            "print(l.builtin_mma_table.cache_info().currsize, l.builtin_decode_table.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["0", "0"]


def test_warpgroup_entries_fall_back_to_mma_sync_where_nvrtc_cannot_compile_them(monkeypatch):
    """A CUDA 11.8 NVRTC (torch's cu118 wheels) has no sm_90a: the table's wgmma entries run as mma.sync (the same
    sums), the rest of the config unchanged."""
    from anyfp4.kernels.cuda import nvrtc

    monkeypatch.delenv("ANYFP4_MMA_TABLE", raising=False)
    key = (90, 132, "nvfp4", False, 4096, 14336, 32, 0)
    sm, sms, fmt, gated, k, n, m, split = key
    served = mma_config(sm, sms, fmt, gated, n, k, padded(k), m, split)
    assert served.wgmma == 1
    monkeypatch.setattr(nvrtc, "compiler_available", lambda: True)
    monkeypatch.setattr(nvrtc, "version", lambda: (11, 8))
    assert mma_config(sm, sms, fmt, gated, n, k, padded(k), m, split) == replace(served, wgmma=0)
    monkeypatch.setattr(nvrtc, "version", lambda: (12, 0))
    assert mma_config(sm, sms, fmt, gated, n, k, padded(k), m, split) == served
