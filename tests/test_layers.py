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
