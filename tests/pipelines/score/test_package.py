"""The package's shape: the orchestrator on top, the stages below it, the shared helpers at the bottom.

Circles between its files are :mod:`tests.test_layers`' concern (for every package); this keeps the
direction within the package.
"""

from __future__ import annotations

from pathlib import Path

import pipelines.score
from tests.test_layers import ROOT, module_graph

PACKAGE = Path(pipelines.score.__file__).parent
#: Shared by the stages: they import no stage and not the orchestrator.
HELPERS = {"predicates", "stats", "store"}


def graph() -> dict[str, set[str]]:
    """Module (short name) → the modules of the package it imports; the package ``__init__`` left out."""
    prefix = "pipelines.score."
    return {
        module.removeprefix(prefix): {m.removeprefix(prefix) for m in imported if m.startswith(prefix)}
        for module, imported in module_graph(ROOT, "pipelines").items()
        if module.startswith(prefix)
    }


def test_only_the_package_imports_the_orchestrator() -> None:
    imports = graph()
    assert "run" in imports and len(imports) == len(list(PACKAGE.glob("*.py"))) - 1
    assert [module for module, imported in imports.items() if "run" in imported] == []


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
