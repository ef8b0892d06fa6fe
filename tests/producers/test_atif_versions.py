"""ATIF import across versions: v1.2 (system-step observations) to v1.8 (audio content parts), each version's own
fields read, an unknown version refused with one clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from producers.fleet.llm.record import reconstruct
from producers.importers import ImportFormatError, import_trajectory

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def _document(version: str) -> dict[str, Any]:
    """A small trajectory using what ``version`` allows."""
    minor = int(version.rsplit(".", 1)[1])
    metrics: dict[str, Any] = {"prompt_tokens": 40, "completion_tokens": 3, "cached_tokens": 10, "cost_usd": 0.0002}
    if minor >= 3:
        metrics["completion_token_ids"] = [7, 8, 9]
        metrics["logprobs"] = [-0.1, -0.2, -0.3]
    if minor >= 4:
        metrics["prompt_token_ids"] = list(range(40))
    task: Any = "Fix the bug in app.py."
    result: Any = "Traceback: ValueError"
    if minor >= 6:  # content parts: text and an image (audio from v1.8)
        task = [{"type": "text", "text": "Fix the bug in app.py."}]
        task.append({"type": "image", "source": {"media_type": "image/png", "path": "images/screen.png"}})
        if minor >= 8:
            task.append({"type": "audio", "source": {"media_type": "audio/wav", "path": "audio/note.wav"}})
        result = [{"type": "text", "text": "Traceback: ValueError"}]
    call = {"tool_call_id": "call_1", "function_name": "bash", "arguments": {"command": "python app.py"}}
    observed: dict[str, Any] = {"source_call_id": "call_1", "content": result}
    if minor >= 7:
        call["extra"] = {"timeout_s": 30}
        observed["extra"] = {"exit_code": 1}
    steps: list[dict[str, Any]] = [
        {
            "step_id": 1,
            "source": "system",
            "message": "You are a careful engineer.",
            "timestamp": "2025-10-01T10:00:00Z",
        },
        {"step_id": 2, "source": "user", "message": task, "timestamp": "2025-10-01T10:00:00Z"},
        {
            "step_id": 3,
            "source": "agent",
            "timestamp": "2025-10-01T10:00:05Z",
            "model_name": "gpt-test",
            "message": "Run it first.",
            "reasoning_content": "The traceback will say where.",
            "tool_calls": [call],
            "observation": {"results": [observed]},
            "metrics": metrics,
        },
        {  # v1.2: a system step holding the result of an operation nobody called as a tool
            "step_id": 4,
            "source": "system",
            "message": "",
            "observation": {"results": [{"source_call_id": None, "content": "context was summarised"}]},
        },
        {"step_id": 5, "source": "agent", "message": "Done.", "metrics": {"prompt_tokens": 60, "completion_tokens": 2}},
    ]
    if minor >= 7:  # a deterministic dispatch (no model call) and a step copied from an earlier trajectory
        steps.insert(2, {"step_id": 0, "source": "agent", "message": "Earlier answer.", "is_copied_context": True})
        steps.insert(
            4,
            {
                "step_id": 0,
                "source": "agent",
                "message": "",
                "llm_call_count": 0,
                "tool_calls": [{"tool_call_id": "call_2", "function_name": "bash", "arguments": {"command": "ls"}}],
                "observation": {"results": [{"source_call_id": "call_2", "content": "app.py"}]},
            },
        )
    for number, step in enumerate(steps, start=1):
        step["step_id"] = number
    agent: dict[str, Any] = {"name": "some-agent", "version": "2.1", "model_name": "gpt-test"}
    if minor >= 5:
        agent["tool_definitions"] = TOOLS
    document: dict[str, Any] = {"schema_version": version, "agent": agent, "steps": steps}
    if minor >= 7:
        document["trajectory_id"] = f"traj-{minor}"  # session_id is optional from v1.7
    else:
        document["session_id"] = f"run-{minor}"
    return document


@pytest.mark.parametrize("minor", range(2, 9))
def test_every_atif_version_from_1_2_imports_with_its_own_fields(tmp_path: Path, minor: int) -> None:
    version = f"ATIF-v1.{minor}"
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(_document(version)))
    events = import_trajectory(path, format="atif")
    # the trajectory's own id (session_id, or trajectory_id from v1.7) is kept beside the lake's own
    assert {e["extra"]["source_session_id"] for e in events} == {f"traj-{minor}" if minor >= 7 else f"run-{minor}"}
    assert len({e["session_id"] for e in events}) == 1
    start = next(e for e in events if e["event_type"] == "session_start")
    instruction = start["payload"]["instruction"]
    assert instruction.startswith("Fix the bug in app.py.")
    if minor >= 6:
        assert "[image: images/screen.png]" in instruction
    if minor >= 8:
        assert "[audio: audio/note.wav]" in instruction
    calls = [e["payload"]["model_call"] for e in events if e["event_type"] == "agent_input"]
    assert len(calls) == 2  # the copied step and the deterministic dispatch are not model calls
    first = reconstruct(calls)[0]
    assert [m["role"] for m in first.messages][:2] == ["system", "user"]
    assert first.completion_token_ids == ([7, 8, 9] if minor >= 3 else [])
    assert first.completion_logprobs == ([-0.1, -0.2, -0.3] if minor >= 3 else [])
    assert first.prompt_token_ids == (list(range(40)) if minor >= 4 else None)
    assert first.tools == (TOOLS if minor >= 5 else None)
    assert calls[0]["cost_usd"] == 0.0002 and calls[0]["cached_tokens"] == 10
    actions = [e["payload"] for e in events if e["event_type"] == "agent_action"]
    assert [a["tool_call_id"] for a in actions] == (["call_1", "call_2"] if minor >= 7 else ["call_1"])
    outputs = [e["payload"]["output"] for e in events if e["event_type"] == "env_feedback"]
    assert outputs[0] == "Traceback: ValueError"
    second = reconstruct(calls)[1]
    # the v1.2 system observation is part of what the model saw next
    assert any(m.get("content") == "context was summarised" for m in second.messages)
    if minor >= 7:
        assert any(m.get("content") == "Earlier answer." for m in second.messages)


@pytest.mark.parametrize("version", ["ATIF-v2.0", "ATIF-v1.9", "ATIF-1.4"])
def test_an_unknown_atif_version_is_one_clear_error(tmp_path: Path, version: str) -> None:
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps({**_document("ATIF-v1.4"), "schema_version": version}))
    with pytest.raises(ImportFormatError, match="unsupported ATIF version"):
        import_trajectory(path, format="atif")


@pytest.mark.parametrize(
    "claim",
    [{"eval_passed": True, "reward": 1.0}, {"reward": 0.25}, {"eval_passed": False}, {"eval_passed": True}],
)
def test_a_files_own_verdict_is_self_reported_and_an_export_restates_it_as_claimed(
    tmp_path: Path, claim: dict[str, Any]
) -> None:
    from pipelines.export.atif import verdict

    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps({**_document("ATIF-v1.7"), "extra": claim}))
    events = import_trajectory(path, format="atif")
    (evaluation,) = [e for e in events if e["event_type"] == "evaluation"]
    assert evaluation["payload"]["provenance"] == "self_reported"  # a claim: the lake does not count it
    (end,) = [e for e in events if e["event_type"] == "session_end"]
    assert end["payload"]["reward"] is None  # never the session's reward either
    payload = evaluation["payload"]
    row = {"eval_passed": None, "reward": None, "verdict_provenance": None}
    stated = {"passed": payload["passed"], "reward": payload["reward"], "details": payload["details"]}
    assert verdict({**row, "claimed_verdict": stated}) == (claim.get("eval_passed"), claim.get("reward"))
    # a verdict that counted is what an export writes, whatever the file claimed
    trusted = {"eval_passed": False, "reward": 0.0, "verdict_provenance": "harness_report", "claimed_verdict": stated}
    assert verdict(trusted) == (False, 0.0)
