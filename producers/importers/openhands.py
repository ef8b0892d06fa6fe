"""Import OpenHands event lists (a JSON array of actions and observations).

Agent actions (run, edit, read, message, finish, …) become agent_action
events; an observation whose ``cause`` names an imported action becomes the
env_feedback answering it (exit code from ``extras.metadata.exit_code``,
duration from the timestamp delta). One agent_input precedes each model
response (``tool_call_metadata.model_response``, which also gives the token
counts; several actions may share one response). Edit observations add a
file_op. User messages after the first are carried into the next agent_input.
An event list records no reward; the workspace root is the sandbox's ``/workspace``
(or the working directory a command observation reports).

OpenHands' evaluation output (``output.jsonl``: one object per line with
``instance_id``, ``instruction``, ``history`` as ``[action, observation]`` pairs,
``metrics``, ``error``, ``test_result``) gives one session per line, its ids derived
from the line's bytes; a ``test_result`` that says whether the instance was solved
(``result``, ``resolved``, ``success``, or ``report.resolved``) becomes an
``evaluation`` after ``session_end``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producers.importers._common import (
    FieldIssues,
    ImportedSession,
    ImportFormatError,
    RunBuilder,
    SourceFile,
    Verdict,
    digest,
    exit_outcome,
    exit_reason,
    object_of,
    text_of,
)
from producers.importers._skeleton import replay, wall_seconds
from producers.importers._source import JsonLines
from producers.importers._values import count, iso_micros
from producers.importers.verdicts import HARNESS, attach_verdict_beside

FRAMEWORK = "openhands"
# Control events of the OpenHands runtime, not steps of the agent.
_NOT_STEPS = frozenset({"change_agent_state", "recall", "system"})


def _is_event_list(data: Any) -> bool:
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(e, dict) and "id" in e and ("action" in e or "observation" in e) for e in data)
        and not any("kind" in e for e in data[:20])  # V1 events carry a ``kind``
    )


def _is_output_record(record: Any) -> bool:
    return (
        isinstance(record, dict)
        and isinstance(record.get("history"), list)
        and "trajectory" not in record  # SWE-agent's .traj also has a history
        and ("instance_id" in record or "instruction" in record)
    )


def _is_eval_output(data: Any) -> bool:
    """OpenHands evaluation output: JSON Lines of output records (judged by the first), or one record."""
    if isinstance(data, JsonLines):
        return _is_output_record(data.first) and not _is_v1_history(data.first.get("history"))
    return _is_output_record(data) and not _is_v1_history(data.get("history"))


def _is_v1_history(history: Any) -> bool:
    """Whether an evaluation output's history holds OpenHands V1 (agent-sdk) events: objects with ``kind``."""
    return isinstance(history, list) and any(isinstance(e, dict) and "kind" in e for e in history[:20])


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is an OpenHands (V0) event list or OpenHands V0 evaluation output (JSON Lines)."""
    return _is_event_list(data) or _is_eval_output(data)


def why_not(data: Any) -> str:
    """Why ``data`` is not OpenHands V0 (for the unknown-format message)."""
    return "no list of events with numeric 'id' and 'action'/'observation', nor output records with a 'history'"


def _flatten_history(history: list[Any]) -> list[dict[str, Any]]:
    """``[action, observation]`` pairs (older output) or plain events, as one event list with ids."""
    events: list[dict[str, Any]] = []
    for item in history:
        pair = item if isinstance(item, list | tuple) else [item]
        events.extend(e for e in pair if isinstance(e, dict))
    known = [e["id"] for e in events if isinstance(e.get("id"), int)]
    next_id = max(known, default=0) + 1
    for event in events:
        if "id" not in event:  # "No observation" placeholders carry no id
            event["id"], next_id = next_id, next_id + 1
    return [e for e in events if "action" in e or "observation" in e]


def _patch_of(test_result: Any) -> str | None:
    """The submitted patch of a SWE-bench-style output (``test_result.git_patch``), verbatim, or None."""
    if isinstance(test_result, dict) and isinstance(test_result.get("git_patch"), str):
        return test_result["git_patch"] or None
    return None


def _verdict(test_result: Any) -> bool | None:
    """Whether an instance was solved, from the shapes OpenHands' benchmarks write, or None."""
    if isinstance(test_result, str):
        try:
            test_result = json.loads(test_result)
        except ValueError:
            return None
    if not isinstance(test_result, dict):
        return None
    for key in ("result", "resolved", "success", "correct"):
        if isinstance(test_result.get(key), bool):
            return bool(test_result[key])
    report = test_result.get("report")
    if isinstance(report, dict) and isinstance(report.get("resolved"), bool):
        return bool(report["resolved"])
    return None


