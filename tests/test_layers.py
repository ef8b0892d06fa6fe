"""Imports point one way: common ← schemas ← warehouse, quality, producers ← pipelines ← CLI, Dagster, benchmarks.

Every import in every module counts, including those inside functions and under
``TYPE_CHECKING``: a function-level import hides a cycle from Python, not from this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_BELOW_PIPELINES = {"common", "schemas", "warehouse", "quality", "producers"}
#: Which trajlake packages each package may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "schemas": {"common"},
    # The three middle packages are stages of their own: none imports another.
    "warehouse": {"common", "schemas"},
    "quality": {"common", "schemas"},
    "producers": {"common", "schemas"},
    "pipelines": _BELOW_PIPELINES,
    "dagster_project": {*_BELOW_PIPELINES, "pipelines"},
    "benchmarks": {*_BELOW_PIPELINES, "pipelines"},
    "trajlake": {*_BELOW_PIPELINES, "pipelines", "benchmarks"},
}


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path`` that names a trajlake package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name.split(".")[0]) for name in names if name.split(".")[0] in ALLOWED]
    return found


def layer_violations(root: Path) -> list[str]:
    """Every import in ``root``'s packages that points up or sideways, as ``file:line: a imports b``."""
    problems = []
    for package, allowed in ALLOWED.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, target in imported_packages(path):
                if target != package and target not in allowed:
                    problems.append(f"{path.relative_to(root)}:{line}: {package} imports {target}")
    return problems


def test_every_package_is_covered() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == set(ALLOWED)


@pytest.mark.slow
def test_imports_point_one_way() -> None:
    assert layer_violations(ROOT) == []


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("warehouse", "from pipelines.settings import Settings", "warehouse/bad.py:1: warehouse imports pipelines"),
        ("common", "import schemas.registry", "common/bad.py:1: common imports schemas"),
        ("quality", "def f():\n    from producers.sdk import Event", "quality/bad.py:2: quality imports producers"),
        ("producers", "from warehouse.sql import open_views", "producers/bad.py:1: producers imports warehouse"),
        ("pipelines", "from trajlake.cli import app", "pipelines/bad.py:1: pipelines imports trajlake"),
    ],
)
def test_an_upward_or_sideways_import_is_reported(tmp_path: Path, package: str, source: str, expected: str) -> None:
    (tmp_path / package).mkdir()
    (tmp_path / package / "bad.py").write_text(source + "\n")
    assert layer_violations(tmp_path) == [expected]


# --- No circle between the files of a package -------------------------------------------------
#
# Nodes are modules (``pkg/a/b.py`` → ``pkg.a.b``, ``pkg/a/__init__.py`` → ``pkg.a``); an edge is
# an import of one module by another of the same top-level package, wherever it stands (function
# body, ``TYPE_CHECKING``, relative or absolute). How an import becomes an edge:
#
# * ``import pkg.a.b`` and ``from pkg.a import b`` where ``b`` is a module: an edge to ``pkg.a.b``.
#   Python also runs the parent packages' ``__init__`` files on the way; those implicit imports are
#   not edges (otherwise every package whose ``__init__`` re-exports a submodule would be a circle).
# * ``from pkg.a import name`` where ``name`` is not a module: an edge to the module that defines
#   ``name``. A re-export in ``pkg/a/__init__.py`` (``from pkg.a.impl import name``) is followed to
#   ``pkg.a.impl``, so a submodule importing a sibling *through* the package depends on that sibling,
#   not on the ``__init__`` — and a real circle through a re-export is still found.
# * ``import pkg.a`` (a package, no name) is an edge to its ``__init__``.


def module_name(root: Path, path: Path) -> str:
    """``pkg/a/b.py`` → ``pkg.a.b``; ``pkg/a/__init__.py`` → ``pkg.a``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module named by a (possibly relative) ``from … import``."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _imports(root: Path, path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) for every import in ``path``, relative ones made absolute."""
    module, is_package = module_name(root, path), path.name == "__init__.py"
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_package, node)
            found += [(node.lineno, source, alias.name) for alias in node.names]
    return found


def module_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """Edges ``{importer: {imported: line}}`` between the modules of ``package`` (rules above)."""
    paths = {module_name(root, p): p for p in sorted((root / package).rglob("*.py"))}
    imports = {m: _imports(root, p) for m, p in paths.items()}
    # What each package ``__init__`` re-exports: name → the module it imports it from.
    reexports = {
        m: {name: source for _, source, name in imports[m] if name is not None}
        for m, p in paths.items()
        if p.name == "__init__.py"
    }

    def origin(module: str, name: str, seen: frozenset[str] = frozenset()) -> str:
        """The module that defines ``name`` imported from ``module`` (through re-exports)."""
        if f"{module}.{name}" in paths:
            return f"{module}.{name}"
        source = reexports.get(module, {}).get(name)
        if source is None or source not in paths or source in seen:
            return module
        return origin(source, name, seen | {module})

    graph: dict[str, dict[str, int]] = {m: {} for m in paths}
    for module, found in imports.items():
        for line, source, name in found:
            target = source if name is None else origin(source, name)
            if target in paths and target != module:
                graph[module].setdefault(target, line)
    return graph


def module_cycles(root: Path) -> list[str]:
    """One circle per strongly connected set of modules in each package, as ``a:line → b:line → a``."""
    found = []
    for package in ALLOWED:
        if not (root / package).is_dir():
            continue
        graph = module_graph(root, package)
        for component in _strong_components(graph):
            if len(component) > 1:
                found.append(_describe(graph, _circle(graph, component)))
    return found


