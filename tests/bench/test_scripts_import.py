"""Every script under benchmarks/ imports (its names resolve) without running: the GPU stages run them on a
device machine, where a bad import costs a whole call."""

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "benchmarks").rglob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_benchmark_script_imports(path):
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
