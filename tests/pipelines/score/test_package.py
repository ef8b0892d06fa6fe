"""The package's shape: stages import one way (orchestrator on top, shared helpers below), and stay small."""

from __future__ import annotations

import ast
from graphlib import TopologicalSorter
from pathlib import Path

import pipelines.score

PACKAGE = Path(pipelines.score.__file__).parent
#: Shared by the stages: they import no stage and not the orchestrator.
HELPERS = {"predicates", "stats", "store"}


def imports_within(path: Path) -> set[str]:
    """The modules of the package that ``path`` imports (at any depth of its code)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipelines.score"):
            module = node.module.removeprefix("pipelines.score").lstrip(".")
            if module:
                found.add(module.split(".")[0])
            else:  # ``from pipelines.score import stage``
                found |= {alias.name for alias in node.names if (PACKAGE / f"{alias.name}.py").exists()}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("pipelines.score.")}
    return found


def graph() -> dict[str, set[str]]:
    return {path.stem: imports_within(path) for path in PACKAGE.glob("*.py") if path.stem != "__init__"}


def test_the_modules_import_each_other_without_a_cycle() -> None:
    imports = graph()
    TopologicalSorter(imports).prepare()  # raises CycleError on a cycle
    assert not [module for module, imported in imports.items() if "run" in imported]  # run orders the stages


def test_shared_helpers_import_no_stage() -> None:
    for module, imported in graph().items():
        if module in HELPERS:
            assert imported <= HELPERS, (module, imported - HELPERS)


def test_no_module_outgrows_one_concern() -> None:
    for path in PACKAGE.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 600, path.name


def test_callers_import_what_they_did_from_the_package() -> None:
    for name in (
        "SCORED_SNAPSHOT",
        "SCORED_VERSION",
        "ScoreStats",
        "index_days",
        "load_inputs",
        "quality_config",
        "score_all",
        "scoring_manifest",
    ):
        assert name in pipelines.score.__all__ and hasattr(pipelines.score, name), name
