"""Import mini-swe-agent runs (``trajectory_format: mini-swe-agent-1.x``).

A step is one assistant message (one agent_input, one agent_action per tool
call) plus the tool messages answering its calls (env_feedback with the exit
code from ``extra.returncode`` or ``<returncode>``). The final ``exit`` message
answers the submit command, whose output the agent turned into the submission.
Per-turn tokens come from ``extra.response.usage``; the thought is the model's
``reasoning_content`` (reasoning models) followed by its visible content. Success
comes from a companion SWE-bench ``*.report.json`` when one sits next to the file:
its ``evaluation`` event follows ``session_end`` and takes its id from the report's
content, so a report that arrives after the run was imported adds one event on the
next import and changes nothing else. ``session_end`` names the feedback holding
the submission (``extra.submission_event_id``); the workspace root is the
environment's ``cwd`` (``/testbed`` for SWE-bench). Each assistant turn also
carries a ``model_call`` (schema v3): the messages before it as the request (the
system prompt included) and the message itself as the reply, reasoning included.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from producers.importers._common import (
    ImportFormatError,
    RunBuilder,
    SourceFile,
    chat_message,
    digest,
    end_status,
    object_of,
    text_of,
    unix_micros,
)
from producers.sdk import Event

FRAMEWORK = "mini-swe-agent"
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_OUTPUT = re.compile(r"<output>\n?(.*?)</output>", re.DOTALL)
# How mini-swe-agent marks an output it cut into head and tail for the model.
_ELIDED = ("<output_head>", "<elided_chars>", "<output_tail>")


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is a mini-swe-agent trajectory."""
    return isinstance(data, dict) and str(data.get("trajectory_format", "")).startswith("mini-swe-agent")


def companion_report(path: Path, instance_id: str) -> dict[str, Any] | None:
    """The SWE-bench report for ``instance_id`` next to ``path`` (``X.traj.json`` → ``X.report.json``), if any.

    Raises:
        ImportFormatError: a report exists but is not valid JSON.
    """
    name = path.name.removesuffix(".json").removesuffix(".traj")
    candidates = [path.with_name(f"{name}.report.json"), path.with_name("report.json")]
    for candidate in candidates:
        if candidate.is_file():
            try:
                report = json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ImportFormatError(candidate, f"companion report is not valid JSON: {exc}") from exc
            entry = report.get(instance_id) if isinstance(report, dict) else None
            return entry if isinstance(entry, dict) else None
    return None


def _test_counts(report: dict[str, Any]) -> tuple[int, int]:
    passed = total = 0
    for buckets in (report.get("tests_status") or {}).values():
        if isinstance(buckets, dict):
            passed += len(buckets.get("success") or [])
            total += len(buckets.get("success") or []) + len(buckets.get("failure") or [])
    return total, passed


def _tool_output(content: str) -> tuple[str, int | None, bool]:
    """(output text, return code, elided?) from a tool message's ``<returncode>…<output>…`` content."""
    code_match = _RETURNCODE.search(content)
    output_match = _OUTPUT.search(content)
    if output_match:
        output = output_match.group(1)
    else:  # warning + head/tail form: keep what the model saw, minus the return-code tag
        output = _RETURNCODE.sub("", content, count=1).strip("\n")
    return output, int(code_match.group(1)) if code_match else None, any(tag in content for tag in _ELIDED)


def _thought(message: dict[str, Any]) -> str:
    """The model's reasoning (``reasoning_content``, also under ``provider_specific_fields``), then its content."""
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str) or not reasoning:
        fields = message.get("provider_specific_fields")
        reasoning = fields.get("reasoning_content") if isinstance(fields, dict) else None
    content = text_of(message.get("content"))
    if isinstance(reasoning, str) and reasoning:
        return f"{reasoning}\n\n{content}" if content.strip() else reasoning
    return content


