"""Every user error prints exactly one red line on stderr and exits non-zero: never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trajlake.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str, code: int = 1) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    return {**clean, "TRAJLAKE_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "COLUMNS": "400"}


def test_local_fleet_without_bubblewrap_names_the_package(env: dict[str, str], tmp_path: Path) -> None:
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    result = run_cli("fleet", "run", "--backend", "local", "--sessions", "1", env={**env, "PATH": str(empty_path)})
    assert_one_line_error(result, "bubblewrap")


def test_invalid_kafka_extra_names_the_variable(env: dict[str, str]) -> None:
    result = run_cli("broker", "status", env={**env, "TRAJLAKE_KAFKA_EXTRA": "[1, 2"})
    assert_one_line_error(result, "TRAJLAKE_KAFKA_EXTRA")


def test_out_of_range_setting_names_the_variable(env: dict[str, str]) -> None:
    result = run_cli("broker", "status", env={**env, "TRAJLAKE_TOPIC_PARTITIONS": "0"})
    assert_one_line_error(result, "TRAJLAKE_TOPIC_PARTITIONS")


def test_home_pointing_at_a_file(env: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "not-a-dir"
    home.write_text("x")
    result = run_cli("sql", "SELECT 1", env={**env, "TRAJLAKE_HOME": str(home)})
    assert_one_line_error(result, "TRAJLAKE_HOME", "not a directory")


def test_broker_not_running_is_one_line(env: dict[str, str]) -> None:
    assert_one_line_error(run_cli("broker", "status", env=env), "no embedded broker")


def test_markup_in_an_error_message_is_printed_as_is(env: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "[bold]home[red]"
    home.write_text("x")
    result = run_cli("sql", "SELECT 1", env={**env, "TRAJLAKE_HOME": str(home)})
    assert_one_line_error(result, "[bold]home[red]")


@pytest.mark.parametrize(
    "args",
    [
        ("fleet", "run", "--sessions", "1", "--max-cost-usd", "inf"),  # a bound of min=0 lets inf through
        ("export", "--format", "openai", "--out", "{tmp}/e", "--min-quality", "nan"),
        ("ingest", "--until-idle", "inf"),
        ("fleet", "run", "--sessions", "1", "--temperature", "-inf"),
    ],
)
def test_a_non_finite_number_option_is_a_usage_error(env: dict[str, str], tmp_path: Path, args: tuple) -> None:
    result = run_cli(*(a.replace("{tmp}", str(tmp_path)) for a in args), env=env)
    assert_one_line_error(result, "not a finite number", code=2)
