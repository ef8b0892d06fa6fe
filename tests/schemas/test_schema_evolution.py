"""Schema v2 next to v1: resolution both ways, compatibility checks, mixed writers through ingest."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.broker import resolve_bootstrap
from common.settings import Settings
from pipelines.ingest import IngestWorker
from producers.sdk import EventProducer
from schemas.compat import Compatibility, IncompatibleSchema, assert_compatible, check_compatibility, check_shipped
from schemas.registry import decode_event, encode_event, get_version
from tests.helpers import sample_events
from warehouse.query import run_query

ROOT = Path(__file__).resolve().parents[2]


def v2() -> dict:
    return copy.deepcopy(get_version(2).raw)


def test_v1_and_v2_writers_both_decode_under_the_latest_reader() -> None:
    event = next(e for e in sample_events(2) if e["event_type"] == "agent_action")
    old = decode_event(encode_event(event, version=1))
    new_event = {**event, "trace_id": "4bf92f3577b34da6", "payload": {**event["payload"], "finish_reason": "stop"}}
    new = decode_event(encode_event(new_event, version=2))
    assert (old["schema_version"], new["schema_version"]) == (1, 2)
    assert old["trace_id"] is None and old["payload"]["finish_reason"] is None  # v1 data gets v2 defaults
    assert new["trace_id"] == "4bf92f3577b34da6" and new["payload"]["finish_reason"] == "stop"


def test_shipped_versions_are_backward_compatible_and_the_new_kind_is_not_forward() -> None:
    backward = check_shipped(Compatibility.BACKWARD)
    assert set(backward) == {(1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)} and not any(backward.values())
    forward = check_shipped(Compatibility.FORWARD)
    assert len(forward[(1, 2)]) == 1 and "Annotation" in forward[(1, 2)][0]
    assert forward[(1, 3)] == forward[(1, 2)] and forward[(2, 3)] == []  # v3 adds no kind: v2 readers read it
    # v4 adds only optional fields (model-call token modes, verdict provenance, text parts)
    assert forward[(3, 4)] == [] and forward[(2, 4)] == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda s: s["fields"].insert(3, {"name": "tenant", "type": "string"}), ".tenant: reader field has no default"),
        (lambda s: s["fields"].__setitem__(2, {"name": "seq", "type": "string"}), "reader type string cannot read"),
        (lambda s: s["fields"][5]["type"]["symbols"].remove("evaluator"), "['evaluator'] unknown to the reader"),
    ],
)
def test_incompatible_changes_are_rejected_with_the_offending_field(change, expected: str) -> None:
    new = v2()
    change(new)
    problems = check_compatibility(v2(), new, Compatibility.BACKWARD)
    assert problems and expected in problems[0]
    with pytest.raises(IncompatibleSchema, match="not BACKWARD compatible"):
        assert_compatible(v2(), new, Compatibility.BACKWARD, "candidate")


def test_optional_field_with_default_is_fully_compatible() -> None:
    new = v2()
    new["fields"].insert(3, {"name": "tenant", "type": ["null", "string"], "default": None})
    assert check_compatibility(v2(), new, Compatibility.FULL) == []


def test_cli_schema_check(tmp_path: Path) -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trajlake.cli", "schema", "check", *args], capture_output=True, text=True, cwd=ROOT
        )

    assert check().returncode == 0
    bad = v2()
    bad["fields"].insert(3, {"name": "tenant", "type": "string"})
    (tmp_path / "old.avsc").write_text(json.dumps(v2()))
    (tmp_path / "new.avsc").write_text(json.dumps(bad))
    result = check("--old", str(tmp_path / "old.avsc"), "--new", str(tmp_path / "new.avsc"))
    assert result.returncode == 1
    message = " ".join((result.stdout + result.stderr).split())  # the console wraps long lines
    assert ".tenant: reader field has no default" in message


@pytest.mark.slow
@pytest.mark.integration
def test_v1_and_v2_producers_at_once_land_in_one_evolved_table(kafka_settings: Settings) -> None:
    events = sample_events(6)
    bootstrap = resolve_bootstrap(kafka_settings)
    v1 = EventProducer(bootstrap, kafka_settings.topic, "old-host", schema_version=1)
    v2_producer = EventProducer(bootstrap, kafka_settings.topic, "new-host", schema_version=2)
    for i, event in enumerate(events):
        (v1 if i % 2 else v2_producer).emit(event)
    annotation = {
        **events[0],
        "event_id": "annotation-1",
        "seq": 10_000,
        "event_type": "annotation",
        "source": "evaluator",
        "payload": {"key": "reviewed", "value": "yes", "author": None},
    }
    v2_producer.emit(annotation)
    v1.flush()
    v2_producer.flush()
    stats = IngestWorker(kafka_settings).run(until_idle=2)
    assert (stats.events, stats.dead_letters) == (len(events) + 1, 0)
    rows = run_query(
        kafka_settings,
        "SELECT schema_version, count(*) FROM events GROUP BY 1 ORDER BY 1",
    )[1]
    assert rows == [(1, len(events) // 2), (2, len(events) - len(events) // 2 + 1)]
    assert run_query(kafka_settings, "SELECT annotation.value FROM events WHERE event_id = 'annotation-1'")[1] == [
        ("yes",)
    ]