def convert(source: SourceFile) -> list[Event]:
    """All events of one mini-swe-agent run.

    Raises:
        ImportFormatError: required fields are missing or a tool message answers no known call.
    """
    data = source.data
    messages = data.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ImportFormatError(source.path, "mini-swe-agent trajectory without a 'messages' list of objects")
    messages = [m for m in messages if not m.get("is_demo")]
    info = object_of(data.get("info"))
    config = object_of(info.get("config"))
    instance_id = str(data.get("instance_id") or source.path.name.split(".")[0])
    instruction = next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), None)
    if instruction is None:
        raise ImportFormatError(source.path, "no user message with the task statement")
    report = companion_report(source.path, instance_id)
    resolved = bool(report.get("resolved")) if report is not None else None

    builder = RunBuilder(
        source,
        FRAMEWORK,
        str(data["trajectory_format"]),
        {
            "task_id": instance_id,
            "task_type": "swe",
            "image_version": str(data["trajectory_format"]),
            "agent_name": FRAMEWORK,
            "agent_version": str(info["mini_version"]) if info.get("mini_version") else None,
            "agent_model": (config.get("model") or {}).get("model_name"),
        },
    )
    stamps = [unix_micros((m.get("extra") or {}).get("timestamp")) for m in messages]
    known = [s for s in stamps if s is not None]
    first_ts = min(known) if known else None
    builder.at(first_ts)
    environment = object_of(config.get("environment"))
    workspace = environment.get("cwd") or ("/testbed" if "__" in instance_id else None)
    builder.start(instruction, config or None, workspace_root=workspace, task_family=instance_id)
    submission = text_of(info.get("submission"))
    submission_event: str | None = None

    pending: dict[str, tuple[str, int]] = {}  # tool_call_id -> (action event id, action time)
    previous_ts = first_ts
    turn = 0
    for index, message in enumerate(messages):
        role = message.get("role")
        extra = object_of(message.get("extra"))
        ts = stamps[index]
        if role == "assistant":
            response = object_of(extra.get("response"))
            usage = response.get("usage") or {}
            builder.advance(previous_ts)
            message_id = str(response.get("id") or f"turn-{turn}")
            choice = ((response.get("choices") or [{}])[0]) if isinstance(response.get("choices"), list) else {}
            record = builder.model_call(
                [chat_message(m) for m in messages[:index] if m.get("role") != "exit"],
                chat_message(message),
                model=str((config.get("model") or {}).get("model_name") or ""),
                sampling=object_of((config.get("model") or {}).get("model_kwargs")),
                usage=usage,
                finish_reason=object_of(choice).get("finish_reason"),
                response_id=response.get("id"),
                cost_usd=float(extra["cost"]) if isinstance(extra.get("cost"), int | float) else None,
            )
            builder.emitter.agent_input(
                prompt_digest=digest(messages[:index]),
                input_tokens=int(usage.get("prompt_tokens") or 0),
                cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                n_messages=index,
                content=instruction if turn == 0 else None,
                message_id=message_id,
                model_call=record,
            )
            builder.advance(ts)
            calls = message.get("tool_calls") or [
                {
                    "id": a.get("tool_call_id") or f"action-{turn}-{i}",
                    "function": {"name": "bash", "arguments": json.dumps({"command": a.get("command", "")})},
                }
                for i, a in enumerate(extra.get("actions") or [])
            ]
            details = usage.get("completion_tokens_details") or {}
            for position, call in enumerate(calls):
                function = call.get("function") or {}
                arguments = function.get("arguments") or "{}"
                try:
                    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
                except json.JSONDecodeError:
                    parsed = {}
                first = position == 0  # a turn's tokens and cost belong to its first call only
                call_id = str(call.get("id") or f"action-{turn}-{position}")
                action_id = builder.action(
                    str(function.get("name") or "bash"),
                    arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True),
                    parsed.get("command") if isinstance(parsed, dict) else None,
                    _thought(message),
                    tool_call_id=call_id,
                    message_id=message_id,
                    output_tokens=int(usage.get("completion_tokens") or 0) if first else 0,
                    reasoning_tokens=int(details.get("reasoning_tokens") or 0) if first else 0,
                    cost_usd=float(extra.get("cost") or 0.0) if first else 0.0,
                    model_latency_ms=(ts - previous_ts) / 1000 if first and ts and previous_ts else 0.0,
                )
                pending[call_id] = (action_id, builder.now)
            turn += 1
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            if call_id not in pending:
                raise ImportFormatError(source.path, f"message {index}: tool output answers unknown call {call_id!r}")
            action_id, action_ts = pending.pop(call_id)
            builder.advance(ts)
            content = text_of(message.get("content"))
            output, code, elided = _tool_output(content)
            if isinstance(extra.get("returncode"), int):
                code = extra["returncode"]
            raw_output = extra.get("raw_output")
            builder.feedback(
                action_id,
                output,
                tool_call_id=call_id,
                exit_code=code,
                duration_ms=(ts - action_ts) / 1000 if ts is not None else 0.0,
                elided=elided,
                full_bytes=len(raw_output.encode()) if isinstance(raw_output, str) else None,
                failure_reason=text_of(extra.get("exception_info")) or None,
            )
        elif role == "exit":
            # The submit command's output became the submission: the exit message answers it.
            builder.advance(ts)
            content = text_of(message.get("content"))
            for call_id, (action_id, action_ts) in list(pending.items()):
                feedback_id = builder.feedback(
                    action_id,
                    content,
                    tool_call_id=call_id,
                    duration_ms=(ts - action_ts) / 1000 if ts is not None else 0.0,
                )
                if submission and content == submission:
                    submission_event = feedback_id
            pending.clear()
        if ts is not None:
            previous_ts = ts

    if not known:
        builder.tick()
    exit_status = str(info.get("exit_status") or "")
    exception = text_of(info.get("exception_str")).strip()
    runtime_s = (max(known) - min(known)) / 1e6 if known else 0.0
    exit_reason = (f"{exit_status}: {exception.splitlines()[-1]}" if exception else exit_status)[:1000] or None
    # The reward is the evaluation's (below), never session_end's: a later report must not change this event.
    payload = {
        "status": end_status(exit_status, None, exception),
        "runtime_s": runtime_s,
        "reward": None,
        "exit_reason": exit_reason,
    }
    end_extra = {"submission_event_id": submission_event} if submission_event else None
    builder.emitter.emit("session_end", payload, "system", extra=end_extra)
    if report is not None:
        total, passed = _test_counts(report)
        builder.tick()
        builder.evaluation_after_end(
            report,
            passed=bool(resolved),
            tests_total=total,
            tests_passed=passed,
            reward=1.0 if resolved else 0.0,
            fresh_sandbox=False,
            evaluator=f"imported:{FRAMEWORK}",
            duration_ms=0.0,
            details=json.dumps({k: v for k, v in report.items() if k != "tests_status"}, sort_keys=True),
        )
    return builder.events
