"""The house's layout, as a newcomer reads it: every module of `dart_ray/` lives in a package
named for what it owns (but the command line and the record foundations), and the import
graph of `dart_ray/`, `actors/` and `serve_apps/` has no circle, lazy imports included (a
circle means two modules that cannot be read, tested or moved apart)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("dart_ray", "actors", "serve_apps")
LOOSE_ALLOWED = {"cli.py", "__init__.py", "records.py", "arrays.py"}
"""`dart-ray`'s entry point, and the records every package builds on (`arrays` is the
columnar half of `records`); `config/` is a package of its own."""


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


def _imports(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports, anywhere in it (functions included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            while n and n not in known:  # `from pkg import name`: the package's __init__
                n = n.rpartition(".")[0]
            if n:
                out.add(n)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    graph = {m: _imports(p, known) - {m} for m, p in mods.items()}
    # a package's __init__ is not an arrow for its own submodules (importing `pkg.sub` runs
    # `pkg/__init__` first by Python's rules, not by the module's choice)
    for m, deps in graph.items():
        graph[m] = {d for d in deps if not m.startswith(d + ".")}
    return graph


def test_the_import_graph_has_no_circle() -> None:
    assert _circles(_graph()) == []


def test_a_circle_would_be_found() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_lives_in_a_package() -> None:
    loose = sorted(p.name for p in (REPO / "dart_ray").glob("*.py"))
    assert [n for n in loose if n not in LOOSE_ALLOWED] == []
    for pkg in (REPO / "dart_ray").iterdir():
        if pkg.is_dir() and (pkg / "__init__.py").is_file():
            doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text()))
            assert doc, f"dart_ray/{pkg.name}/__init__.py says nothing of what it owns"
