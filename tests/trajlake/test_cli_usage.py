"""The command line as a newcomer meets it: typos, a wrong TRAJLAKE_HOME, and what it says back.

Usage errors run through the installed entry point (the ``trajlake`` script pip wrote), which is
what a fresh install runs: a typer release that changed how usage errors surface would print a
traceback here first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINT = Path(sys.executable).with_name("trajlake")


def run(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(ENTRY_POINT)] if ENTRY_POINT.exists() else [sys.executable, "-m", "trajlake.cli"]
    return subprocess.run([*command, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    return {**clean, "TRAJLAKE_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "COLUMNS": "200"}


def test_the_entry_point_is_the_installed_script() -> None:
    assert ENTRY_POINT.exists(), "pip install -e . writes the trajlake script next to the interpreter"


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (["exprot"], "Did you mean 'export'"),  # unknown command
        (["export", "--formt", "hf", "--out", "x"], "--format"),  # unknown option
        (["export", "--format", "parquet", "--out", "x"], "'hf', 'openai', 'sharegpt', 'rl', 'atif'"),  # bad choice
        (["fleet", "run", "--backend", "docker", "--sessions", "1"], "'local', 'synthetic'"),  # in a sub-command
        (["sql"], "Missing argument"),
    ],
    ids=["command", "option", "choice", "sub-command-choice", "missing-argument"],
)
def test_a_usage_error_is_one_line_with_the_suggestion_and_exit_2(
    args: list[str], suggestion: str, env: dict[str, str], tmp_path: Path
) -> None:
    result = run(*args, env=env, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert suggestion in lines[0] and "--help" in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "home").exists()  # a typo creates nothing


def test_installed_typer_is_within_the_tested_bounds() -> None:
    """The bounds in pyproject.toml are the versions this file's tests ran against; an upgrade past them
    (as typer 0.26 vendoring click was) must come with these tests passing on it."""
    requirements = [
        Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    typer = next(r for r in requirements if r.name == "typer")
    assert typer.specifier and any(s.operator == "<" for s in typer.specifier), "typer needs an upper bound"
    assert typer.specifier.contains(version("typer")), (version("typer"), str(typer.specifier))


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["sql", "SELECT 1"],
        ["export", "--format", "openai", "--out", "{out}"],
        ["show", "abc"],
        ["report", "--out", "{out}"],
        ["assemble"],
        ["score"],
    ],
    ids=lambda a: a[0],
)
def test_reading_commands_refuse_a_home_without_a_lakehouse(
    args: list[str], env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    home = tmp_path / "mistyped-home"
    result = run(*[a.format(out=out) for a in args], env={**env, "TRAJLAKE_HOME": str(home)})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"TRAJLAKE_HOME={home}" in lines[0], result.stderr
    assert "does not exist" in lines[0]
    assert not home.exists() and not out.exists() and result.stdout == ""


def test_an_empty_directory_is_not_a_lakehouse_either(env: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "empty"
    home.mkdir()
    result = run("sql", "SELECT 1", env={**env, "TRAJLAKE_HOME": str(home)})
    assert result.returncode == 1 and "holds no lakehouse" in result.stderr, result.stderr
    assert list(home.iterdir()) == []


@pytest.mark.slow
def test_broker_commands_do_not_create_a_mistyped_home(env: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "mistyped-home"
    local = {**env, "TRAJLAKE_HOME": str(home)}
    assert run("broker", "status", env=local).returncode == 1
    assert run("broker", "stop", env=local).stdout.strip() == "not running"
    assert not home.exists()


@pytest.mark.slow
@pytest.mark.integration
def test_ingest_says_where_it_created_the_lakehouse(env: dict[str, str], tmp_path: Path, tansu_broker: str) -> None:
    home = tmp_path / "fresh"
    suffix = tmp_path.name[-12:]
    local = {
        **env,
        "TRAJLAKE_HOME": str(home),
        "TRAJLAKE_KAFKA_BOOTSTRAP": tansu_broker,
        "TRAJLAKE_TOPIC": f"usage-{suffix}",
        "TRAJLAKE_CONSUMER_GROUP": f"usage-{suffix}",
    }
    from common.broker import ensure_topic

    ensure_topic(tansu_broker, local["TRAJLAKE_TOPIC"], 1)
    first = run("ingest", "--until-idle", "1", env=local)
    assert first.returncode == 0, first.stderr
    assert f"new lakehouse at {home} (TRAJLAKE_HOME)" in first.stderr
    again = run("ingest", "--until-idle", "1", env=local)
    assert again.returncode == 0 and "new lakehouse" not in again.stderr  # said once, when it was created
    assert run("sql", "SELECT count(*) AS n FROM events", env=local).stdout.splitlines()[2].strip() == "0"
