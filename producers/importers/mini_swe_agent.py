"""Import mini-swe-agent runs: 1.x text actions (``mini-swe-agent-1``) and 2.x tool calls (``mini-swe-agent-1.1``).

A step is one action of an assistant message plus the message answering it:

- **1.x** (and 2.x text models): the action is the fenced shell block of the assistant's text
  (```` ```bash ```` or ```` ```mswea_bash_command ````, or ``extra.actions`` when 2.x parsed them);
  the observation is the next ``user`` message, ``<returncode>N</returncode><output>…</output>``
  (or the timeout template). An assistant message without exactly one block got a format
  error back: no step. The run's final ``user`` message is the submission (1.x).
- **2.x tool calls**: one action per ``tool_calls`` entry, answered by the ``tool`` message with
  its ``tool_call_id`` (exit code from ``extra.returncode``); the final ``exit`` message answers
  the submit command, whose output is the submission.

Per-turn tokens come from ``extra.response.usage``; without per-turn costs, ``info.model_stats``
totals are apportioned over the turns (sums stay exact). The thought is the model's
``reasoning_content`` followed by its visible content. A verdict comes from a report beside the
file (``producers.importers.verdicts``), after ``session_end``. Each assistant turn also carries a
``model_call`` (schema v3): the conversation before it as the request, the message as the reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producers.importers._common import (
    ImportedSession,
    ImportFormatError,
    RunBuilder,
    SourceFile,
    chat_message,
    command_of,
    exit_outcome,
    exit_reason,
    list_of,
    object_of,
    text_of,
)
from producers.importers._skeleton import replay, wall_seconds
from producers.importers._values import count, number, unix_micros
from producers.importers.verdicts import attach_verdict_beside
from producers.parts import utf8_len

FRAMEWORK = "mini-swe-agent"
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_OUTPUT = re.compile(r"<output>\n?(.*?)</output>", re.DOTALL)
# A 1.x action: one fenced shell block (2.x renamed the fence to avoid prompts' own examples).
_ACTION = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.DOTALL)
_TIMEOUT = re.compile(r"^The last command <command>.*?</command> timed out", re.DOTALL)
# How mini-swe-agent marks an output it cut into head and tail for the model.
_ELIDED = ("<output_head>", "<elided_chars>", "<output_tail>")


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is a mini-swe-agent trajectory."""
    return isinstance(data, dict) and str(data.get("trajectory_format", "")).startswith("mini-swe-agent")


def why_not(data: Any) -> str:
    """Why ``data`` is not a mini-swe-agent trajectory (for the unknown-format message)."""
    return "no trajectory_format 'mini-swe-agent-…'"


@dataclass
class _Pending:
    action_id: str
    call_id: str
    ts: int


@dataclass
class _Run:
    """The state of one run while its messages are read."""

    builder: RunBuilder
    source: SourceFile
    messages: list[dict[str, Any]]
    stamps: list[int | None]
    instruction: str
    model: str
    sampling: dict[str, Any]
    submission: str
    costs: list[float]  # per turn, apportioned when the file has no per-turn cost
    pending: list[_Pending] = field(default_factory=list)
    turn: int = 0
    previous_ts: int | None = None
    submission_event: str | None = None
    carried_cost: float = 0.0  # of turns that made no action (a format error): counted with the next action
    carried_tokens: int = 0


def _tool_output(content: str, raw_output: Any = None) -> tuple[str, int | None, bool]:
    """(output text, return code, elided?) from an observation's ``<returncode>…<output>…`` content.

    When the message's ``raw_output`` is that output exactly, it is the output itself (no second copy
    of a large text).
    """
    code_match = _RETURNCODE.search(content)
    output_match = _OUTPUT.search(content)
    if output_match and _is_span(raw_output, content, *output_match.span(1)):
        output = raw_output
    elif output_match:
        output = output_match.group(1)
    else:  # warning + head/tail form: keep what the model saw, minus the return-code tag
        output = _RETURNCODE.sub("", content, count=1).strip("\n")
    return output, int(code_match.group(1)) if code_match else None, any(tag in content for tag in _ELIDED)


def _is_span(value: Any, text: str, start: int, end: int) -> bool:
    """Whether ``value`` is the string ``text[start:end]`` (compared in place)."""
    return isinstance(value, str) and len(value) == end - start and text.startswith(value, start)


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


