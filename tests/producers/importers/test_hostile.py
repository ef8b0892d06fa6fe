"""Hostile and malformed input: values set aside per field, half-good files, one-line errors, whole sessions."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines.intake.importing import SessionSender
from producers.importers import ImportFormatError, _builder, import_file, import_paths
from producers.importers._builder import ImportedSession
from producers.importers._values import FieldIssues
from producers.sdk import EventProducer
from schemas.registry import encode_event

FIXTURES = Path(__file__).parent / "fixtures"
HUGE_ID = "i" * (2 << 20)
LONE = "bad \ud800 text"


def _mini(data: dict) -> None:
    data["messages"][2]["extra"]["timestamp"] = 1e300
    data["messages"][3]["extra"]["timestamp"] = float("inf")
    data["messages"][2]["extra"]["response"]["usage"]["prompt_tokens"] = 10**30
    data["messages"][2]["extra"]["cost"] = float("nan")
    data["messages"][2]["content"] = LONE
    data["instance_id"] = HUGE_ID


def _atif(data: dict) -> None:
    data["steps"][2]["timestamp"] = "+275760-09-13T00:00:00Z"
    data["steps"][2]["metrics"]["prompt_tokens"] = 10**30
    data["steps"][2]["metrics"]["cost_usd"] = 1e300
    data["steps"][2]["tool_calls"][0]["tool_call_id"] = HUGE_ID
    data["steps"][0]["message"] = LONE


def _openhands(data: dict) -> None:
    history = data["history"]
    history[1]["timestamp"] = 1e300
    history[1]["tool_call_metadata"]["model_response"]["usage"]["prompt_tokens"] = float("inf")
    history[2]["extras"]["metadata"] = {"exit_code": 10**12}
    history[0]["args"]["content"] = LONE
    data["instance_id"] = HUGE_ID


def _otel(data: dict) -> None:
    spans = data["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[1]["startTimeUnixNano"] = str(10**40)
    spans[1]["attributes"].append({"key": "gen_ai.usage.input_tokens", "value": {"doubleValue": 1e300}})
    spans[2]["attributes"].append({"key": "gen_ai.tool.call.result", "value": {"stringValue": LONE}})
    spans[0]["attributes"].append({"key": "gen_ai.agent.name", "value": {"stringValue": HUGE_ID}})


CASES: dict[str, tuple[str, Callable[[dict], None], bool]] = {
    "mini-swe-agent": ("mini_swe_agent_v2/acme__widgets-102/acme__widgets-102.traj.json", _mini, False),
    "atif": ("harbor_job/fix-git__Pq3Lm/agent/trajectory.json", _atif, False),
    "openhands": ("openhands_v0/output.jsonl", _openhands, True),
    "otel": ("otel/weather.otlp.json", _otel, False),
}


def _write(tmp_path: Path, name: str, data: Any, lines: bool) -> Path:
    path = tmp_path / name
    # json.dumps writes NaN/Infinity and \ud800 escapes as recorded runs do (Python's and many tools' JSON)
    path.write_text(json.dumps(data) + "\n" if lines else json.dumps(data))
    return path


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_out_of_range_values_huge_ids_and_lone_surrogates_are_set_aside_per_field(tmp_path: Path, fmt: str) -> None:
    relative, poison, lines = CASES[fmt]
    text = (FIXTURES / relative).read_text()
    data = json.loads(text.splitlines()[0]) if lines else json.loads(text)
    poison(data)
    path = _write(tmp_path, Path(relative).name, data, lines)
    (session,) = import_file(path).sessions
    assert session.steps > 0
    for event in session.events:
        assert len(encode_event(event)) < 1 << 20
    end = next(e for e in session.events if e["event_type"] == "session_end")
    assert end["extra"]["set_aside"] and session.issues
    assert all(len(e["task_id"]) <= 512 and len(e["session_id"]) == 32 for e in session.events)


@pytest.mark.parametrize(
    "where",
    [
        ("messages", 7, "extra", "response", "choices", 0, "finish_reason"),  # found by the fuzzer: a 1 MB label
        ("messages", 7, "extra", "response", "id"),
        ("info", "config", "model", "model_name"),
    ],
)
def test_a_megabyte_in_a_label_field_is_shortened_not_sent_oversized(tmp_path: Path, where: tuple) -> None:
    data = json.loads((FIXTURES / CASES["mini-swe-agent"][0]).read_text())
    parent = data
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = "i" * (1 << 20)
    path = _write(tmp_path, "run.traj.json", data, False)
    (session,) = import_file(path).sessions
    assert all(len(encode_event(e)) < 1 << 20 for e in session.events) and session.issues


def test_a_half_good_file_imports_its_good_records_and_names_the_rest(tmp_path: Path) -> None:
    lines = (FIXTURES / "openhands_v0" / "output.jsonl").read_text().splitlines()
    broken = json.loads(lines[1])
    broken["history"] = "not a list of events"
    path = tmp_path / "output.jsonl"
    path.write_text("\n".join([lines[0], lines[0][:50], json.dumps(broken), json.dumps({"instance_id": "x"})]) + "\n")
    sent: list[dict] = []
    report = import_paths([path], sent.append)
    assert [s.position for s in report.summaries] == ["line 1"]
    assert [q.position for q in report.quarantined] == ["line 2", "line 3", "line 4"]
    assert all("\n" not in str(q) for q in report.quarantined)
    assert {e["session_id"] for e in sent} == {report.summaries[0].session_id}


def test_a_harbor_trial_without_a_trajectory_is_quarantined_by_name(tmp_path: Path) -> None:
    import shutil

    job = tmp_path / "job"
    shutil.copytree(FIXTURES / "harbor_job", job)
    (job / "fix-git__Pq3Lm" / "agent" / "trajectory.json").unlink()
    result = import_file(job)
    assert [s.task_id for s in result.sessions] == ["hello-world"]
    assert [(q.position, "without an ATIF trajectory" in q.reason) for q in result.quarantined] == [
        ("fix-git__Pq3Lm", True)
    ]


def test_an_unknown_format_is_one_line_saying_what_was_found_and_why_nothing_fits(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"conversation": [{"speaker": "bot"}], "meta": {}}))
    with pytest.raises(ImportFormatError) as info:
        import_file(path)
    message = str(info.value)
    assert "\n" not in message and "keys ['conversation', 'meta']" in message
    for name in ("mini-swe-agent", "swe-agent", "openhands", "openhands-v1", "atif", "otel"):
        assert f"{name}:" in message


def test_a_session_that_cannot_be_encoded_sends_nothing_of_itself() -> None:
    producer = EventProducer("127.0.0.1:1", "unused", "test", spool_dir=None, redact=False)
    try:
        (session,) = import_file(FIXTURES / "atif" / "run.atif.json").sessions
        broken = copy.deepcopy(session)
        broken.events[-1]["payload"]["status"] = {"not": "a string"}  # the last event does not fit the schema
        sender = SessionSender(producer)
        sender(broken)
        assert producer.produced == 0 and [s.session_id for s, _ in sender.failed] == [session.session_id]
        sender(session)
        assert producer.produced == len(session.events) and sender.sent == {session.session_id}
    finally:
        producer._producer.purge()  # nothing is delivered: there is no broker at 127.0.0.1:1


def _turns(n: int) -> dict:
    """A mini-swe-agent 2.x run of ``n`` turns (the fixture's first turn repeated with fresh ids)."""
    data = json.loads(
        (FIXTURES / "mini_swe_agent_v2" / "acme__widgets-102" / "acme__widgets-102.traj.json").read_text()
    )
    head, turn = data["messages"][:2], data["messages"][5:7]
    messages = list(head)
    for i in range(n):
        assistant, tool = copy.deepcopy(turn)
        assistant["tool_calls"][0]["id"] = tool["tool_call_id"] = f"call_{i}"
        assistant["content"] = f"step {i}: " + "x" * 200
        tool["content"] = f"<returncode>0</returncode>\n<output>\nresult {i} " + "y" * 500 + "</output>"
        messages += [assistant, tool]
    data["messages"] = messages
    return data


def test_import_work_is_linear_in_the_number_of_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes serialised while importing grow with the run, not with its square (the request of every turn
    is a delta of the conversation, not the conversation again)."""
    serialised = [0]
    original = _builder.canonical

    def counting(value: Any) -> str:
        text = original(value)
        serialised[0] += len(text)
        return text

    monkeypatch.setattr(_builder, "canonical", counting)
    work = {}
    for n in (100, 400):
        path = tmp_path / f"run{n}.traj.json"
        path.write_text(json.dumps(_turns(n)))
        serialised[0] = 0
        (session,) = import_file(path).sessions
        assert session.steps == n
        work[n] = serialised[0]
    assert work[400] / work[100] < 4.6  # 4x the turns: about 4x the work (quadratic would be 16x)


def test_field_issues_summary_is_one_bounded_line() -> None:
    issues = FieldIssues()
    for i in range(100):
        issues.add(f"messages[{i}].timestamp", "time out of range: 1e+300")
    line = issues.summary()
    assert "\n" not in line and line.endswith("and 80 more")


def test_every_event_of_a_session_shares_the_producer_identity() -> None:
    for name in ("mini_swe_agent_v1", "harbor_job", "otel/weather.otlp.json"):
        for session in import_file(FIXTURES / name).sessions:
            identities = {
                (e["host_id"], e["extra"]["source_kind"], e["extra"]["source_sha256"]) for e in session.events
            }
            assert len(identities) == 1, name


def _unused(session: ImportedSession) -> None:  # keeps the type import honest for readers
    del session