def _response_call(metadata: dict[str, Any]) -> dict[str, Any] | None:
    """The tool call with this action's id inside the recorded model response."""
    response = metadata.get("model_response") or {}
    for choice in response.get("choices") or []:
        for call in ((choice or {}).get("message") or {}).get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id") == metadata.get("tool_call_id"):
                return call
    return None


def convert(source: SourceFile) -> list[ImportedSession]:
    """The session of one OpenHands event list, or of one line of an evaluation output.

    Raises:
        ImportFormatError: not a list of events, or no user message with the task.
    """
    if _is_output_record(source.data):
        return [_convert_output_record(source)]
    records = source.data
    if not _is_event_list(records):
        reason = "not an OpenHands event list (objects with 'id' and 'action'/'observation')"
        raise ImportFormatError(source.path, reason)
    return [_convert_events(source, records, {"task_id": source.path.stem, "task_type": FRAMEWORK})]


def _convert_output_record(source: SourceFile) -> ImportedSession:
    """One line of an OpenHands evaluation output."""
    record = source.data
    records = _flatten_history(record["history"])
    if not records:
        raise ImportFormatError(source.path, f"instance {record.get('instance_id')!r}: empty history")
    instance = object_of(record.get("instance"))
    metadata = object_of(record.get("metadata"))
    task_id = str(record.get("instance_id") or instance.get("instance_id") or record.get("id") or instance.get("id"))
    dataset = str(metadata.get("dataset") or "").strip().lower()
    model = metadata.get("model_name") or object_of(metadata.get("llm_config")).get("model")
    error = record.get("error")
    overrides = {
        "task_id": task_id,
        "task_type": dataset or FRAMEWORK,
        "instruction": record.get("instruction"),
        "agent_model": str(model) if model else None,
        "error": str(error) if error else None,
        "verdict": _verdict(record.get("test_result")),
        "test_result": record.get("test_result"),
        "agent_version": str(metadata["agent_class"]) if metadata.get("agent_class") else None,
        "submission": _patch_of(record.get("test_result")),
    }
    if not any(r.get("source") == "user" and r.get("action") == "message" for r in records):
        records = [
            {"id": -1, "source": "user", "action": "message", "args": {"content": record.get("instruction")}},
            *records,
        ]
    return _convert_events(source, records, overrides)


@dataclass
class _Run:
    """The state of one OpenHands session while its events are read."""

    builder: RunBuilder
    records: list[dict[str, Any]]
    stamps: list[int | None]
    first_user: int
    actions: dict[Any, tuple[str, int, str]] = field(default_factory=dict)  # OpenHands id -> (event, time, call id)
    seen_responses: set[str] = field(default_factory=set)
    new_context: list[str] = field(default_factory=list)
    previous_ts: int | None = None
    finished: bool = False
    last_state: str = ""
    state_reason: str = ""
    finish: tuple[str, str] | None = None  # (event id, tool call id) of the last finish action


def _on_user_message(run: _Run, index: int, record: dict[str, Any]) -> None:
    """A user message after the task: context carried into the next agent_input."""
    if index != run.first_user:
        run.new_context.append(text_of(object_of(record.get("args")).get("content")))