def _calls(run: _Run, message: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(call id, tool name, arguments JSON) of every action of an assistant message."""
    calls = [c for c in list_of(message.get("tool_calls")) if isinstance(c, dict)]
    if calls:
        return [
            (
                str(c.get("id") or f"action-{run.turn}-{i}"),
                str(object_of(c.get("function")).get("name") or "bash"),
                a if isinstance(a := object_of(c.get("function")).get("arguments"), str) else json.dumps(a or {}),
            )
            for i, c in enumerate(calls)
        ]
    actions = list_of(object_of(message.get("extra")).get("actions"))
    if actions:
        return [
            (
                str(object_of(a).get("tool_call_id") or f"action-{run.turn}-{i}"),
                "bash",
                json.dumps({"command": str(object_of(a).get("command", a if isinstance(a, str) else ""))}),
            )
            for i, a in enumerate(actions)
        ]
    blocks = _ACTION.findall(text_of(message.get("content")))
    if len(blocks) != 1:  # the agent answered this with a format error: not a step
        return []
    return [(f"action-{run.turn}-0", "bash", json.dumps({"command": blocks[0].strip()}))]


def _on_assistant(run: _Run, index: int, message: dict[str, Any]) -> None:
    """One model turn: its agent_input (with the model call) and an agent_action per action."""
    builder, extra = run.builder, object_of(message.get("extra"))
    response = object_of(extra.get("response"))
    usage = object_of(response.get("usage"))
    issues = builder.issues
    builder.advance(run.previous_ts)
    message_id = str(response.get("id") or f"turn-{run.turn}")
    choice = object_of(list_of(response.get("choices"))[0]) if list_of(response.get("choices")) else {}
    cost = run.costs[run.turn] if run.turn < len(run.costs) else 0.0
    record = builder.model_call(
        chat_message(message),
        model=run.model,
        sampling=run.sampling,
        usage=usage,
        finish_reason=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None,
        response_id=str(response["id"]) if response.get("id") else None,
        cost_usd=cost,
    )
    builder.agent_input(
        prompt_digest=record["request_sha256"],
        input_tokens=count(usage.get("prompt_tokens"), f"messages[{index}].usage.prompt_tokens", issues),
        cached_tokens=count(
            object_of(usage.get("prompt_tokens_details")).get("cached_tokens"), f"messages[{index}].cached", issues
        ),
        n_messages=record["n_messages"],
        content=run.instruction if run.turn == 0 else None,
        message_id=message_id,
        model_call=record,
    )
    ts = run.stamps[index]
    builder.advance(ts)
    reasoning = count(object_of(usage.get("completion_tokens_details")).get("reasoning_tokens"), "reasoning", issues)
    completion = count(usage.get("completion_tokens"), f"messages[{index}].usage", issues)
    calls = _calls(run, message)
    if not calls:
        run.carried_cost, run.carried_tokens = run.carried_cost + cost, run.carried_tokens + completion
    for position, (call_id, tool, arguments) in enumerate(calls):
        first = position == 0  # a turn's tokens and cost belong to its first call only
        action_id = builder.action(
            tool,
            arguments,
            command_of(arguments),
            _thought(message),
            tool_call_id=call_id,
            message_id=message_id,
            output_tokens=completion + run.carried_tokens if first else 0,
            reasoning_tokens=reasoning if first else 0,
            cost_usd=cost + run.carried_cost if first else 0.0,
            model_latency_ms=(ts - run.previous_ts) / 1000 if first and ts and run.previous_ts else 0.0,
        )
        run.pending.append(_Pending(action_id, call_id, builder.now))
        if first:
            run.carried_cost, run.carried_tokens = 0.0, 0
    run.turn += 1


def _answer(run: _Run, pending: _Pending, index: int, message: dict[str, Any], content: str) -> str:
    """The env_feedback of ``pending`` from an observation message."""
    extra = object_of(message.get("extra"))
    ts = run.stamps[index]
    run.builder.advance(ts)
    raw_output = extra.get("raw_output")
    output, code, elided = _tool_output(content, raw_output)
    if isinstance(extra.get("returncode"), int) and not isinstance(extra.get("returncode"), bool):
        code = extra["returncode"]
    failure = text_of(extra.get("exception_info")) or ("command timed out" if _TIMEOUT.match(content) else None)
    return run.builder.feedback(
        pending.action_id,
        output,
        tool_call_id=pending.call_id,
        exit_code=code,
        duration_ms=(ts - pending.ts) / 1000 if ts is not None else 0.0,
        elided=elided,
        full_bytes=utf8_len(raw_output) if isinstance(raw_output, str) else None,
        failure_reason=failure,
    )


def _on_tool(run: _Run, index: int, message: dict[str, Any]) -> None:
    """A 2.x tool message: the observation of the call it names."""
    call_id = str(message.get("tool_call_id") or "")
    pending = next((p for p in run.pending if p.call_id == call_id), None)
    if pending is None:
        raise ImportFormatError(run.source.path, f"message {index}: tool output answers unknown call {call_id!r}")
    run.pending.remove(pending)
    _answer(run, pending, index, message, text_of(message.get("content")))
    run.builder.calls.append(chat_message(message))


def _on_user(run: _Run, index: int, message: dict[str, Any]) -> None:
    """A user message: the task (first), an observation of a text action, the 1.x submission, or a correction."""
    content = text_of(message.get("content"))
    if run.pending:
        pending = run.pending.pop(0)
        is_observation = bool(_RETURNCODE.search(content) or _TIMEOUT.match(content))
        feedback = _answer(run, pending, index, message, content) if is_observation else None
        if feedback is None:  # 1.x: the Submitted exception's message, the submission itself
            run.builder.advance(run.stamps[index])
            feedback = run.builder.feedback(pending.action_id, content, tool_call_id=pending.call_id)
            if run.submission and content.strip() == run.submission.strip():
                run.submission_event = feedback
    run.builder.calls.append(chat_message(message))


def _on_exit(run: _Run, index: int, message: dict[str, Any]) -> None:
    """2.x: the submit command's output became the submission; the exit message answers it."""
    ts = run.stamps[index]
    run.builder.advance(ts)
    content = text_of(message.get("content"))
    for pending in run.pending:
        feedback_id = run.builder.feedback(
            pending.action_id,
            content,
            tool_call_id=pending.call_id,
            duration_ms=(ts - pending.ts) / 1000 if ts is not None else 0.0,
        )
        if run.submission and content == run.submission:
            run.submission_event = feedback_id
    run.pending.clear()


def _on_other(run: _Run, index: int, message: dict[str, Any]) -> None:
    """A system (or unknown-role) message: part of what the model saw."""
    run.builder.calls.append(chat_message(message))


_HANDLERS = {"assistant": _on_assistant, "tool": _on_tool, "user": _on_user, "exit": _on_exit}


def _begin(source: SourceFile) -> _Run:
    data = source.data
    messages = data.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ImportFormatError(source.path, "mini-swe-agent trajectory without a 'messages' list of objects")
    messages = [m for m in messages if not m.get("is_demo")]
    info = object_of(data.get("info"))
    config = object_of(info.get("config"))
    model_config = object_of(config.get("model"))
    instance_id = str(data.get("instance_id") or source.path.name.split(".")[0])
    instruction = next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), None)
    if instruction is None:
        raise ImportFormatError(source.path, "no user message with the task statement")
    format_name = str(data["trajectory_format"])
    builder = RunBuilder(
        source,
        FRAMEWORK,
        format_name,
        {
            "task_id": instance_id,
            "task_type": "swe",
            "image_version": format_name,
            "agent_name": FRAMEWORK,
            "agent_version": str(info["mini_version"]) if info.get("mini_version") else None,
            "agent_model": str(model_config["model_name"]) if model_config.get("model_name") else None,
        },
    )
    stamps = [
        unix_micros(object_of(m.get("extra")).get("timestamp"), f"messages[{i}].timestamp", builder.issues)
        for i, m in enumerate(messages)
    ]
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    own_costs = [
        number(object_of(m.get("extra")).get("cost"), "cost", builder.issues)
        for m in messages
        if m.get("role") == "assistant"
    ]
    if any(c is not None for c in own_costs):
        costs = [c or 0.0 for c in own_costs]
    else:
        total = number(object_of(info.get("model_stats")).get("instance_cost"), "info.model_stats", builder.issues)
        costs = [(total or 0.0) / turns] * turns if turns else []
    known = [s for s in stamps if s is not None]
    builder.at(min(known) if known else None)
    environment = object_of(config.get("environment"))
    workspace = environment.get("cwd") or ("/testbed" if "__" in instance_id else None)
    builder.start(
        instruction, config or None, workspace_root=str(workspace) if workspace else None, task_family=instance_id
    )
    return _Run(
        builder,
        source,
        messages,
        stamps,
        instruction,
        str(model_config.get("model_name") or ""),
        object_of(model_config.get("model_kwargs")),
        text_of(info.get("submission")),
        costs,
        previous_ts=min(known) if known else None,
    )


def _end(run: _Run) -> ImportedSession:
    info = object_of(run.source.data.get("info"))
    if all(s is None for s in run.stamps):
        run.builder.tick()
    status_text = str(info.get("exit_status") or "")
    exception = text_of(info.get("exception_str"))
    run.builder.end(
        exit_outcome(status_text, exception),
        wall_seconds(run.stamps),
        exit_reason(status_text, exception),
        submission_event=run.submission_event,
    )
    attach_verdict_beside(run.builder, run.source, str(run.builder.emitter.envelope["task_id"]))
    return run.builder.finish()


def _handler(run: _Run, message: dict[str, Any]) -> Callable[[_Run, int, dict[str, Any]], None]:
    """Which handler a message goes to: by its role."""
    return _HANDLERS.get(str(message.get("role")), _on_other)


def convert(source: SourceFile) -> list[ImportedSession]:
    """The session of one mini-swe-agent run.

    Raises:
        ImportFormatError: required fields are missing or a tool message answers no known call.
    """
    run = _begin(source)
    replay(run, run.messages, _handler)
    return [_end(run)]
