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
from typing import Any

from producers.importers._common import (
    ImportFormatError,
    JsonLines,
    RunBuilder,
    SourceFile,
    digest,
    end_status,
    iso_micros,
    object_of,
    text_of,
)
from producers.sdk import Event

FRAMEWORK = "openhands"
# Control events of the OpenHands runtime, not steps of the agent.
_NOT_STEPS = frozenset({"change_agent_state", "recall", "system"})


def _is_event_list(data: Any) -> bool:
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(e, dict) and "id" in e and ("action" in e or "observation" in e) for e in data)
    )


def _is_output_record(record: Any) -> bool:
    return (
        isinstance(record, dict)
        and isinstance(record.get("history"), list)
        and "trajectory" not in record  # SWE-agent's .traj also has a history
        and ("instance_id" in record or "instruction" in record)
    )


def _is_eval_output(data: Any) -> bool:
    """OpenHands evaluation output: JSON Lines of output records, or a file holding one record."""
    if isinstance(data, JsonLines):
        return bool(data.records) and all(_is_output_record(r) for _, r in data.records)
    return _is_output_record(data)


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is an OpenHands event list or OpenHands evaluation output (JSON Lines)."""
    return _is_event_list(data) or _is_eval_output(data)


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


def convert(source: SourceFile) -> list[Event]:
    """All events of one OpenHands session, or of every session of an evaluation output.

    Raises:
        ImportFormatError: not a list of events, bad timestamps, or no user message with the task.
    """
    if _is_eval_output(source.data):
        events: list[Event] = []
        lines = source.data.records if isinstance(source.data, JsonLines) else [(source.sha256, source.data)]
        for sha, record in lines:
            events += _convert_output_record(SourceFile(source.path, sha, record))
        return events
    records = source.data
    if not _is_event_list(records):
        reason = "not an OpenHands event list (objects with 'id' and 'action'/'observation')"
        raise ImportFormatError(source.path, reason)
    return _convert_events(source, records, {"task_id": source.path.stem, "task_type": FRAMEWORK})


def _convert_output_record(source: SourceFile) -> list[Event]:
    """One line of an OpenHands evaluation output."""
    record = source.data
    records = _flatten_history(record["history"])
    if not records:
        raise ImportFormatError(source.path, f"instance {record.get('instance_id')!r}: empty history")
    instance = object_of(record.get("instance"))
    metadata = object_of(record.get("metadata"))
    task_id = str(record.get("instance_id") or instance.get("instance_id") or record.get("id") or instance.get("id"))
    dataset = str(metadata.get("dataset") or "").strip().lower()
    model = metadata.get("model_name") or ((metadata.get("llm_config") or {}).get("model"))
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


def _convert_events(source: SourceFile, records: list[dict[str, Any]], run: dict[str, Any]) -> list[Event]:
    """The events of one session from its OpenHands event list; ``run`` holds what the caller knows about it."""
    try:
        stamps = [iso_micros(str(r["timestamp"])) if r.get("timestamp") else None for r in records]
    except ValueError as exc:
        raise ImportFormatError(source.path, f"bad event timestamp: {exc}") from exc
    first_user = next(
        (i for i, r in enumerate(records) if r.get("source") == "user" and r.get("action") == "message"), None
    )
    if first_user is None:
        raise ImportFormatError(source.path, "no user message with the task")
    instruction = text_of(run.get("instruction") or (records[first_user].get("args") or {}).get("content"))
    model = run.get("agent_model") or next(
        (
            str(r["tool_call_metadata"]["model_response"]["model"])
            for r in records
            if ((r.get("tool_call_metadata") or {}).get("model_response") or {}).get("model")
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
    )
    known = [s for s in stamps if s is not None]
    builder.at(min(known) if known else None)
    workspace = next(
        (
            str(r["extras"]["working_dir"])
            for r in records
            if isinstance(r.get("extras"), dict) and r["extras"].get("working_dir")
        ),
        "/workspace",
    )
    builder.start(instruction, workspace_root=workspace, task_family=run["task_id"] if output else None)

    actions: dict[Any, tuple[str, int, str]] = {}  # OpenHands id -> (event id, time, tool call id)
    seen_responses: set[str] = set()
    new_context: list[str] = [instruction]
    previous_ts = stamps[0]
    finished, last_state = False, ""
    finish: tuple[str, str] | None = None  # (event id, tool call id) of the last finish action
    for index, record in enumerate(records):
        ts = stamps[index]
        kind, observation = record.get("action"), record.get("observation")
        args = object_of(record.get("args"))
        if record.get("source") == "user" and kind == "message" and index != first_user:
            new_context.append(text_of(args.get("content")))
        elif record.get("source") == "agent" and kind and kind not in _NOT_STEPS:
            metadata = object_of(record.get("tool_call_metadata"))
            response = metadata.get("model_response") or {}
            usage = response.get("usage") or {}
            response_id = str(response.get("id") or f"event-{record['id']}")
            first_of_response = response_id not in seen_responses
            if first_of_response:
                seen_responses.add(response_id)
                builder.advance(previous_ts)
                builder.emitter.agent_input(
                    prompt_digest=digest(records[:index]),
                    input_tokens=int(usage.get("prompt_tokens") or 0),
                    cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                    n_messages=index,
                    content="\n\n".join(new_context) or None,
                    message_id=response_id,
                )
                new_context = []
            builder.advance(ts)
            call = _response_call(metadata)
            thought = args.get("thought")
            arguments = ((call or {}).get("function") or {}).get("arguments")
            if not isinstance(arguments, str):
                arguments = json.dumps({k: v for k, v in args.items() if k != "thought"}, sort_keys=True, default=str)
            call_id = str(metadata.get("tool_call_id") or f"event-{record['id']}")
            event_id = builder.action(
                str(metadata.get("function_name") or kind),
                arguments,
                args.get("command") if kind == "run" else args.get("code") if kind == "run_ipython" else None,
                text_of(thought) or None,
                tool_call_id=call_id,
                message_id=response_id,
                output_tokens=int(usage.get("completion_tokens") or 0) if first_of_response else 0,
                model_latency_ms=(ts - previous_ts) / 1000 if first_of_response and ts and previous_ts else 0.0,
            )
            actions[record["id"]] = (event_id, builder.now, call_id)
            finished = finished or kind == "finish"
            if kind == "finish":
                finish = (event_id, call_id)
        elif observation == "agent_state_changed":
            last_state = str((record.get("extras") or {}).get("agent_state") or "")
        elif observation and observation != "null" and record.get("cause") in actions:
            event_id, action_ts, call_id = actions[record["cause"]]
            extras = object_of(record.get("extras"))
            exit_code = (extras.get("metadata") or {}).get("exit_code")
            builder.advance(ts)
            content = text_of(record.get("content"))
            builder.feedback(
                event_id,
                content,
                tool_call_id=call_id,
                exit_code=int(exit_code) if isinstance(exit_code, int) else None,
                duration_ms=(ts - action_ts) / 1000 if ts is not None else 0.0,
                failure_reason=content[:1000] if observation == "error" else None,
            )
            if observation == "edit" and extras.get("path"):
                new_content = extras.get("new_content")
                data = new_content.encode() if isinstance(new_content, str) else None
                builder.emitter.file_op(
                    "write" if extras.get("prev_exist") else "create",
                    str(extras["path"]),
                    size_bytes=len(data) if data is not None else 0,
                    sha256=hashlib.sha256(data).hexdigest() if data is not None else None,
                )
        if ts is not None:
            previous_ts = ts

    builder.advance(max(known) if known else None)
    submission, submission_event = run.get("submission"), None
    if submission:
        # the patch the harness took from the workspace answers the last finish (or, without one, the last action)
        target = finish
        if target is None and actions:
            last_id, _, last_call = list(actions.values())[-1]
            target = (last_id, last_call)
        if target is not None:
            builder.tick()
            submission_event = builder.feedback(target[0], submission, tool_call_id=target[1])
    exit_status = "error" if last_state == "error" else "finish" if finished else last_state or "stopped"
    error = run.get("error")
    runtime_s = (max(known) - min(known)) / 1e6 if known else 0.0
    reason = f"{exit_status}: {error.strip().splitlines()[-1]}"[:1000] if error and error.strip() else exit_status
    payload = {"status": end_status(exit_status, None, error), "runtime_s": runtime_s, "exit_reason": reason}
    extra = {"submission_event_id": submission_event} if submission_event else None
    builder.emitter.emit("session_end", payload, "system", extra=extra)
    verdict = run.get("verdict")
    if verdict is not None:
        builder.tick()
        builder.evaluation_after_end(
            run.get("test_result"),
            passed=verdict,
            tests_total=1,
            tests_passed=int(verdict),
            reward=1.0 if verdict else 0.0,
            fresh_sandbox=False,
            evaluator=f"imported:{FRAMEWORK}",
            duration_ms=0.0,
            details=json.dumps({"test_result": run.get("test_result")}, sort_keys=True, default=str),
        )
    return builder.events
