"""Hot → cold tiering: nothing lost or doubled, whatever point the job dies at."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from typing import Any

import pyarrow.parquet as pq
import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from producers.session_generator import synthetic_sessions
from tests.helpers import BASE, BASE_US, day_events, lake_state, one_row, tier_split, write_raw
from warehouse.catalog import open_catalog
from warehouse.cold import TIERED_FILES, ensure_cold_table
from warehouse.lakehouse import Lakehouse
from warehouse.sql import local_path, open_views
from warehouse.tables import RAW_EVENTS, TRAJECTORIES, ensure_table
from warehouse.tiering import tier

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def aged_lake(settings: Settings) -> Settings:
    """Four days of four sessions, assembled and closed; 'now' is BASE + 10 days."""
    write_raw(settings, day_events(4, 4), batch_size=400)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    return settings


def run_tier_process(as_of: datetime, fault: str | None = None) -> subprocess.Popen:
    """``tier`` in a child process (inherits TRAJLAKE_HOME from the test's environment)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("TRAJLAKE_FAULT", None)
    if fault:
        env["TRAJLAKE_FAULT"] = fault
    code = (
        "from datetime import datetime; from common.settings import load_settings; "
        "from warehouse.lakehouse import Lakehouse; from warehouse.tiering import tier; "
        f"tier(Lakehouse.open(load_settings()), as_of=datetime.fromisoformat('{as_of.isoformat()}'))"
    )
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT)


@pytest.mark.slow
def test_tier_moves_old_days_once_and_keeps_every_row(aged_lake: Settings) -> None:
    settings = aged_lake
    before = lake_state(settings)
    assert len(before["events"]) > 100 and len(before["trajectories"]) == 16
    stats = tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))  # boundary: BASE + 3 days
    assert stats.days_tiered == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert lake_state(settings) == before
    split = tier_split(settings)
    assert split["cold_trajectories"] == 12 and split["hot_trajectories"] == 4
    assert split["cold_events"] == stats.events_copied > 0
    # The hot tables themselves no longer hold the old rows.
    con = open_views(settings)
    assert one_row(con, "SELECT min(ts) FROM hot_events")[0] >= BASE + timedelta(days=3)
    # Cold files are zstd Parquet sorted by session, under the cold location.
    cold = ensure_cold_table(open_catalog(settings), settings, RAW_EVENTS.name)
    for task in cold.scan().plan_files():
        assert task.file.file_path.startswith(settings.cold_location)
        meta = pq.ParquetFile(local_path(task.file.file_path)).metadata
        assert meta.row_group(0).column(0).compression == "ZSTD"
        sessions = pq.read_table(local_path(task.file.file_path), columns=["session_id"]).column(0).to_pylist()
        assert sessions == sorted(sessions)
    # Idempotent: a second run at the same time moves nothing.
    again = tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))
    assert again.events_copied == again.sessions_copied == again.event_files_removed == 0
    assert lake_state(settings) == before


@pytest.mark.slow
def test_open_sessions_and_their_days_stay_hot(settings: Settings) -> None:
    events = day_events(2, 3)
    open_session = events[0]["session_id"]  # first session of day 0 loses its end: still running
    events = [e for e in events if not (e["session_id"] == open_session and e["event_type"] == "session_end")]
    write_raw(settings, events)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(hours=1, minutes=1))
    before = lake_state(settings)
    assert ("running",) in {(status,) for _, _, status in before["trajectories"]}
    stats = tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    assert stats.days_deferred == ["2026-01-01"] and stats.days_tiered == ["2026-01-02"]
    split = tier_split(settings)
    assert split["hot_trajectories"] == 1 and split["cold_trajectories"] == 5
    assert lake_state(settings) == before


@pytest.mark.slow
def test_late_event_in_a_tiered_day_stays_visible(aged_lake: Settings) -> None:
    settings = aged_lake
    tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))
    before = len(lake_state(settings)["events"])
    # A session from day 0 (already tiered) arrives late: its events land in a new hot file of that day.
    late = [e for s in synthetic_sessions(1, seed=99, start_us=BASE_US + 3_600_000_000) for e in s]
    write_raw(settings, late)
    assert len(lake_state(settings)["events"]) == before + len(late)
    stats = tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))
    # The late session is not assembled yet, so its day waits in hot, still visible.
    assert "2026-01-01" in stats.days_deferred
    con = open_views(settings)
    early = one_row(con, "SELECT count(*) FROM hot_events WHERE ts < $b", {"b": BASE + timedelta(days=1)})[0]
    assert early == len(late)
    assert len(lake_state(settings)["events"]) == before + len(late)
    # Once assembled it moves like any other.
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    stats = tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))
    assert stats.days_tiered == ["2026-01-01"] and stats.events_copied == len(late)
    assert len(lake_state(settings)["events"]) == before + len(late)


