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
