"""Start-up stays short: what ``trajlake --help`` and a query over local tiers import.

Timings are measured by ``trajlake bench startup`` (against ``python -c pass`` in the same run);
these tests hold the property behind them, which a stray top-level import breaks: the command line
module imports the CLI framework and nothing of the data stack, and a query over local tiers
does not import the object-store filesystem.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("pydantic", "pydantic_settings", "pyiceberg", "pyarrow", "duckdb", "polars", "sqlalchemy", "dagster")


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_the_command_line_module_imports_no_data_stack() -> None:
    loaded = _modules_after("import trajlake.cli")
    assert sorted(m for m in HEAVY if m in loaded) == []
    assert "typer" in loaded  # the framework itself, needed to build the commands


def test_help_imports_no_data_stack() -> None:
    code = (
        "from trajlake.cli import app\ntry:\n    app(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
    )
    loaded = _modules_after(code)
    assert sorted(m for m in HEAVY if m in loaded) == []


def test_a_local_query_does_not_import_the_object_store_filesystem() -> None:
    loaded = _modules_after("import warehouse.sql")
    assert "fsspec" not in loaded and "warehouse.object_store_fs" not in loaded


#: What opening the views through the catalog imports, and a query from the view plan does not.
CATALOG_STACK = ("pyiceberg", "sqlalchemy", "pandas")


@pytest.mark.slow
def test_a_query_from_the_view_plan_imports_no_catalog_stack(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    setup = (
        "from common.settings import load_settings\nfrom warehouse.sql import open_views\n"
        f"open_views(load_settings(home={home!r}), save_plan=True).close()"
    )
    subprocess.run([sys.executable, "-c", setup], check=True, timeout=120)
    query = (
        "from common.settings import load_settings\nfrom warehouse.view_plan import open_planned_views\n"
        f"con = open_planned_views(load_settings(home={home!r}))\nassert con is not None\n"
        "con.execute('SELECT count(*) FROM events JOIN scores USING (session_id)').fetchall()"
    )
    assert sorted(m for m in CATALOG_STACK if m in _modules_after(query)) == []
    # The command's own process never imports it (the query's process does, when the plan is not current).
    command = (
        f"import os\nos.environ['TRAJLAKE_HOME'] = {home!r}\nfrom trajlake.cli import app\n"
        "try:\n    app(['sql', 'SELECT 1'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
    )
    assert sorted(m for m in CATALOG_STACK if m in _modules_after(command)) == []