def _on_agent_action(run: _Run, index: int, record: dict[str, Any]) -> None:
    """An agent action: an agent_input for each new model response, then the agent_action."""
    builder, ts = run.builder, run.stamps[index]
    kind, args = str(record.get("action")), object_of(record.get("args"))
    metadata = object_of(record.get("tool_call_metadata"))
    response = object_of(metadata.get("model_response"))
    usage = object_of(response.get("usage"))
    issues = builder.issues
    response_id = str(response.get("id") or f"event-{record['id']}")
    first_of_response = response_id not in run.seen_responses
    if first_of_response:
        run.seen_responses.add(response_id)
        builder.advance(run.previous_ts)
        builder.agent_input(
            prompt_digest=digest([index, response_id]),
            input_tokens=count(usage.get("prompt_tokens"), f"event {record['id']}.usage", issues),
            cached_tokens=count(object_of(usage.get("prompt_tokens_details")).get("cached_tokens"), "cached", issues),
            n_messages=index,
            content="\n\n".join(run.new_context) or None,
            message_id=response_id,
        )
        run.new_context = []
    builder.advance(ts)
    call = _response_call(metadata)
    arguments = object_of((call or {}).get("function")).get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps({k: v for k, v in args.items() if k != "thought"}, sort_keys=True, default=str)
    call_id = str(metadata.get("tool_call_id") or f"event-{record['id']}")
    command = args.get("command") if kind == "run" else args.get("code") if kind == "run_ipython" else None
    event_id = builder.action(
        str(metadata.get("function_name") or kind),
        arguments,
        command if isinstance(command, str) else None,
        text_of(args.get("thought")) or None,
        tool_call_id=call_id,
        message_id=response_id,
        output_tokens=count(usage.get("completion_tokens"), f"event {record['id']}.usage", issues)
        if first_of_response
        else 0,
        model_latency_ms=(ts - run.previous_ts) / 1000 if first_of_response and ts and run.previous_ts else 0.0,
    )
    run.actions[_key(record["id"])] = (event_id, builder.now, call_id)
    if kind == "finish":
        run.finished = True
        run.finish = (event_id, call_id)


def _on_state(run: _Run, index: int, record: dict[str, Any]) -> None:
    """An agent state change: the last one tells how the session ended."""
    extras = object_of(record.get("extras"))
    run.last_state = str(extras.get("agent_state") or "")
    run.state_reason = str(extras.get("reason") or "")


def _on_observation(run: _Run, index: int, record: dict[str, Any]) -> None:
    """An observation answering an imported action: its env_feedback (and a file_op for an edit)."""
    builder, ts = run.builder, run.stamps[index]
    event_id, action_ts, call_id = run.actions[_key(record.get("cause"))]
    extras = object_of(record.get("extras"))
    exit_code = object_of(extras.get("metadata")).get("exit_code")
    builder.advance(ts)
    content = text_of(record.get("content"))
    observation = record.get("observation")
    builder.feedback(
        event_id,
        content,
        tool_call_id=call_id,
        exit_code=int(exit_code) if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
        duration_ms=(ts - action_ts) / 1000 if ts is not None else 0.0,
        failure_reason=content[:1000] if observation == "error" else None,
    )
    if observation == "edit" and isinstance(extras.get("path"), str) and extras["path"]:
        new_content = extras.get("new_content")
        data = new_content.encode() if isinstance(new_content, str) else None
        builder.file_op(
            "write" if extras.get("prev_exist") else "create",
            extras["path"],
            size_bytes=len(data) if data is not None else 0,
            sha256=hashlib.sha256(data).hexdigest() if data is not None else None,
        )


def _key(value: Any) -> Any:
    """An OpenHands event id as a dict key (ids are ints; anything unhashable becomes its text)."""
    return value if isinstance(value, int | str) else json.dumps(value, sort_keys=True, default=str)


