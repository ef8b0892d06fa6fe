"""Conformance of every importer on fixtures written from each format's public description.

Each format: detection, the actions as steps (tool, arguments, exit codes), the submission
byte-identical, the framework's exit status mapped by meaning, the verdict and its provenance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producers.fleet.llm.record import reconstruct
from producers.importers import detect_format, import_file, import_trajectory
from producers.importers._builder import ImportedSession
from schemas.registry import decode_event, encode_event

FIXTURES = Path(__file__).parent / "fixtures"


def _one(path: str) -> ImportedSession:
    (session,) = import_file(FIXTURES / path).sessions
    return session


def _by_task(path: str) -> dict[str, ImportedSession]:
    return {s.task_id: s for s in import_file(FIXTURES / path).sessions}


def _of(session: ImportedSession, kind: str) -> list[dict]:
    return [e["payload"] for e in session.events if e["event_type"] == kind]


def _end(session: ImportedSession) -> dict:
    (end,) = [e for e in session.events if e["event_type"] == "session_end"]
    return end


def _submission(session: ImportedSession) -> str:
    end = _end(session)
    (feedback,) = [e for e in session.events if e["event_id"] == end["extra"]["submission_event_id"]]
    return feedback["payload"]["output"]


def _check_stream(session: ImportedSession) -> None:
    """What every imported session keeps: seq from 0, ordered time, one session, encodable, answers after actions."""
    events = session.events
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert all(a["ts"] <= b["ts"] for a, b in zip(events, events[1:], strict=False))
    assert {e["session_id"] for e in events} == {session.session_id}
    assert len({e["event_id"] for e in events}) == len(events)
    assert events[0]["event_type"] == "session_start" and events[0]["host_id"] == "importer"
    assert events[0]["extra"]["source_kind"] == "import" and events[0]["extra"]["source_sha256"]
    actions = {e["event_id"]: e for e in events if e["event_type"] == "agent_action"}
    for feedback in (e for e in events if e["event_type"] == "env_feedback"):
        assert actions[feedback["parent_event_id"]]["seq"] < feedback["seq"]
    for event in events:
        assert decode_event(encode_event(event), 1 << 20)["event_id"] == event["event_id"]


def test_mini_swe_agent_1x_text_actions_become_steps() -> None:
    path = FIXTURES / "mini_swe_agent_v1" / "acme__widgets-101.traj.json"
    raw = json.loads(path.read_text())
    assert detect_format(path) == "mini-swe-agent"
    session = _one("mini_swe_agent_v1/acme__widgets-101.traj.json")
    _check_stream(session)
    commands = [a["command"] for a in _of(session, "agent_action")]
    # five fenced blocks; the reply with two blocks got a format error back and is no step
    assert commands[0] == 'grep -rn "def parse_size" widgets/' and len(commands) == 5
    assert commands[-1] == "echo MINI_SWE_AGENT_FINAL_OUTPUT && git diff"
    assert [f["exit_code"] for f in _of(session, "env_feedback")][:4] == [0, 0, 0, 1]
    assert _submission(session).encode() == raw["info"]["submission"].encode()
    assert _end(session)["payload"]["status"] == "completed"
    (verdict,) = _of(session, "evaluation")  # a flat SWE-bench report beside the run (no instance key)
    assert verdict["passed"] and verdict["provenance"] == "harness_report" and verdict["tests_passed"] == 2
    cost = sum(a["cost_usd"] for a in _of(session, "agent_action"))
    assert cost == pytest.approx(raw["info"]["model_stats"]["instance_cost"])  # apportioned over the turns


def test_mini_swe_agent_2x_tool_calls_with_a_summary_one_directory_up() -> None:
    session = _one("mini_swe_agent_v2")
    _check_stream(session)
    raw = json.loads((FIXTURES / "mini_swe_agent_v2" / "acme__widgets-102" / "acme__widgets-102.traj.json").read_text())
    actions = _of(session, "agent_action")
    assert [a["tool_call_id"] for a in actions] == ["call_a1", "call_a2", "call_b1", "call_c1", "call_d1"]
    assert actions[0]["output_tokens"] == 120 and actions[1]["output_tokens"] == 0  # a turn's tokens once
    assert _submission(session).encode() == raw["info"]["submission"].encode()
    (verdict,) = _of(session, "evaluation")  # results.json: listed unresolved
    assert verdict["passed"] is False and verdict["provenance"] == "harness_report"
    rebuilt = reconstruct([p["model_call"] for p in _of(session, "agent_input")])
    assert [m["role"] for m in rebuilt[-1].messages] == ["system", "user", "assistant", "tool", "tool"] + [
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]


def test_swe_agent_traj_and_enigma() -> None:
    sessions = _by_task("swe_agent")
    swe, ctf = sessions["acme__widgets-103"], sessions["enigma_rev_crackme"]
    for session in sessions.values():
        _check_stream(session)
    tools = [a["tool_name"] for a in _of(swe, "agent_action")]
    assert tools == ["find_file", "str_replace_editor", "str_replace_editor", "str_replace_editor", "submit"]
    (verdict,) = _of(swe, "evaluation")  # a keyed harness report beside the run's directory
    assert verdict["passed"] and verdict["tests_total"] == 3
    assert swe.events[0]["agent_model"] == "claude-3-7-sonnet-20250219"
    assert ctf.events[0]["task_type"] == "ctf"
    assert [a["command"] for a in _of(ctf, "agent_action")][
        1
    ] == "decompile --function_name FUN_00401a2c /challenge/rev_crackme"


def test_openhands_v0_output_lines_and_the_iteration_limit() -> None:
    sessions = _by_task("openhands_v0/output.jsonl")
    solved, capped = sessions["acme__widgets-104"], sessions["acme__widgets-105"]
    for session in sessions.values():
        _check_stream(session)
    assert solved.position == "line 1" and capped.position == "line 2"
    assert [a["tool_name"] for a in _of(solved, "agent_action")][:3] == ["str_replace_editor"] * 3
    ops = [(o["op"], o["path"]) for o in _of(solved, "file_op")]
    assert ops == [("write", "/workspace/widgets/size.py")]
    raw = json.loads((FIXTURES / "openhands_v0" / "output.jsonl").read_text().splitlines()[0])
    assert _submission(solved).encode() == raw["test_result"]["git_patch"].encode()
    # "Agent reached maximum iteration" is a limit, not the infrastructure
    end = _end(capped)["payload"]
    assert end["status"] == "capped" and "maximum iteration" in end["exit_reason"]
    assert [v["passed"] for v in _of(capped, "evaluation")] == [False]


def test_openhands_v1_events_with_object_actions() -> None:
    path = FIXTURES / "openhands_v1" / "acme__widgets-106.events.json"
    assert detect_format(path) == "openhands-v1"
    session = _one("openhands_v1/acme__widgets-106.events.json")
    _check_stream(session)
    actions = _of(session, "agent_action")
    assert [json.loads(a["arguments"]).get("path") for a in actions[:3]] == [
        "/workspace/widgets/size.py",
        "/workspace/widgets/units.py",
        "/workspace/tests/test_size.py",
    ]
    assert [a["command"] for a in actions] == [None, None, None, None, "python -m pytest -q", None]
    inputs = _of(session, "agent_input")
    assert len(inputs) == 4  # one model response made the three views
    assert inputs[0]["input_tokens"] == 4100 and actions[0]["output_tokens"] == 150 and actions[1]["output_tokens"] == 0
    assert [f["exit_code"] for f in _of(session, "env_feedback")][4] == 0
    assert [(o["op"], o["path"]) for o in _of(session, "file_op")] == [("write", "/workspace/widgets/size.py")]
    assert _end(session)["payload"]["status"] == "completed"


def test_openhands_v1_evaluation_output_maps_exit_status_by_meaning() -> None:
    sessions = _by_task("openhands_v1/output.jsonl")
    auth, capped = sessions["acme__widgets-107"], sessions["acme__widgets-108"]
    assert _end(auth)["payload"]["status"] == "error"  # an authentication failure is the infrastructure
    assert "AuthenticationError" in _end(auth)["payload"]["exit_reason"]
    assert _end(capped)["payload"]["status"] == "capped"  # the iteration limit is a limit
    assert [v["passed"] for v in _of(capped, "evaluation")] == [False]


def test_harbor_job_trials_with_the_verifiers_reward() -> None:
    assert detect_format(FIXTURES / "harbor_job") == "harbor"
    result = import_file(FIXTURES / "harbor_job")
    sessions = {s.task_id: s for s in result.sessions}
    assert set(sessions) == {"hello-world", "fix-git"} and not result.quarantined
    hello, git = sessions["hello-world"], sessions["fix-git"]
    for session in sessions.values():
        _check_stream(session)
    assert hello.events[0]["image_version"] == "ATIF-v1.2" and git.events[0]["image_version"] == "ATIF-v1.6"
    (verdict,) = _of(hello, "evaluation")
    assert verdict["passed"] and verdict["reward"] == 1.0 and verdict["provenance"] == "harbor_verifier"
    assert hello.events[0]["agent_model"] == "openai/gpt-5" and hello.events[0]["agent_name"] == "terminus-2"
    # ATIF 1.6 content parts are text; an agent timeout is a limit
    assert _of(git, "env_feedback")[0]["output"] == "a1b2c3d HEAD@{0}: reset: moving to HEAD~1\n"
    assert _end(git)["payload"]["status"] == "capped"
    assert [v["passed"] for v in _of(git, "evaluation")] == [False]
    trial = import_file(FIXTURES / "harbor_job" / "hello-world__Xy7aQ")  # one trial directory alone
    assert [s.session_id for s in trial.sessions] == [hello.session_id]


def test_atif_13_alone_keeps_its_own_id_aside() -> None:
    session = _one("atif/run.atif.json")
    _check_stream(session)
    assert session.events[0]["extra"]["source_session_id"] == "lone-atif-13"
    assert session.session_id != "lone-atif-13" and session.steps == 3


def test_otel_semconv_trace_is_one_session_with_calls_tools_and_tokens() -> None:
    path = FIXTURES / "otel" / "weather.otlp.json"
    assert detect_format(path) == "otel"
    session = _one("otel/weather.otlp.json")
    _check_stream(session)
    assert session.events[0]["payload"]["instruction"] == "What is the weather in Paris and in Lyon?"
    actions = _of(session, "agent_action")
    assert [(a["tool_name"], a["tool_call_id"]) for a in actions] == [
        ("get_weather", "call_p"),
        ("get_weather", "call_l"),
    ]
    feedback = _of(session, "env_feedback")
    assert [f["output"] for f in feedback] == ["rain, 14 °C", ""]
    assert feedback[1]["failure_reason"] == "weather service timed out"
    assert [i["input_tokens"] for i in _of(session, "agent_input")] == [131, 210]
    assert actions[0]["output_tokens"] == 44
    assert session.events[0]["extra"]["source_session_id"] == "conv-42"
    calls = reconstruct([p["model_call"] for p in _of(session, "agent_input")])
    assert [m["role"] for m in calls[1].messages] == ["system", "user", "assistant", "tool", "tool"]


def test_otel_openinference_lines_join_one_trace_across_lines() -> None:
    session = _one("otel/openinference.jsonl")
    _check_stream(session)
    (action,) = _of(session, "agent_action")
    assert action["tool_name"] == "shell" and action["command"] == "ls /tmp | wc -l"
    assert [f["output"] for f in _of(session, "env_feedback")] == ["7"]
    assert session.events[0]["agent_model"] == "gpt-4o-mini"


def test_reimport_gives_the_same_events() -> None:
    for path in ("mini_swe_agent_v1/acme__widgets-101.traj.json", "harbor_job", "otel/weather.otlp.json"):
        assert import_trajectory(FIXTURES / path) == import_trajectory(FIXTURES / path)
