"""Layering of the package, read from the source (``ast``), not from what happens to be imported.

Rules:

* ``transforms/`` (cores and PTransforms) never imports ``pipelines/`` or ``runners/``;
* ``schemas/`` imports nothing else of beamsynth (it is the bottom layer);
* no import cycle among beamsynth modules, function-level imports included (``transforms/``
  too: ``privbayes`` imports ``refine``, never the reverse);
* ``pipelines/`` is layered ``io`` < ``methods`` < ``releases`` < ``cli``: a subpackage imports only
  those before it; the modules at the top of ``pipelines/`` (``job``, ``stream``,
  ``yaml_transforms``, ``schema_draft``) stand on ``io`` and ``methods``, and nothing but ``cli``
  imports ``cli``;
* no import cycle between packages (each ``pipelines/`` subpackage and top module counted as one);
* every ``pipelines/`` subpackage's ``__init__`` docstring names each of its modules, and every
  package folder is listed in ``pyproject.toml`` (else a wheel ships without it).

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
P = "beamsynth.pipelines"
SUBPACKAGES = (f"{P}.io", f"{P}.methods", f"{P}.releases", f"{P}.cli")  # bottom to top
TOP_MODULES = (f"{P}.job", f"{P}.stream", f"{P}.yaml_transforms", f"{P}.yaml_stats", f"{P}.schema_draft")
FORBIDDEN = {
    "beamsynth.transforms": ("beamsynth.pipelines", "beamsynth.runners"),
    "beamsynth.schemas": ("beamsynth.transforms", "beamsynth.pipelines", "beamsynth.runners"),
    f"{P}.io": (f"{P}.methods", f"{P}.releases", f"{P}.cli", *TOP_MODULES),
    f"{P}.methods": (f"{P}.releases", f"{P}.cli", *TOP_MODULES),
    f"{P}.releases": (f"{P}.cli", *TOP_MODULES),
    **{top: (f"{P}.releases", f"{P}.cli") for top in TOP_MODULES},
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


def package_of(module: str) -> str:
    """The node of ``module`` in the package graph: its ``pipelines/`` subpackage, or the module
    itself at the top of ``pipelines/``, or its installed folder (``beamsynth.transforms``, ...)."""
    for sub in SUBPACKAGES:
        if module == sub or module.startswith(sub + "."):
            return sub
    if module.startswith(P + "."):
        return ".".join(module.split(".")[:3])
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[1:2] and parts[1] in PACKAGES else module


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """``graph`` with every module replaced by :func:`package_of` (edges inside a node dropped)."""
    out: dict[str, dict[str, int]] = {}
    for name, edges in graph.items():
        node = out.setdefault(package_of(name), {})
        for target, line in edges.items():
            if package_of(target) != package_of(name):
                node.setdefault(package_of(target), line)
    return out


def test_the_package_is_found(graph):
    # a wrong ROOT or folder map would make the checks below pass vacuously
    assert {"beamsynth.transforms.noise", "beamsynth.schemas.schema", "beamsynth.pipelines.cli.main",
            "beamsynth.pipelines.io.read", "beamsynth.pipelines.methods.registry",
            "beamsynth.pipelines.releases.release", "beamsynth.pipelines.job",
            "beamsynth.runners.presets"} <= set(graph)
    assert "beamsynth.schemas.schema" in graph["beamsynth.transforms.measure"]
    assert "beamsynth.transforms.refine" in graph["beamsynth.transforms.privbayes_plan"]
    assert {f"{P}.io", f"{P}.methods"} <= set(package_graph(graph)[f"{P}.releases"])


def test_no_layer_violations(graph):
    assert layer_violations(graph) == []


def test_no_import_cycles(graph):
    assert find_cycles(graph) == []


def test_no_import_cycles_between_packages(graph):
    assert find_cycles(package_graph(graph)) == []


def test_every_pipelines_subpackage_names_its_modules():
    for sub in SUBPACKAGES:
        folder = ROOT / "pipelines" / sub.rsplit(".", 1)[1]
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        missing = [p.stem for p in sorted(folder.glob("*.py"))
                   if p.stem != "__init__" and f"{sub}.{p.stem}" not in doc]
        assert missing == [], f"{sub}/__init__.py docstring does not name {missing}"


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
        "    from beamsynth.pipelines.io.read import ReadRecords\n"
        "class C:\n"
        "    def g(self):\n"
        "        try:\n"
        "            import beamsynth.runners.presets\n"
        "        except ImportError:\n"
        "            pass\n"
    )
    names = {n for n, _ in imported_names(source)}
    assert {"beamsynth.schemas.schema", "beamsynth.transforms.budget", "beamsynth.pipelines.io.read",
            "beamsynth.pipelines.io.read.ReadRecords", "beamsynth.runners.presets"} <= names
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


def test_pipelines_layers_and_package_cycles_on_a_made_up_graph():
    graph = {
        "beamsynth.pipelines.io.read": {"beamsynth.pipelines.cli.main": 5},
        "beamsynth.pipelines.cli.main": {"beamsynth.pipelines.io.planning": 2,
                                         "beamsynth.pipelines.releases.release": 3},
        "beamsynth.pipelines.io.planning": {},
        "beamsynth.pipelines.releases.release": {"beamsynth.pipelines.methods.registry": 8},
        "beamsynth.pipelines.methods.registry": {"beamsynth.pipelines.stream": 4},
        "beamsynth.pipelines.stream": {"beamsynth.pipelines.methods.synthesize": 6},
        "beamsynth.pipelines.methods.synthesize": {},
    }
    assert find_cycles(graph) == []  # no module cycle ...
    assert sorted(find_cycles(package_graph(graph))) == [  # ... but two between packages
        ["beamsynth.pipelines.cli", "beamsynth.pipelines.io"],
        ["beamsynth.pipelines.methods", "beamsynth.pipelines.stream"]]
    assert layer_violations(graph) == [
        "beamsynth.pipelines.io.read:5 imports beamsynth.pipelines.cli.main",
        "beamsynth.pipelines.methods.registry:4 imports beamsynth.pipelines.stream",
    ]


def test_every_package_folder_is_packaged():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert {tool["package-dir"][p] for p in PACKAGES.values()} == set(PACKAGES)
    found = {".".join([PACKAGES[folder], *init.parent.relative_to(ROOT / folder).parts]).rstrip(".")
             for folder in PACKAGES for init in (ROOT / folder).rglob("__init__.py")}
    assert {"beamsynth.pipelines.io", "beamsynth.pipelines.cli"} <= found
    assert sorted(found - set(tool["packages"])) == []
