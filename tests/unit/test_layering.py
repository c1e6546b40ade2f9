"""Layering of the package, read from the source (``ast``), not from what happens to be imported.

Rules:

* ``transforms/`` (cores and PTransforms) never imports ``pipelines/`` or ``runners/``;
* ``schemas/`` imports nothing else of beamsynth (it is the bottom layer);
* no import cycle among beamsynth modules, function-level imports included.

Imports under ``if TYPE_CHECKING:`` are annotations only (never executed) and are not counted:
``schemas/domains.py`` names ``RandomSource`` in its signatures that way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# source folder -> the package it installs as (pyproject.toml [tool.setuptools] package-dir)
PACKAGES = {"transforms": "beamsynth.transforms", "schemas": "beamsynth.schemas",
            "pipelines": "beamsynth.pipelines", "runners": "beamsynth.runners", "api": "beamsynth"}
FORBIDDEN = {
    "beamsynth.transforms": ("beamsynth.pipelines", "beamsynth.runners"),
    "beamsynth.schemas": ("beamsynth.transforms", "beamsynth.pipelines", "beamsynth.runners"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(source: str) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of every absolute import in ``source`` at any depth (functions,
    classes, ``try`` blocks), except those under ``if TYPE_CHECKING:``. ``from a.b import c``
    gives both ``a.b`` and ``a.b.c`` (``c`` may be a submodule)."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
            out.extend((f"{node.module}.{alias.name}", node.lineno) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``{module: {imported beamsynth module: first line}}``; the root package counts only when
    imported by name (``import beamsynth``), not as the parent of every submodule."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        for target, line in imported_names(path.read_text(encoding="utf-8")):
            if target in modules and target != name:
                edges.setdefault(target, line)
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """``"module:line imports target"`` for every import a layer may not make."""
    out = []
    for name, edges in sorted(graph.items()):
        for layer, banned in FORBIDDEN.items():
            if name == layer or name.startswith(layer + "."):
                out.extend(f"{name}:{line} imports {target}" for target, line in sorted(edges.items())
                           if any(target == b or target.startswith(b + ".") for b in banned))
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return import_graph(_modules())


def test_the_package_is_found(graph):
    # a wrong ROOT or folder map would make both checks below pass vacuously
    assert {"beamsynth.transforms.noise", "beamsynth.schemas.schema", "beamsynth.pipelines.cli",
            "beamsynth.runners.presets"} <= set(graph)
    assert "beamsynth.schemas.schema" in graph["beamsynth.transforms.measure"]


def test_no_layer_violations(graph):
    assert layer_violations(graph) == []


def test_no_import_cycles(graph):
    assert find_cycles(graph) == []


# -- the checks themselves can fail ---------------------------------------------------------------
def test_imports_found_at_every_depth_but_not_type_checking():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import beamsynth.schemas.schema\n"
        "if TYPE_CHECKING:\n"
        "    from beamsynth.transforms.noise import RandomSource\n"
        "else:\n"
        "    import beamsynth.transforms.budget\n"
        "def f():\n"
        "    from beamsynth.pipelines.io import ReadRecords\n"
        "class C:\n"
        "    def g(self):\n"
        "        try:\n"
        "            import beamsynth.runners.presets\n"
        "        except ImportError:\n"
        "            pass\n"
    )
    names = {n for n, _ in imported_names(source)}
    assert {"beamsynth.schemas.schema", "beamsynth.transforms.budget", "beamsynth.pipelines.io",
            "beamsynth.pipelines.io.ReadRecords", "beamsynth.runners.presets"} <= names
    assert "beamsynth.transforms.noise" not in names


def test_cycle_and_violation_detection_on_a_made_up_graph():
    graph = {
        "beamsynth.transforms.a": {"beamsynth.transforms.b": 3},
        "beamsynth.transforms.b": {"beamsynth.transforms.c": 4, "beamsynth.pipelines.io": 9},
        "beamsynth.transforms.c": {"beamsynth.transforms.a": 5},
        "beamsynth.schemas.s": {"beamsynth.transforms.noise": 7},
        "beamsynth.pipelines.io": {"beamsynth.schemas.s": 1},
        "beamsynth.transforms.noise": {},
    }
    assert find_cycles(graph) == [["beamsynth.transforms.a", "beamsynth.transforms.b",
                                   "beamsynth.transforms.c"]]
    assert layer_violations(graph) == [
        "beamsynth.schemas.s:7 imports beamsynth.transforms.noise",
        "beamsynth.transforms.b:9 imports beamsynth.pipelines.io",
    ]
