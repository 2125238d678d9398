"""Rules the source tree keeps (STYLE.md): short files, no private names reached across modules, no import circle
(imports inside functions included), and the launch parameters spelled once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "anyfp4"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in module ``name``, at any depth."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("anyfp4")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("anyfp4"):
                found.append((target, [a.name for a in node.names], node.lineno))
    return found


def edges(name: str) -> set[str]:
    out = set()
    for target, names, _ in imports(name):
        subs = {f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES}
        out |= subs
        if not subs or len(subs) < len(names):
            out.add(target)
    return {t for t in out if t in MODULES and t != name}


@pytest.mark.parametrize("path", [p for p in PACKAGE.rglob("*.py")], ids=lambda p: str(p.relative_to(SRC)))
def test_files_are_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(SRC)} has {lines} lines (at most {MAX_LINES})"


def test_no_private_names_across_modules():
    reached = [f"{MODULES[name].relative_to(SRC)}:{line} takes {n} from {target}"
               for name in MODULES for target, names, line in imports(name)
               for n in names if n.startswith("_") and not n.startswith("__") and target != name]
    assert reached == []


def test_no_import_circle():
    graph = {name: edges(name) for name in MODULES}
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own submodules
            if state.get(nxt) == 1:
                circles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == []
