"""Schema-valid extremes in one session never stop assembly, scoring or export for the others.

One "poison" session carries values the schema accepts but no measurement has (NaN, ±inf,
1e308, int64 limits whose sum overflows, timestamps at years 1 and 9999, NUL and escape
characters, arguments nested 2,000 deep). It goes with good sessions through raw events →
assemble → score → export; every good session must land in trajectories, scores and the
export, and the poison session is either assembled with the bad values NULL or quarantined
with its reason, never silently dropped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from common.broker import resolve_bootstrap
from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set, read_export
from pipelines.ingest import IngestWorker
from pipelines.score import score_all
from producers.errors import NonFiniteNumberError
from producers.sdk import EventProducer
from schemas.registry import encode_event
from tests.helpers import sample_events, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
YEAR_1_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
YEAR_9999_US = 253_402_214_399_000_000  # 9999-12-31T23:59:59Z
DEEP = "[" * 2000 + "]" * 2000
DEEP_OBJECT = '{"command": ' + "[" * 2000 + "]" * 2000 + "}"

floats = st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 1e30, 5e-324, -0.0])
big_ints = st.sampled_from([INT64_MAX, INT64_MIN, INT64_MAX - 1, 0])
nasty_text = st.sampled_from(
    ["\x00", "a\x00b", "\x1b[31mred\x1b[0m", "\u2028\u2029", '"\\', "\ud7ff\ufffe", "x" * 5000]
)


@st.composite
def poisons(draw: st.DrawFn) -> dict:
    """Which extremes the poison session carries (each field independently)."""
    return {
        "cost_usd": draw(floats),
        "model_latency_ms": draw(floats),
        "output_tokens": draw(big_ints),
        "input_tokens": draw(big_ints),
        "duration_ms": draw(floats),
        "reward": draw(floats),
        "cpu_seconds": draw(floats),
        "ts": draw(st.sampled_from([None, YEAR_1_US, YEAR_9999_US])),
        "text": draw(nasty_text),
        "arguments": draw(st.sampled_from([None, DEEP, DEEP_OBJECT])),
        "seq_max": draw(st.booleans()),
    }


def poison_session(events: list[dict], poison: dict) -> list[dict]:
    """A copy of the first session of ``events`` under a new id, with ``poison``'s extremes applied."""
    first = events[0]["session_id"]
    session = [copy.deepcopy(e) for e in events if e["session_id"] == first]
    for i, event in enumerate(session):
        event["session_id"] = "poison-session"
        event["event_id"] = f"poison-{i}"
        payload = event["payload"]
        if poison["ts"] is not None and i == len(session) - 1:
            event["ts"] = poison["ts"]
        if poison["seq_max"] and i == len(session) - 1:
            event["seq"] = INT64_MAX
        kind = event["event_type"]
        if kind == "agent_action":
            payload.update(
                cost_usd=poison["cost_usd"],
                model_latency_ms=poison["model_latency_ms"],
                output_tokens=poison["output_tokens"],
                thought=poison["text"],
            )
            if poison["arguments"] is not None:
                payload["arguments"] = poison["arguments"]
        elif kind == "agent_input":
            payload["input_tokens"] = poison["input_tokens"]
        elif kind == "env_feedback":
            payload.update(duration_ms=poison["duration_ms"], output=poison["text"])
        elif kind == "session_end":
            payload.update(reward=poison["reward"], cpu_seconds=poison["cpu_seconds"])
        elif kind == "session_start":
            payload["instruction"] = f"fix it {poison['text']}"
    return session