FAULTS = [
    "tier_after_copy_steps",
    "tier_after_copy_trajectories",
    "tier_after_delete_steps",
    "tier_after_delete_trajectories",
    "tier_after_copy_raw_events",
]


@pytest.mark.slow
def test_crash_at_each_phase_never_loses_or_doubles(aged_lake: Settings) -> None:
    """Die at every commit boundary in turn, the retention boundary advancing a day each time."""
    settings = aged_lake
    before = lake_state(settings)
    for i, fault in enumerate(FAULTS):
        proc = run_tier_process(BASE + timedelta(days=8 + i), fault)
        assert proc.wait(120) == -signal.SIGKILL, fault
        assert lake_state(settings) == before, f"after dying at {fault}"
        if fault == "tier_after_copy_raw_events":
            # Rows copied but not yet deleted from hot: the marker is what keeps them from counting twice.
            cold = ensure_cold_table(open_catalog(settings), settings, RAW_EVENTS.name)
            assert cold.properties.get(TIERED_FILES)
    tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=12))
    assert lake_state(settings) == before
    split = tier_split(settings)
    assert split["hot_trajectories"] == split["hot_events"] == split["hot_steps"] == 0


#: Crash points every tiering run reaches, whatever it moves (``before_iceberg_commit`` comes on top, once
#: per commit): ``TRAJLAKE_FAULT=*@N`` with N up to this always kills the run.
POINTS_IN_EVERY_RUN = len(FAULTS) + 1  # and tier_after_delete_raw_events


@pytest.mark.slow
@pytest.mark.parametrize("kills", [2, pytest.param(12, marks=pytest.mark.stress)])
def test_random_kills_while_aging_across_the_boundary(aged_lake: Settings, kills: int) -> None:
    """Acceptance: kill the tiering job at random moments while the boundary advances across the data.

    A moment is the N-th crash point the run reaches (``TRAJLAKE_FAULT=*@N``: between commits and just
    before each Iceberg commit), so a kill lands where the code is, however fast or loaded the machine.
    """
    settings = aged_lake
    before = lake_state(settings)
    rng = random.Random(int(os.environ.get("TRAJLAKE_TEST_SEED", "11")))
    killed = 0
    for step in range(kills):
        as_of = BASE + timedelta(days=8 + 4 * step / kills, hours=rng.randrange(24))
        # the first kill within the points every run reaches; later ones may also let a run finish
        n = rng.randint(1, POINTS_IN_EVERY_RUN if step == 0 else 2 * POINTS_IN_EVERY_RUN)
        returncode = run_tier_process(as_of, f"*@{n}").wait(120)
        assert returncode in (0, -signal.SIGKILL), f"iteration {step}: exit {returncode}"
        killed += returncode == -signal.SIGKILL
        assert lake_state(settings) == before, f"iteration {step} (as_of {as_of}, killed at crash point {n})"
    tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=12))
    assert lake_state(settings) == before
    assert tier_split(settings)["hot_trajectories"] == 0
    assert killed >= 1


@pytest.mark.slow
def test_a_crash_point_fires_at_its_nth_pass_and_the_last_iceberg_commit_can_be_cut(aged_lake: Settings) -> None:
    """``NAME@N`` kills at the N-th pass; dying just before an Iceberg commit loses nothing either."""
    settings = aged_lake
    before = lake_state(settings)
    assert run_tier_process(BASE + timedelta(days=8), "before_iceberg_commit@2").wait(120) == -signal.SIGKILL
    assert lake_state(settings) == before
    assert run_tier_process(BASE + timedelta(days=8), "no_such_point").wait(120) == 0  # unreached: runs through
    assert lake_state(settings) == before
    assert tier_split(settings)["cold_trajectories"] == 4


