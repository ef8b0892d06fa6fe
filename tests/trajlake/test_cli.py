"""End to end through the command line: demo, sql, ingest idempotence, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def trajlake(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )
    if check and result.returncode != 0:
        raise AssertionError(f"trajlake {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def cli_env(tmp_path: Path, broker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    suffix = tmp_path.name[-12:]
    env.update(
        TRAJLAKE_HOME=str(tmp_path / "home"),
        TRAJLAKE_KAFKA_BOOTSTRAP=broker,
        TRAJLAKE_TOPIC=f"cli-{suffix}",
        TRAJLAKE_CONSUMER_GROUP=f"cli-{suffix}",
    )
    return env


def sql_value(query: str, env: dict[str, str]) -> object:
    rows = json.loads(trajlake("sql", query, "--format", "json", env=env).stdout)
    return next(iter(rows[0].values()))


def test_demo_end_to_end_then_sql_and_idempotent_ingest(cli_env: dict[str, str]) -> None:
    demo = trajlake("demo", "--sessions", "60", "--local-sessions", "2", "--seed", "11", env=cli_env)
    assert "Sessions by status" in demo.stdout
    # it says up front that it plants cheaters, and at what rates, before the fleet runs
    planted = "cheaters: the demo plants cheating agents on purpose (25% of 2 real-sandbox sessions and 5% of 60"
    assert demo.stdout.index(planted) < demo.stdout.index("fleet[")
    assert "cheaters planted this run)" in demo.stdout
    assert "finished_rate" in demo.stdout and "passed_eval_rate" in demo.stdout  # finished and passed apart
    assert "emitted this run: 62 sessions" in demo.stdout
    # the demo's SFT export says what it left out: the synthetic load fleet's sessions among it
    assert "SFT records (hf)" in demo.stdout and "origin:synthetic=" in demo.stdout
    assert sql_value("select count(*) from trajectories", cli_env) == 62
    assert sql_value("select count(*) - count(distinct event_id) from events", cli_env) == 0
    events = sql_value("select count(*) from events", cli_env)
    trajlake("ingest", "--until-idle", "2", env=cli_env)
    assert sql_value("select count(*) from events", cli_env) == events
    # A second demo adds new sessions and stays consistent.
    trajlake("demo", "--sessions", "40", "--local-sessions", "0", env=cli_env)
    assert sql_value("select count(*) from trajectories", cli_env) == 102
    assert sql_value("select count(*) - count(distinct event_id) from events", cli_env) == 0
    csv = trajlake(
        "sql", "select status, count(*) n from trajectories group by 1 order by 1", "--format", "csv", env=cli_env
    ).stdout
    assert csv.splitlines()[0] == "status,n"


def test_sql_is_read_only_and_errors_are_one_line(cli_env: dict[str, str]) -> None:
    from common.settings import load_settings
    from warehouse.sql import open_views

    open_views(load_settings(home=Path(cli_env["TRAJLAKE_HOME"]))).close()  # an empty lakehouse to refuse writes on
    result = trajlake("sql", "drop view events", env=cli_env, check=False)
    assert result.returncode == 1
    assert "read-only" in result.stderr and "Traceback" not in result.stderr
    result = trajlake("sql", "select * from no_such_view", env=cli_env, check=False)
    assert result.returncode == 1 and "no_such_view" in result.stderr


def test_missing_broker_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env["TRAJLAKE_HOME"] = str(tmp_path)
    result = trajlake("ingest", "--until-idle", "1", env=env, check=False)
    assert result.returncode == 1
    assert "trajlake broker start" in result.stderr
