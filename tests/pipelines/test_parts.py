"""Texts of any size land and export byte-identical: split into parts on import, whole again in assembly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set, read_export
from pipelines.score import score_all
from producers.importers import import_trajectory
from producers.parts import PART_BYTES, split_event, split_utf8
from schemas.registry import encode_event
from tests.helpers import AS_OF, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

FIXTURES = Path(__file__).resolve().parents[1] / "producers" / "importers" / "fixtures"


def _lake(home: Path) -> Settings:
    return load_settings(home=home, topic="unused", kafka_bootstrap=None)


def _big_run(tmp_path: Path, size: int) -> tuple[Path, str, str]:
    """The mini-swe-agent 2.x fixture with a submission of ``size`` characters and a huge tool output and thought."""
    data = json.loads(
        (FIXTURES / "mini_swe_agent_v2" / "acme__widgets-102" / "acme__widgets-102.traj.json").read_text()
    )
    lines = [f"+    value_{i} = UNITS[unit.casefold()]  # ünïcödé {i}\n" for i in range(size // 48 + 1)]
    patch = ("diff --git a/w.py b/w.py\n--- a/w.py\n+++ b/w.py\n@@ -1 +1,9999 @@\n" + "".join(lines))[:size]
    data["info"]["submission"] = patch
    data["messages"][-1]["content"] = patch
    output = "Ω" * (PART_BYTES * 2 + 17)  # two-byte characters across part boundaries, over one event
    tool = data["messages"][3]
    tool["content"] = f"<returncode>0</returncode>\n<output>\n{output}</output>"
    data["messages"][2]["content"] = "think " * 60_000
    run = tmp_path / "run" / "acme__widgets-102.traj.json"
    run.parent.mkdir(parents=True, exist_ok=True)
    run.write_text(json.dumps(data))
    (tmp_path / "run" / "acme__widgets-102.report.json").write_text(
        json.dumps({"acme__widgets-102": {"resolved": True, "tests_status": {}}})
    )
    return run, patch, output


@pytest.mark.slow
def test_an_890_kb_submission_lands_and_exports_byte_identical(tmp_path: Path) -> None:
    run, patch, output = _big_run(tmp_path, 890_000)
    events = import_trajectory(run)
    assert all(len(encode_event(e)) < 1 << 20 for e in events)  # every event fits ingest's record limit
    settings = _lake(tmp_path / "home")
    write_raw(settings, events)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    _, rows = run_query(settings, "SELECT output, truncated, thought FROM steps ORDER BY step_index")
    outputs = [r[0] for r in rows]
    assert patch in outputs and output in outputs and not any(r[1] for r in rows)
    assert rows[0][2].startswith("think think") and len(rows[0][2]) == len("think " * 60_000)
    export_training_set(Lakehouse.open(settings), "openai", tmp_path / "out", min_quality=0.0, filters=ALL_ORIGINS)
    (record,) = read_export(tmp_path / "out")
    assert record["submission"].encode() == patch.encode()
    tool_messages = [m["content"] for m in record["messages"] if m["role"] == "tool"]
    # the recorded conversation: the tool message as the model saw it, whole (its blob travelled in parts too)
    assert f"<returncode>0</returncode>\n<output>\n{output}</output>" in tool_messages
    _, quarantined = run_query(settings, "SELECT count(*) FROM quarantine")
    assert quarantined == [(0,)]


@pytest.mark.slow
def test_a_text_missing_a_part_keeps_its_head_says_so_and_is_quarantined(tmp_path: Path) -> None:
    run, patch, _ = _big_run(tmp_path, 890_000)
    events = import_trajectory(run)
    parts = [
        e for e in events if e["event_type"] == "annotation" and e["payload"]["part_of_field"] == "env_feedback.output"
    ]
    lost = parts[-1]["event_id"]
    settings = _lake(tmp_path / "home")
    write_raw(settings, [e for e in events if e["event_id"] != lost])
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    _, rows = run_query(settings, "SELECT output, truncated FROM steps WHERE length(output) > 100000")
    heads = [r for r in rows if patch.startswith(r[0])]
    assert heads and all(truncated for _, truncated in heads) and all(len(out) < len(patch) for out, _ in heads)
    _, quarantined = run_query(settings, "SELECT reason, action FROM quarantine")
    assert ("incomplete_parts", "kept_head") in quarantined


@hypothesis_settings(deadline=None)
@given(st.text(min_size=0, max_size=3000), st.integers(4, 64))
def test_split_utf8_joins_back_exactly(text: str, part_bytes: int) -> None:
    safe = "".join(c for c in text if not 0xD800 <= ord(c) <= 0xDFFF)
    pieces = split_utf8(safe, part_bytes)
    assert "".join(pieces) == safe and all(len(p.encode()) <= part_bytes for p in pieces)


def test_an_event_that_fits_is_not_split() -> None:
    event = {"event_id": "e", "event_type": "env_feedback", "payload": {"output": "x" * 100}}
    assert split_event(event) == [event]


@pytest.mark.parametrize("field", ["thought", "arguments", "command"])
def test_action_texts_split_by_size(field: str) -> None:
    event = {
        "event_id": "e",
        "session_id": "s",
        "seq": 0,
        "event_type": "agent_action",
        "extra": {},
        "payload": {"thought": "t", "arguments": "{}", "command": "c", field: "é" * (PART_BYTES * 2)},
    }
    head, *parts = split_event(event)
    assert head["extra"]["parts_of"] == f"agent_action.{field}"
    assert head["payload"][field] + "".join(p["payload"]["value"] for p in parts) == "é" * (PART_BYTES * 2)
