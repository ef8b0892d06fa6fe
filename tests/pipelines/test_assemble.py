"""Assembly: order independence, deduplication, idle timeouts, incrementality."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from common.settings import Settings
from pipelines.assemble import assemble
from tests.helpers import AS_OF, one_row, sample_events, snapshot, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query


@pytest.mark.slow
def test_shuffled_and_duplicated_input_gives_identical_output(settings: Settings, tmp_path) -> None:
    events = sample_events(25)
    write_raw(settings, events, batch_size=10_000)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    expected = snapshot(settings)
    assert len(expected[0]) == 25 and expected[1]

    rng = random.Random(3)
    messy = events + rng.sample(events, len(events) // 3)  # a third duplicated
    rng.shuffle(messy)
    other = Settings(home=tmp_path / "other")
    for i in range(0, len(messy), 97):  # many small batches, each assembled as it lands
        write_raw(other, messy[i : i + 97])
        assemble(Lakehouse.open(other), as_of=AS_OF)
    assert snapshot(other) == expected


@pytest.mark.slow
def test_a_kafka_record_landed_twice_counts_once(settings: Settings, tmp_path) -> None:
    """Two copies with the same event id *and* the same Kafka coordinates: exactly one stays."""
    events = sample_events(6)
    write_raw(settings, events, batch_size=10_000)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    expected = snapshot(settings)

    twice = Settings(home=tmp_path / "twice")
    write_raw(twice, events, batch_size=10_000)
    write_raw(twice, events, batch_size=10_000)  # identical rows in a second file (a replayed batch)
    stats = assemble(Lakehouse.open(twice), as_of=AS_OF)
    assert stats.sessions == 6
    assert snapshot(twice) == expected
    counts = run_query(twice, "SELECT sum(n_events) FROM trajectories")[1][0][0]
    assert counts == len(events)


@pytest.mark.slow
def test_session_without_end_times_out_and_late_events_amend(settings: Settings) -> None:
    events = sample_events(3)
    session = events[0]["session_id"]
    own = [e for e in events if e["session_id"] == session]
    tail = [e for e in own if e["event_type"] in ("evaluation", "session_end")]
    head = [e for e in events if e not in tail]
    last_ts = max(e["ts"] for e in head if e["session_id"] == session)
    write_raw(settings, head)

    assemble(Lakehouse.open(settings), as_of=datetime.fromtimestamp(last_ts / 1e6 + 60, UTC))
    status = dict(run_query(settings, "SELECT session_id, status FROM trajectories")[1])
    assert status[session] == "running"

    stats = assemble(
        Lakehouse.open(settings), as_of=datetime.fromtimestamp(last_ts / 1e6 + settings.session_idle_timeout_s + 1, UTC)
    )
    assert stats.sessions >= 1  # the open session was revisited without new files
    rows = dict(run_query(settings, "SELECT session_id, status || '/' || exit_reason FROM trajectories")[1])
    assert rows[session] == "timeout/idle_timeout"

    write_raw(settings, tail)  # late evaluation and end reopen and amend the session
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    final = dict(run_query(settings, "SELECT session_id, status FROM trajectories")[1])
    assert final[session] == tail[-1]["payload"]["status"]
    assert run_query(settings, "SELECT count(*) FROM trajectories")[1][0][0] == 3


def test_assembly_is_incremental(settings: Settings) -> None:
    events = sample_events(10)
    first = [e for e in events if e["session_id"] != events[-1]["session_id"]]
    write_raw(settings, first)
    assert assemble(Lakehouse.open(settings), as_of=AS_OF).sessions == 9
    assert assemble(Lakehouse.open(settings), as_of=AS_OF).sessions == 0  # nothing new: nothing recomputed
    write_raw(settings, [e for e in events if e not in first])
    stats = assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert (stats.sessions, stats.new_files, stats.full_rebuild) == (1, 1, False)
    assert run_query(settings, "SELECT count(*) FROM trajectories")[1][0][0] == 10


def test_steps_join_actions_with_their_feedback(settings: Settings) -> None:
    events = sample_events(4)
    write_raw(settings, events)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    actions = sum(e["event_type"] == "agent_action" for e in events)
    columns, rows = run_query(
        settings, "SELECT count(*), count(feedback_event_id), count(exit_code), min(step_index) FROM steps"
    )
    assert rows[0] == (actions, actions, actions, 0)
    n_steps = run_query(settings, "SELECT sum(n_steps) FROM trajectories")[1][0][0]
    assert n_steps == actions


def test_an_action_with_two_feedbacks_takes_the_first(settings: Settings) -> None:
    events = sample_events(1)
    first = next(e for e in events if e["event_type"] == "env_feedback" and e["parent_event_id"])
    late = {
        **first,
        "event_id": "f" * 32,
        "seq": max(e["seq"] for e in events) + 1,
        "ts": first["ts"] + 10**6,
        "payload": {**first["payload"], "output": "a later, second result", "exit_code": 7},
    }
    write_raw(settings, [late, *events])  # the later one lands first
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    action = first["parent_event_id"]
    query = f"SELECT feedback_event_id, output, exit_code FROM steps WHERE action_event_id = '{action}'"
    _, rows = run_query(settings, query)
    assert rows == [(first["event_id"], first["payload"]["output"], first["payload"]["exit_code"])]


@pytest.mark.slow
def test_chunked_assembly_equals_one_pass_and_replaces_rows(settings: Settings, tmp_path) -> None:
    events = sample_events(30)
    write_raw(settings, events, batch_size=10_000)
    one = assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert one.chunks == 1
    expected = snapshot(settings)

    small = Settings(home=tmp_path / "chunked", assemble_chunk_events=len(events) // 7)
    write_raw(small, events[: len(events) // 2])
    assemble(Lakehouse.open(small), as_of=AS_OF)
    write_raw(small, events[len(events) // 2 :])  # sessions already assembled are replaced, chunk by chunk
    stats = assemble(Lakehouse.open(small), as_of=AS_OF)
    assert stats.chunks >= 4
    assert snapshot(small) == expected


@pytest.mark.slow
def test_a_session_that_cannot_be_assembled_is_quarantined_and_the_rest_land(settings: Settings, monkeypatch) -> None:
    """Whatever breaks one session's aggregation (here: a forced DuckDB error) leaves the others whole."""
    import duckdb

    import pipelines.assemble as assembly

    events = sample_events(9, seed=13)
    sessions = sorted({e["session_id"] for e in events})
    bad = sessions[4]
    real = assembly._sanitize_values

    def breaks_on_bad(con: duckdb.DuckDBPyConnection) -> list:
        if one_row(con, "SELECT count(*) FROM ev WHERE session_id = $s", {"s": bad})[0]:
            raise duckdb.ConversionException(f"Could not cast value nan to DECIMAL(38,12) in {bad}")
        return real(con)

    monkeypatch.setattr(assembly, "_sanitize_values", breaks_on_bad)
    write_raw(settings, events)
    stats = assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert stats.skipped_sessions == 1 and stats.trajectories_written == len(sessions) - 1
    _, rows = run_query(settings, "SELECT session_id FROM trajectories ORDER BY 1")
    assert [r[0] for r in rows] == [s for s in sessions if s != bad]
    _, rows = run_query(settings, "SELECT DISTINCT session_id FROM steps")
    assert bad not in {r[0] for r in rows}
    _, rows = run_query(settings, "SELECT session_id, reason, action, detail FROM quarantine")
    assert [r[:3] for r in rows] == [(bad, "assembly_failed", "skipped")] and "DECIMAL" in rows[0][3]
    # once the session can be assembled, the next run that recomputes it lands it and clears the quarantine
    monkeypatch.setattr(assembly, "_sanitize_values", real)
    assert assemble(Lakehouse.open(settings), as_of=AS_OF, full=True).skipped_sessions == 0
    _, rows = run_query(settings, "SELECT count(*) FROM trajectories")
    assert rows[0][0] == len(sessions)
    assert run_query(settings, "SELECT count(*) FROM quarantine")[1][0][0] == 0


def test_a_bug_in_our_sql_is_not_blamed_on_the_sessions(settings: Settings, monkeypatch) -> None:
    """A binder error would hit every session alike: it stops the run instead of quarantining them all."""
    import duckdb
    import pytest

    import pipelines.assemble as assembly

    monkeypatch.setattr(assembly, "_STEPS_SQL", "SELECT no_such_column FROM ev")
    write_raw(settings, sample_events(2, seed=1))
    with pytest.raises(duckdb.BinderException):
        assemble(Lakehouse.open(settings))
