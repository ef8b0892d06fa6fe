"""The loop signal compares whole actions: tool and every argument, never a NULL command or a normalised id."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import pytest

from quality.config import QualityConfig
from quality.dedup import whole_action_tokens
from quality.scoring import score_sessions

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_OPS = pl.DataFrame(
    schema={"session_id": pl.Utf8, "event_id": pl.Utf8, "op": pl.Utf8, "path": pl.Utf8, "in_workspace": pl.Boolean}
)
_NET = pl.DataFrame(
    schema={"session_id": pl.Utf8, "event_id": pl.Utf8, "host": pl.Utf8, "port": pl.Int32, "allowed": pl.Boolean}
)
_STEPS = {
    "session_id": pl.Utf8,
    "step_index": pl.Int64,
    "action_event_id": pl.Utf8,
    "tool_name": pl.Utf8,
    "arguments": pl.Utf8,
    "command": pl.Utf8,
    "exit_code": pl.Int32,
    "failure_reason": pl.Utf8,
}


def _scores(actions: dict[str, list[tuple[str, str, str | None]]]) -> dict[str, dict]:
    """Scores of sessions given as ``sid -> [(tool, arguments, command)]``."""
    traj = pl.DataFrame(
        [
            {
                "session_id": sid,
                "task_id": f"task-{sid}",
                "task_type": "swe",
                "status": "completed",
                "exit_reason": "finish",
                "started_at": T0,
                "duration_s": 10.0,
                "n_steps": len(steps),
                "n_file_writes": 0,
                "cpu_seconds": 1.0,
                "peak_memory_bytes": 1 << 20,
                "peak_processes": 1,
                "n_network_requests": 0,
                "instruction": f"task {sid}",
                "eval_passed": True,
                "reward": 1.0,
            }
            for sid, steps in actions.items()
        ]
    )
    steps = pl.DataFrame(
        [
            {
                "session_id": sid,
                "step_index": i,
                "action_event_id": f"{sid}-{i}",
                "tool_name": tool,
                "arguments": arguments,
                "command": command,
                "exit_code": 0,
                "failure_reason": None,
            }
            for sid, own in actions.items()
            for i, (tool, arguments, command) in enumerate(own)
        ],
        schema=_STEPS,
    )
    result = score_sessions(traj, steps, _OPS, _NET, QualityConfig())
    return {r["session_id"]: r for r in result.scores.iter_rows(named=True)}


def _view(path: str) -> tuple[str, str, None]:
    return "str_replace_editor", json.dumps({"command": "view", "path": path}), None


def _decompile(function: str) -> tuple[str, str, str]:
    command = f"decompile --function_name {function} /challenge/binary"
    return "decompile", json.dumps({"command": command}), command


def test_editor_views_of_different_files_are_different_actions() -> None:
    # OpenHands' editor actions have no shell command: only the arguments tell them apart
    scores = _scores({"views": [_view("/workspace/a.py"), _view("/workspace/b.py"), _view("/workspace/c.py")]})
    assert not scores["views"]["has_loop"] and scores["views"]["validity"] == 1.0


def test_calls_on_different_identifiers_are_different_actions() -> None:
    functions = ["FUN_004015dc", "FUN_00401a2c", "FUN_00401b7e", "FUN_00401c00"]
    scores = _scores({"ctf": [_decompile(f) for f in functions]})
    assert not scores["ctf"]["has_loop"] and scores["ctf"]["validity"] == 1.0


@pytest.mark.parametrize(
    "action",
    [_view("/workspace/a.py"), _decompile("FUN_004015dc"), ("bash", '{"command": "pytest -q"}', "pytest -q")],
)
def test_the_same_whole_action_three_times_is_a_loop(action: tuple[str, str, str | None]) -> None:
    scores = _scores({"loop": [("bash", '{"command": "ls"}', "ls"), action, action, action]})
    assert scores["loop"]["has_loop"] and scores["loop"]["validity"] < 1.0


def test_whole_action_tokens_differ_in_any_field_and_tell_null_from_empty() -> None:
    steps = pl.DataFrame(
        [
            {"session_id": "s", "step_index": 0, "tool_name": "t", "arguments": None, "command": None},
            {"session_id": "s", "step_index": 1, "tool_name": "t", "arguments": "", "command": None},
            {"session_id": "s", "step_index": 2, "tool_name": "t", "arguments": None, "command": ""},
            {"session_id": "s", "step_index": 3, "tool_name": "u", "arguments": None, "command": None},
            {"session_id": "s", "step_index": 4, "tool_name": "t", "arguments": None, "command": None},
        ],
        schema={
            k: v for k, v in _STEPS.items() if k in ("session_id", "step_index", "tool_name", "arguments", "command")
        },
    ).with_columns(pl.lit(None, pl.Utf8).alias("failure_reason"))
    tokens = whole_action_tokens(steps)["token"].to_list()
    assert len(set(tokens[:4])) == 4 and tokens[0] == tokens[4]