def check_every_good_session_lands(settings: Settings, good: set[str], out: Path) -> None:
    """Assemble → score → export, then the property: the good sessions are all there."""
    stats = assemble(Lakehouse.open(settings))
    assert stats.skipped_sessions <= 1  # only the poison session may be left out
    _, rows = run_query(settings, "SELECT session_id FROM trajectories")
    landed = {r[0] for r in rows}
    assert good <= landed
    _, rows = run_query(settings, "SELECT session_id, reason, action FROM quarantine WHERE stage = 'assemble'")
    quarantined = {r[0] for r in rows}
    assert quarantined <= {"poison-session"}
    # the poison session is accounted for: assembled, or quarantined with its reason
    assert "poison-session" in landed | quarantined
    if "poison-session" not in landed:
        assert any(r[2] == "skipped" and r[1] for r in rows)
    _, rows = run_query(settings, "SELECT count(*), count(DISTINCT session_id) FROM trajectories")
    assert rows[0][0] == rows[0][1]  # one row per session

    score_all(Lakehouse.open(settings))
    _, rows = run_query(settings, "SELECT session_id FROM scores")
    assert good <= {r[0] for r in rows}

    export = export_training_set(Lakehouse.open(settings), "hf", out, min_quality=0.0, filters=ALL_ORIGINS)
    _, rows = run_query(settings, "SELECT session_id FROM scores WHERE exportable")
    exportable_good = {r[0] for r in rows} & good
    exported = {r["session_id"] for r in read_export(out)}
    assert exportable_good <= exported
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["files"]:
        assert entry["sha256"] == hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest()
    assert export.records + export.quarantined >= len(exportable_good)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
@hsettings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(poison=poisons())
def test_one_poisoned_session_never_stops_the_others(poison: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(home=Path(tmp) / "home", topic="unused", kafka_bootstrap=None, catalog_uri=None)
        events = sample_events(4, seed=11)
        good = {e["session_id"] for e in events}
        write_raw(settings, events + poison_session(events, poison))
        check_every_good_session_lands(settings, good, Path(tmp) / "out")


def test_nan_cost_and_overflowing_tokens_are_nulled_and_named(settings: Settings, tmp_path: Path) -> None:
    """The issue's probes: cost NaN / 1e30, two output_tokens of 2^63−1 — assembled, NULLed, quarantined."""
    events = sample_events(3, seed=4)
    poison = {
        "cost_usd": math.nan,
        "model_latency_ms": 1e30,
        "output_tokens": INT64_MAX,
        "input_tokens": 0,
        "duration_ms": math.inf,
        "reward": -math.inf,
        "cpu_seconds": 1e308,
        "ts": None,
        "text": "ok",
        "arguments": None,
        "seq_max": False,
    }
    write_raw(settings, events + poison_session(events, poison))
    stats = assemble(Lakehouse.open(settings))
    assert stats.nulled_sessions == 1 and stats.skipped_sessions == 0 and stats.trajectories_written == 4
    _, rows = run_query(
        settings, "SELECT cost_usd, output_tokens FROM trajectories WHERE session_id = 'poison-session'"
    )
    cost, tokens = rows[0]
    assert tokens is None  # two 2^63−1 overflow int64: NULL, not an Arrow error
    assert cost is not None and math.isfinite(cost)  # the NaN event counts as unknown, the others still sum
    _, rows = run_query(settings, "SELECT count(*) FROM steps WHERE session_id = 'poison-session' AND isnan(cost_usd)")
    assert rows[0][0] == 0
    _, rows = run_query(settings, "SELECT reason, detail FROM quarantine WHERE session_id = 'poison-session'")
    reasons = {r[0] for r in rows}
    details = " ".join(r[1] for r in rows)
    assert reasons == {"out_of_range_value", "sum_overflow"}
    assert "cost_usd=nan" in details and "output_tokens=" in details
    # the original value is kept in raw events (FILTER, not WHERE: DuckDB's Parquet row-group pruning skips NaN)
    _, kept = run_query(settings, "SELECT count(*) FILTER (WHERE isnan(agent_action.cost_usd)) FROM events")
    assert kept[0][0] >= 1
    # a later run that recomputes the session replaces its quarantine rows instead of piling them up
    assemble(Lakehouse.open(settings), full=True)
    _, again = run_query(settings, "SELECT reason, detail FROM quarantine WHERE session_id = 'poison-session'")
    assert sorted(again) == sorted(rows)


@pytest.mark.slow
def test_deeply_nested_arguments_are_quarantined_at_export_not_a_recursion_error(
    settings: Settings, tmp_path: Path
) -> None:
    events = sample_events(8, seed=5)
    sessions = sorted({e["session_id"] for e in events})
    deep = set(sessions[::2])  # scoring does not read arguments: exportability is independent of this
    for event in events:
        if event["session_id"] in deep and event["event_type"] == "agent_action":
            event["payload"]["arguments"] = DEEP_OBJECT
    write_raw(settings, events)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trajlake.cli",
            "export",
            "--format",
            "sharegpt",
            "--origin",
            "all",
            "--out",
            str(out),
            "--min-quality",
            "0",
            "--outcome",
            "all",
        ],
        capture_output=True,
        text=True,
        env={**_env(), "TRAJLAKE_HOME": str(settings.home)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "RecursionError" not in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "data", "manifest.json"]
    assert not [p.name for p in out.parent.iterdir() if ".export-" in p.name]  # no staging directory left behind
    exported = {r["session_id"] for r in read_export(out)}
    # --min-quality 0 --outcome all: every ended session that is neither security-flagged nor a shadowed duplicate
    _, rows = run_query(
        settings,
        "SELECT session_id FROM scores WHERE NOT security_flagged AND failure_cause IS DISTINCT FROM 'still_running' "
        "AND session_id NOT IN (SELECT session_id FROM duplicates WHERE NOT is_representative)",
    )
    exportable = {r[0] for r in rows}
    assert exportable & deep, "the fixture must make at least one exportable session too deep"
    assert exported == exportable - deep
    _, rows = run_query(settings, "SELECT session_id, reason, action FROM quarantine WHERE stage = 'export'")
    assert {r[0] for r in rows} == exportable & deep and {r[1:] for r in rows} == {("too_deep", "skipped")}
    assert json.loads((out / "manifest.json").read_text())["counts"]["quarantined"] == len(exportable & deep)


