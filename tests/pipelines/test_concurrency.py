"""Two of each job at once, as real processes on one TRAJLAKE_HOME: nothing doubled, lost or torn.

Before the fix two ``trajlake assemble`` both exited 0 and left two rows per session (pyiceberg
0.12 re-appended the loser's rows on top of the winner's), ``score --force`` then multiplied the
score rows, and two exports into one directory shared ``hf.jsonl.tmp`` (one crashed, the other's
manifest did not match its file).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyiceberg.exceptions import CommitFailedException

from common.settings import Settings
from pipelines.assemble import assemble
from tests.helpers import lake_state, raw_rows, sample_events, tier_split, write_raw
from warehouse.catalog import open_catalog
from warehouse.errors import LockBusy
from warehouse.lakehouse import Lakehouse
from warehouse.locks import job_lock
from warehouse.query import run_query
from warehouse.tables import RAW_EVENTS, ensure_table
from warehouse.transactions import transaction

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 30


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(TRAJLAKE_HOME=str(settings.home), PYTHONPATH=str(ROOT))
    return env


def run_at_once(settings: Settings, *commands: list[str], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Start every ``trajlake`` command as its own process at the same moment; wait for all."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trajlake.cli", *cmd],
            env=_env(settings),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cmd in commands
    ]
    results = []
    for cmd, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    for result in results:
        assert result.returncode == 0, f"{result.args}: {result.stderr}"
        assert "Traceback" not in result.stderr
    return results


@pytest.fixture
def lake(settings: Settings) -> Settings:
    write_raw(settings, sample_events(SESSIONS, seed=21), batch_size=150)  # several files: compaction has work
    return settings


def _one_row_per_key(settings: Settings) -> None:
    checks = {
        "trajectories": "SELECT count(*), count(DISTINCT session_id) FROM trajectories",
        "steps": "SELECT count(*), count(DISTINCT (session_id, step_index)) FROM steps",
        "scores": "SELECT count(*), count(DISTINCT session_id) FROM scores",
    }
    for view, query in checks.items():
        _, rows = run_query(settings, query)
        assert rows[0][0] == rows[0][1], f"{view}: {rows[0][0]} rows for {rows[0][1]} keys"


def _manifest_matches(out: Path) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]
    for entry in manifest["files"]:
        data = (out / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["records"] == len(data.splitlines())
    assert sorted(p.name for p in (out / "data").iterdir()) == sorted(e["path"][5:] for e in manifest["files"])
    assert not [p.name for p in out.parent.iterdir() if ".export-" in p.name]


@pytest.mark.slow
def test_two_of_each_job_at_once_never_duplicate_or_corrupt(lake: Settings, tmp_path: Path) -> None:
    settings = lake
    run_at_once(settings, ["assemble"], ["assemble"])
    _, rows = run_query(settings, "SELECT count(*), count(DISTINCT session_id) FROM trajectories")
    assert rows[0] == (SESSIONS, SESSIONS)
    _, rows = run_query(settings, "SELECT count(*) FROM steps")
    _, expected = run_query(settings, "SELECT count(*) FROM events WHERE event_type = 'agent_action'")
    assert rows == expected

    run_at_once(settings, ["score", "--force"], ["score", "--force"])
    _, rows = run_query(settings, "SELECT count(*), count(DISTINCT session_id) FROM scores")
    assert rows[0] == (SESSIONS, SESSIONS)
    _one_row_per_key(settings)

    out = tmp_path / "export"
    run_at_once(
        settings,
        *[["export", "--format", "hf", "--origin", "all", "--out", str(out), "--min-quality", "0", "--force"]] * 2,
    )
    _manifest_matches(out)
    _, rows = run_query(settings, "SELECT count(*) FROM exports")
    assert rows[0][0] == 2

    before = lake_state(settings)
    other = tmp_path / "export2"
    run_at_once(
        settings,
        ["tier"],
        ["tier"],
        ["maintain"],
        ["maintain"],
        ["export", "--format", "rl", "--origin", "all", "--out", str(other), "--min-quality", "0"],
    )
    assert lake_state(settings) == before  # every row once, in whichever tier
    assert tier_split(settings)["cold_trajectories"] == SESSIONS  # tiering did move them
    _one_row_per_key(settings)
    _manifest_matches(other)


def test_a_commit_planned_on_a_stale_snapshot_is_refused_not_replayed(settings: Settings) -> None:
    """The wrapper's conditioned commit: the loser of a race fails, it does not re-append its rows."""
    catalog = open_catalog(settings)
    first = ensure_table(catalog, settings, RAW_EVENTS.name)
    second = catalog.load_table(first.name())  # both planned from the same (empty) state
    with transaction(first) as tx:
        tx.append(raw_rows(3))
    with pytest.raises(CommitFailedException), transaction(second) as tx:
        tx.append(raw_rows(3, start=3))
    assert catalog.load_table(first.name()).scan().to_arrow().num_rows == 3
    # an append whose outcome does not depend on the table's state may opt in to the replay
    third = catalog.load_table(first.name())
    with transaction(first) as tx:
        tx.append(raw_rows(2, start=10))
    with transaction(third, replay_on_conflict=True) as tx:
        tx.append(raw_rows(2, start=20))
    assert catalog.load_table(first.name()).scan().to_arrow().num_rows == 7


@pytest.mark.slow
def test_the_catalog_lock_excludes_a_second_holder_and_survives_a_killed_one(settings: Settings) -> None:
    catalog = open_catalog(settings)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from common.settings import load_settings\n"
            "from warehouse.catalog import open_catalog\n"
            "from warehouse.locks import job_lock\n"
            "s = load_settings()\n"
            "with job_lock(s, open_catalog(s), 'assemble'):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(600)\n",
        ],
        env=_env(settings),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LockBusy, match="assemble"), job_lock(settings, catalog, "assemble", wait_s=1):
            pass
        with job_lock(settings, catalog, "score", wait_s=1):  # another job's lock is independent
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        started = time.monotonic()
        with job_lock(settings, catalog, "assemble", wait_s=5):  # a dead holder on this host is taken over
            assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait(30)
        if holder.stdout is not None:
            holder.stdout.close()


@pytest.mark.slow
def test_assemble_waits_for_the_lock_then_finds_nothing_new(lake: Settings) -> None:
    catalog = open_catalog(lake)
    with job_lock(lake, catalog, "assemble"):
        # it reaches the lock's wait loop (crash point `waiting_for_lock`) instead of assembling beside us
        waiting = subprocess.run(
            [sys.executable, "-m", "trajlake.cli", "assemble"],
            env={**_env(lake), "TRAJLAKE_FAULT": "waiting_for_lock"},
            cwd=ROOT,
            capture_output=True,
            timeout=300,
        )
        assert waiting.returncode == -signal.SIGKILL, waiting.stderr
        proc = subprocess.Popen(
            [sys.executable, "-m", "trajlake.cli", "assemble"],
            env=_env(lake),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    _, rows = run_query(lake, "SELECT count(*), count(DISTINCT session_id) FROM trajectories")
    assert rows[0] == (SESSIONS, SESSIONS)
    assert assemble(Lakehouse.open(lake)).sessions == 0