def test_settings_reach_cold_tables(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_COLD_TARGET_FILE_BYTES", str(1 << 20))
    configured = load_settings()
    table = ensure_cold_table(open_catalog(configured), configured, RAW_EVENTS.name)
    assert table.properties["write.target-file-size-bytes"] == str(1 << 20)
    assert table.properties["write.parquet.compression-codec"] == "zstd"
    assert table.location().startswith(configured.cold_location)


@pytest.mark.slow
def test_cli_tier_maintain_and_tier_views(aged_lake: Settings) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("TRAJLAKE_FAULT", None)

    def trajlake(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "trajlake.cli", *args], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    moved = trajlake("tier", "--as-of", (BASE + timedelta(days=10)).isoformat())
    assert "2026-01-03" in moved and "12 sessions" in moved
    report = trajlake("maintain")
    assert f"{aged_lake.namespace}_cold.raw_events" in report and "max/partition" in report
    counts = trajlake(
        "sql",
        "SELECT (SELECT count(*) FROM cold_trajectories), (SELECT count(*) FROM hot_trajectories), "
        "(SELECT count(*) FROM trajectories)",
        "--format",
        "csv",
    )
    assert counts.strip().splitlines()[-1] == "12,4,16"


def _late_event_for_a_tiered_session(settings: Settings) -> tuple[str, dict]:
    """After tiering: one more agent action of a session of day 0 arrives; returns its session and the event."""
    tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))
    mine = [e for e in day_events(4, 4) if e["session_id"] == day_events(4, 4)[0]["session_id"]]
    action = next(e for e in reversed(mine) if e["event_type"] == "agent_action")
    late = {**action, "event_id": uuid.uuid4().hex, "seq": max(e["seq"] for e in mine) + 1, "ts": mine[-1]["ts"] - 1}
    return action["session_id"], late


def _session_rows(settings: Settings, sid: str) -> dict[str, Any]:
    con = open_views(settings)
    hot = ensure_table(open_catalog(settings), settings, TRAJECTORIES.name)
    return {
        "union": con.execute(
            "SELECT n_events, n_steps, max_seq FROM trajectories WHERE session_id = ?", [sid]
        ).fetchall(),
        "cold": con.execute(
            "SELECT n_events, n_steps, max_seq FROM cold_trajectories WHERE session_id = ?", [sid]
        ).fetchall(),
        "cold_steps": one_row(con, "SELECT count(*) FROM cold_steps WHERE session_id = ?", [sid])[0],
        "steps": one_row(con, "SELECT count(*) FROM steps WHERE session_id = ?", [sid])[0],
        "events": one_row(con, "SELECT count(*) FROM events WHERE session_id = ?", [sid])[0],
        "hot_table": hot.scan(row_filter=f"session_id = '{sid}'").to_arrow().num_rows,
    }


@pytest.mark.slow
def test_late_event_for_a_tiered_session_amends_the_cold_trajectory(aged_lake: Settings) -> None:
    settings = aged_lake
    sid, late = _late_event_for_a_tiered_session(settings)
    before = _session_rows(settings, sid)
    assert len(before["cold"]) == 1 and before["hot_table"] == 0
    (n_events, n_steps, max_seq) = before["cold"][0]
    write_raw(settings, [late])
    # Assembly recomputes the session from its cold events plus the late one (not from the late one alone).
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    hot = ensure_table(open_catalog(settings), settings, TRAJECTORIES.name)
    rows = hot.scan(row_filter=f"session_id = '{sid}'").to_arrow()
    assert rows.select(["n_events", "n_steps", "max_seq"]).to_pylist() == [
        {"n_events": n_events + 1, "n_steps": n_steps + 1, "max_seq": max_seq + 1}
    ]
    stats = tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))
    assert stats.sessions_amended == 1 and stats.sessions_copied == 0
    after = _session_rows(settings, sid)
    amended = [(n_events + 1, n_steps + 1, max_seq + 1)]
    assert after["union"] == after["cold"] == amended  # exactly one row, cold, amended
    assert after["hot_table"] == 0
    assert after["cold_steps"] == after["steps"] == before["steps"] + 1
    assert after["events"] == before["events"] + 1
    # Idempotent: the next run amends nothing.
    assert tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10)).sessions_amended == 0
    assert _session_rows(settings, sid) == after


@pytest.mark.slow
def test_crash_while_amending_a_tiered_session_never_loses_or_doubles(aged_lake: Settings) -> None:
    settings = aged_lake
    sid, late = _late_event_for_a_tiered_session(settings)
    before = _session_rows(settings, sid)
    write_raw(settings, [late])
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    others = {k: [r for r in v if sid not in str(r)] for k, v in lake_state(settings).items()}
    for fault in ["tier_after_copy_steps", "tier_after_copy_trajectories", "tier_after_delete_steps"]:
        proc = run_tier_process(BASE + timedelta(days=10), fault)
        assert proc.wait(120) == -signal.SIGKILL, fault
        now = _session_rows(settings, sid)
        assert len(now["union"]) == 1 and now["events"] == before["events"] + 1, fault
        assert now["steps"] in (before["steps"], before["steps"] + 1), fault
        assert {k: [r for r in v if sid not in str(r)] for k, v in lake_state(settings).items()} == others, fault
    tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))
    after = _session_rows(settings, sid)
    (n_events, n_steps, max_seq) = before["cold"][0]
    assert after["union"] == after["cold"] == [(n_events + 1, n_steps + 1, max_seq + 1)]
    assert after["hot_table"] == 0 and after["steps"] == after["cold_steps"] == before["steps"] + 1