def _handler(run: _Run, record: dict[str, Any]) -> Callable[[_Run, int, dict[str, Any]], None] | None:
    """Which handler a V0 event goes to, or None when it is not part of the session's steps."""
    kind, observation, source = record.get("action"), record.get("observation"), record.get("source")
    if source == "user" and kind == "message":
        return _on_user_message
    if source == "agent" and isinstance(kind, str) and kind and kind not in _NOT_STEPS:
        return _on_agent_action
    if observation == "agent_state_changed":
        return _on_state
    if isinstance(observation, str) and observation not in ("", "null") and _key(record.get("cause")) in run.actions:
        return _on_observation
    return None


def _begin(source: SourceFile, records: list[dict[str, Any]], run: dict[str, Any]) -> _Run:
    issues = FieldIssues()
    stamps = [iso_micros(r.get("timestamp"), f"event {r.get('id')}.timestamp", issues) for r in records]
    first_user = next(
        (i for i, r in enumerate(records) if r.get("source") == "user" and r.get("action") == "message"), None
    )
    if first_user is None:
        raise ImportFormatError(source.path, "no user message with the task")
    instruction = text_of(run.get("instruction") or object_of(records[first_user].get("args")).get("content"))
    model = run.get("agent_model") or next(
        (
            str(object_of(object_of(r.get("tool_call_metadata")).get("model_response"))["model"])
            for r in records
            if object_of(object_of(r.get("tool_call_metadata")).get("model_response")).get("model")
        ),
        None,
    )
    output = "test_result" in run
    builder = RunBuilder(
        source,
        FRAMEWORK,
        "openhands-eval-output" if output else "openhands-event-stream",
        {
            "task_id": run["task_id"],
            "task_type": run["task_type"],
            "image_version": "eval-output" if output else "event-stream",
            "agent_name": FRAMEWORK,
            "agent_version": run.get("agent_version"),
            "agent_model": model,
        },
        issues=issues,
    )
    known = [s for s in stamps if s is not None]
    builder.at(min(known) if known else None)
    workspace = next(
        (
            str(object_of(r.get("extras"))["working_dir"])
            for r in records
            if object_of(r.get("extras")).get("working_dir")
        ),
        "/workspace",
    )
    builder.start(instruction, workspace_root=workspace, task_family=run["task_id"] if output else None)
    return _Run(builder, records, stamps, first_user, new_context=[instruction], previous_ts=stamps[0])


def _submission(state: _Run, submission: str | None) -> str | None:
    """The feedback holding the patch the harness took from the workspace: it answers the last finish."""
    if not submission:
        return None
    target = state.finish
    if target is None and state.actions:
        last_id, _, last_call = list(state.actions.values())[-1]
        target = (last_id, last_call)
    if target is None:
        return None
    state.builder.tick()
    return state.builder.feedback(target[0], submission, tool_call_id=target[1])


def _convert_events(source: SourceFile, records: list[dict[str, Any]], run: dict[str, Any]) -> ImportedSession:
    """The session of one OpenHands event list; ``run`` holds what the caller knows about it."""
    state = _begin(source, records, run)
    replay(state, records, _handler)
    known = [s for s in state.stamps if s is not None]
    state.builder.advance(max(known) if known else None)
    submission_event = _submission(state, run.get("submission"))
    exit_status = (
        "error" if state.last_state == "error" else "finish" if state.finished else state.last_state or "stopped"
    )
    error = run.get("error") or (state.state_reason if state.last_state == "error" else None)
    state.builder.end(
        exit_outcome(exit_status, error),
        wall_seconds(state.stamps),
        exit_reason(exit_status, error),
        submission_event=submission_event,
    )
    verdict = run.get("verdict")
    if verdict is not None:
        details = json.dumps({"test_result": run.get("test_result")}, sort_keys=True, default=str)
        state.builder.verdict(
            Verdict(run["task_id"], verdict, 1.0 if verdict else 0.0, HARNESS, FRAMEWORK, 1, int(verdict), details)
        )
    else:
        attach_verdict_beside(state.builder, source, str(run["task_id"]))
    return state.builder.finish()
