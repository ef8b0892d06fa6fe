"""Dagster's own CLI from the repository root finds the definitions (``[tool.dagster]`` in pyproject.toml).

``dagster dev`` with no arguments resolves its target exactly as ``dagster definitions validate`` does
(``-m``/``-f``/``-w`` absent, no workspace.yaml: the ``[tool.dagster]`` block), and validating is what
can be run to the end in a test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dagster_cli_without_arguments_loads_this_project_from_the_repository_root(tmp_path: Path) -> None:
    dagster = Path(sys.executable).with_name("dagster")
    if not dagster.exists():
        pytest.skip(f"no dagster executable beside {sys.executable}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAJLAKE_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(tmp_path), TRAJLAKE_HOME=str(tmp_path / "lake"))
    done = subprocess.run(
        [str(dagster), "definitions", "validate"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Validation successful for code location dagster_project.definitions" in done.stderr + done.stdout