def test_the_sdk_refuses_non_finite_numbers_with_a_clear_error() -> None:
    producer = EventProducer.__new__(EventProducer)  # encode() needs no Kafka connection
    producer.redact, producer.schema_version = False, None
    event = copy.deepcopy(next(e for e in sample_events(1) if e["event_type"] == "agent_action"))
    event["payload"]["cost_usd"] = math.nan
    with pytest.raises(NonFiniteNumberError, match="payload.cost_usd is nan"):
        producer.encode(event)
    event["payload"]["cost_usd"] = 0.5
    assert producer.encode(event)


@pytest.mark.slow
@pytest.mark.integration
def test_poison_through_a_real_broker_leaves_the_others_whole(
    tansu_broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same property with the poison sent to Kafka by a producer that does not use our SDK's checks."""
    from common.broker import ensure_topic

    monkeypatch.setenv("TRAJLAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAJLAKE_KAFKA_BOOTSTRAP", tansu_broker)
    monkeypatch.setenv("TRAJLAKE_TOPIC", f"poison-values-{tmp_path.name}")
    monkeypatch.setenv("TRAJLAKE_CONSUMER_GROUP", f"poison-values-{tmp_path.name}")
    settings = load_settings()
    ensure_topic(tansu_broker, settings.topic, settings.topic_partitions)
    events = sample_events(3, seed=9)
    poison = {
        "cost_usd": math.nan,
        "model_latency_ms": math.inf,
        "output_tokens": INT64_MAX,
        "input_tokens": INT64_MAX,
        "duration_ms": -math.inf,
        "reward": math.nan,
        "cpu_seconds": 1e308,
        "ts": YEAR_9999_US,
        "text": "\x00\x1b",
        "arguments": DEEP,
        "seq_max": True,
    }
    producer = EventProducer(resolve_bootstrap(settings), settings.topic, "test-host")
    for event in events + poison_session(events, poison):
        producer.send(event["session_id"], event["event_id"], encode_event(event))  # raw bytes: no SDK check
    producer.flush(60)
    stats = IngestWorker(settings).run(until_idle=1)
    assert stats.events == len(events) + len(poison_session(events, poison))
    check_every_good_session_lands(settings, {e["session_id"] for e in events}, tmp_path / "out")


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env