def _strong_components(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _circle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """A shortest circle through the first module of ``component`` (breadth-first)."""
    start = min(component)
    parents: dict[str, str] = {}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node]):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if child in component and child not in parents:
                parents[child] = node
                queue.append(child)
    raise AssertionError("a strongly connected component always has a circle")


def _describe(graph: dict[str, dict[str, int]], circle: list[str]) -> str:
    return " → ".join(f"{a}:{graph[a][b]}" for a, b in zip(circle, circle[1:], strict=False)) + f" → {circle[-1]}"


@pytest.mark.slow
def test_no_circle_between_the_files_of_a_package() -> None:
    assert module_cycles(ROOT) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # Two files importing each other, the import hidden in a function.
        (
            {
                "warehouse/a.py": "from warehouse.b import x",
                "warehouse/b.py": "def f():\n    from warehouse.a import y",
            },
            ["warehouse.a:1 → warehouse.b:2 → warehouse.a"],
        ),
        # Under TYPE_CHECKING, and relative.
        (
            {
                "quality/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import x",
                "quality/b.py": "from . import a",
            },
            ["quality.a:3 → quality.b:1 → quality.a"],
        ),
        # Through a package's re-export: impl imports sibling via the package, sibling imports impl.
        (
            {
                "producers/fleet/__init__.py": "from .impl import run\nfrom producers.fleet.sinks import Sink",
                "producers/fleet/impl.py": "from producers.fleet import Sink",
                "producers/fleet/sinks.py": "from .impl import run",
            },
            ["producers.fleet.impl:1 → producers.fleet.sinks:1 → producers.fleet.impl"],
        ),
        # Three files in a ring across subpackages.
        (
            {
                "pipelines/a.py": "import pipelines.sub.b",
                "pipelines/sub/__init__.py": "",
                "pipelines/sub/b.py": "from pipelines.c import z",
                "pipelines/c.py": "from pipelines import a",
            },
            ["pipelines.a:1 → pipelines.sub.b:1 → pipelines.c:1 → pipelines.a"],
        ),
    ],
)
def test_a_circle_between_files_is_reported(tmp_path: Path, files: dict[str, str], expected: list[str]) -> None:
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source + "\n")
    assert module_cycles(tmp_path) == expected


@pytest.mark.parametrize(
    "files",
    [
        # A package re-exporting its submodules, and a submodule importing a sibling through it.
        {
            "producers/fleet/__init__.py": "from .runner import run\nfrom producers.fleet.sinks import Sink",
            "producers/fleet/runner.py": "from producers.fleet import Sink",
            "producers/fleet/sinks.py": "X = 1",
        },
        # ``from . import sibling`` in a package whose __init__ imports that sibling.
        {
            "quality/cheats/__init__.py": "from .net import N",
            "quality/cheats/net.py": "from . import evidence",
            "quality/cheats/evidence.py": "E = 1",
        },
    ],
)
def test_reexports_through_a_package_are_no_circle(tmp_path: Path, files: dict[str, str]) -> None:
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source + "\n")
    assert module_cycles(tmp_path) == []


def imports_through_own_package(root: Path) -> list[str]:
    """Every module that takes a name from the ``__init__`` of a package it stands in, as ``file:line: a from b``.

    A package's ``__init__`` hands on what its modules define; a module inside it that imports from it
    reaches up to the package that imports the module (``producers.fleet.local`` once took ``EventSink``
    from ``producers.fleet``, whose factory imports ``local``). Taking a sibling *module* through the
    package (``from producers.fleet import sinks``) is no such reach.
    """
    problems = []
    for package in ALLOWED:
        for path in sorted((root / package).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            module = module_name(root, path)
            for line, source, name in _imports(root, path):
                owner = root / source.replace(".", "/")
                if name is None or not module.startswith(source + ".") or not (owner / "__init__.py").is_file():
                    continue
                if not ((owner / f"{name}.py").is_file() or (owner / name / "__init__.py").is_file()):
                    problems.append(f"{path.relative_to(root)}:{line}: {module} takes {name} from {source}")
    return problems


@pytest.mark.slow
def test_no_module_takes_names_from_its_own_package() -> None:
    assert imports_through_own_package(ROOT) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {
                "producers/fleet/__init__.py": "from producers.fleet.sinks import Sink",
                "producers/fleet/sinks.py": "Sink = 1",
                "producers/fleet/local.py": "from producers.fleet import Sink",
            },
            ["producers/fleet/local.py:1: producers.fleet.local takes Sink from producers.fleet"],
        ),
        (
            {
                "pipelines/__init__.py": "",
                "pipelines/score/__init__.py": "from .inputs import load",
                "pipelines/score/inputs.py": "load = 1",
                "pipelines/score/truth.py": "def f():\n    from . import load",
            },
            ["pipelines/score/truth.py:2: pipelines.score.truth takes load from pipelines.score"],
        ),
        (
            {
                "producers/fleet/__init__.py": "from producers.fleet.sinks import Sink",
                "producers/fleet/sinks.py": "Sink = 1",
                "producers/fleet/local.py": "from producers.fleet import sinks\nfrom producers.fleet.sinks import Sink",
            },
            [],
        ),
    ],
)
def test_a_name_taken_from_the_own_package_is_reported(
    tmp_path: Path, files: dict[str, str], expected: list[str]
) -> None:
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source + "\n")
    assert imports_through_own_package(tmp_path) == expected
