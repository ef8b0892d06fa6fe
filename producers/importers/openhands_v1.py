"""Import OpenHands V1 (software-agent-sdk) event streams: typed events that carry a ``kind``.

Accepted layouts: a JSON array of events, JSON Lines of events, a conversation directory
(``events/event-*.json`` with ``base_state.json``), and evaluation output whose ``history`` is V1
events (one session per line, ``test_result`` as for V0).

Mapping (by event ``kind``):

- ``SystemPromptEvent``: the system message of every model call (its ``tools`` the tool list).
- ``MessageEvent``: the first user message is the task; later ones are context of the next turn.
- ``ActionEvent``: consecutive actions with one ``llm_response_id`` are one model response: one
  ``agent_input`` (with the ``model_call``: the conversation so far and the assistant message
  with all its tool calls), then an ``agent_action`` each (``action`` is an object: its fields are
  the arguments unless the recorded ``tool_call.arguments`` are there; ``command`` for a shell
  action only, so an editor's view of two files are two different actions).
- ``ObservationEvent`` / ``AgentErrorEvent`` / ``UserRejectObservation``: the ``env_feedback`` of
  the call with its ``tool_call_id`` (exit code, timeout, error); an editor's create / replace /
  insert also gives a ``file_op``.
- ``ConversationStateUpdateEvent``: the last ``execution_status`` (finished, error, stuck, …) and
  the token usage per response (``stats``); ``ConversationErrorEvent``: why it stopped.

The exit status maps by meaning (``producers.importers._common.exit_outcome``): a maximum
iteration count is a limit, an authentication or API failure is infrastructure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producers.importers._common import (
    FieldIssues,
    ImportedSession,
    ImportFormatError,
    RunBuilder,
    SourceFile,
    Verdict,
    exit_outcome,
    exit_reason,
    list_of,
    object_of,
    text_of,
)
from producers.importers._skeleton import passed, wall_seconds
from producers.importers._source import JsonLines, read_bytes, read_json_file
from producers.importers._values import count, iso_micros
from producers.importers.openhands import _patch_of, _verdict
from producers.importers.verdicts import HARNESS, attach_verdict_beside

FRAMEWORK = "openhands-v1"
_SHELL_ACTIONS = frozenset({"ExecuteBashAction", "TerminalAction", "BashAction"})
_EDIT_OBSERVATIONS = frozenset({"FileEditorObservation", "StrReplaceEditorObservation"})
_EDIT_COMMANDS = {"create": "create", "str_replace": "write", "insert": "write", "undo_edit": "write"}


def _is_v1_event(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("kind"), str) and "source" in value and "id" in value


def _is_v1_output(record: Any) -> bool:
    history = object_of(record).get("history")
    return isinstance(history, list) and any(_is_v1_event(e) for e in history[:20])


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is a V1 event stream (array or JSON Lines of events) or V1 evaluation output."""
    if isinstance(data, JsonLines):
        return _is_v1_event(data.first) or _is_v1_output(data.first)
    if isinstance(data, list):
        return bool(data) and sum(_is_v1_event(e) for e in data[:20]) >= min(len(data), 20) // 2 + 1
    return _is_v1_output(data)


def why_not(data: Any) -> str:
    """Why ``data`` is not OpenHands V1 (for the unknown-format message)."""
    return "no events with 'kind', 'source' and 'id'"


def is_conversation_dir(path: Path) -> bool:
    """Whether ``path`` is a persisted V1 conversation (``events/event-*.json``)."""
    return (path / "events").is_dir() and any((path / "events").glob("event-*.json"))


@dataclass
class _Run:
    """The state of one V1 conversation while its events are read."""

    builder: RunBuilder
    events: list[dict[str, Any]]
    stamps: list[int | None]
    first_user: int
    usage: dict[str, dict[str, Any]]  # llm_response_id -> token usage
    tools: list[dict[str, Any]] | None
    model: str
    pending: dict[str, tuple[str, int]] = field(default_factory=dict)  # tool_call_id -> (action event, time)
    context: list[str] = field(default_factory=list)
    previous_ts: int | None = None
    status: str = ""
    error: str = ""
    finish: tuple[str, str] | None = None
    last_action: tuple[str, str] | None = None
    calls: int = 0


def _text(value: Any) -> str:
    """Text of V1 content: a string, a TextContent, or a list of them."""
    return text_of(value)


def _observation_text(observation: dict[str, Any]) -> str:
    for key in ("content", "output", "message", "text"):
        if observation.get(key) not in (None, "", []):
            return _text(observation[key])
    return ""


def _arguments(action_event: dict[str, Any]) -> str:
    """The call's arguments as the model wrote them, else the action's own fields (without its ``kind``)."""
    call = object_of(action_event.get("tool_call"))
    recorded = call.get("arguments")
    if isinstance(recorded, str) and recorded:
        return recorded
    action = {k: v for k, v in object_of(action_event.get("action")).items() if k != "kind"}
    return json.dumps(action, sort_keys=True, default=str)


def _response_groups(events: list[dict[str, Any]]) -> Iterator[tuple[int, list[tuple[int, dict[str, Any]]]]]:
    """(index, [events]) of the stream with consecutive actions of one ``llm_response_id`` grouped."""
    index = 0
    while index < len(events):
        event = events[index]
        if event.get("kind") == "ActionEvent":
            response = event.get("llm_response_id")
            group = [(index, event)]
            while (
                index + 1 < len(events)
                and events[index + 1].get("kind") == "ActionEvent"
                and events[index + 1].get("llm_response_id") == response
                and response is not None
            ):
                index += 1
                group.append((index, events[index]))
            yield group[0][0], group
        else:
            yield index, [(index, event)]
        index += 1


def _on_system(run: _Run, index: int, event: dict[str, Any]) -> None:
    run.builder.calls.append({"role": "system", "content": _text(event.get("system_prompt"))})


def _on_message(run: _Run, index: int, event: dict[str, Any]) -> None:
    message = object_of(event.get("llm_message"))
    text = _text(message.get("content"))
    role = str(message.get("role") or ("user" if event.get("source") == "user" else "assistant"))
    if role == "assistant" and event.get("source") == "agent":
        _on_reply(run, index, event, text)
        return
    run.builder.calls.append({"role": role, "content": text})
    if role == "user" and index != run.first_user:
        run.context.append(text)


def _on_reply(run: _Run, index: int, event: dict[str, Any], text: str) -> None:
    """A model response without tool calls (the agent answering, or its last word): a model call of its own."""
    response_id = str(event.get("llm_response_id") or f"response-{run.calls}")
    usage = run.usage.get(response_id, {})
    reply: dict[str, Any] = {"role": "assistant", "content": text}
    reasoning = object_of(event.get("llm_message")).get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        reply["reasoning_content"] = reasoning
    run.builder.advance(run.stamps[index])
    _model_turn(run, reply, response_id, usage)


def _model_turn(run: _Run, reply: dict[str, Any], response_id: str, usage: dict[str, Any]) -> None:
    """A model call for ``reply`` and the agent_input that fed it (the context gathered since the last call)."""
    builder, issues = run.builder, run.builder.issues
    record = builder.model_call(
        reply,
        tools=run.tools,
        model=run.model,
        usage={"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens")},
        response_id=response_id,
    )
    builder.agent_input(
        prompt_digest=record["request_sha256"],
        input_tokens=count(usage.get("prompt_tokens"), f"usage[{response_id}]", issues),
        cached_tokens=count(usage.get("cache_read_tokens"), f"usage[{response_id}]", issues),
        n_messages=record["n_messages"],
        content="\n\n".join(run.context) or None,
        message_id=response_id,
        model_call=record,
    )
    run.context = []
    run.calls += 1


def _on_actions(run: _Run, group: list[tuple[int, dict[str, Any]]]) -> None:
    """One model response: its agent_input and model call, then an agent_action per tool call."""
    builder, issues = run.builder, run.builder.issues
    first_index, first = group[0]
    response_id = str(first.get("llm_response_id") or f"response-{run.calls}")
    usage = run.usage.get(response_id, {})
    thought = _text(first.get("thought"))
    reasoning = first.get("reasoning_content") if isinstance(first.get("reasoning_content"), str) else None
    reply: dict[str, Any] = {"role": "assistant", "content": thought}
    if reasoning:
        reply["reasoning_content"] = reasoning
    reply["tool_calls"] = [
        {
            "id": str(e.get("tool_call_id") or ""),
            "type": "function",
            "function": {"name": str(e.get("tool_name") or ""), "arguments": _arguments(e)},
        }
        for _, e in group
    ]
    builder.advance(run.previous_ts)
    _model_turn(run, reply, response_id, usage)
    for position, (index, event) in enumerate(group):
        ts = run.stamps[index]
        builder.advance(ts)
        action = object_of(event.get("action"))
        kind = str(action.get("kind") or "")
        call_id = str(event.get("tool_call_id") or f"event-{event.get('id')}")
        command = action.get("command") if kind in _SHELL_ACTIONS else None
        event_id = builder.action(
            str(event.get("tool_name") or kind or "unknown"),
            reply["tool_calls"][position]["function"]["arguments"],
            command if isinstance(command, str) else None,
            (f"{reasoning}\n\n{thought}" if reasoning and thought else reasoning or thought) or None,
            tool_call_id=call_id,
            message_id=response_id,
            output_tokens=count(usage.get("completion_tokens"), f"usage[{response_id}]", issues)
            if position == 0
            else 0,
            reasoning_tokens=count(usage.get("reasoning_tokens"), f"usage[{response_id}]", issues)
            if position == 0
            else 0,
            model_latency_ms=(ts - run.previous_ts) / 1000 if position == 0 and ts and run.previous_ts else 0.0,
        )
        run.pending[call_id] = (event_id, builder.now)
        run.last_action = (event_id, call_id)
        if kind == "FinishAction" or event.get("tool_name") == "finish":
            run.finish = (event_id, call_id)


def _on_observation(run: _Run, index: int, event: dict[str, Any]) -> None:
    """The answer to a tool call: an observation, an agent error, or a user's rejection."""
    call_id = str(event.get("tool_call_id") or "")
    if call_id not in run.pending:
        return
    action_id, action_ts = run.pending.pop(call_id)
    builder, ts = run.builder, run.stamps[index]
    builder.advance(ts)
    observation = object_of(event.get("observation"))
    exit_code = observation.get("exit_code")
    failure = None
    if event.get("kind") == "AgentErrorEvent":
        output = failure = str(event.get("error") or "")
    elif "rejection_reason" in event:
        output = failure = f"rejected: {event.get('rejection_reason')}"
    else:
        output = _observation_text(observation)
        if observation.get("timeout") is True:
            failure = "command timed out"
    builder.feedback(
        action_id,
        output,
        tool_call_id=call_id,
        exit_code=exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None,
        duration_ms=(ts - action_ts) / 1000 if ts is not None else 0.0,
        failure_reason=failure,
    )
    run.builder.calls.append(
        {"role": "tool", "tool_call_id": call_id, "name": str(event.get("tool_name") or ""), "content": output}
    )
    _file_op(run, observation)


def _file_op(run: _Run, observation: dict[str, Any]) -> None:
    command = observation.get("command")
    path = observation.get("path")
    if observation.get("kind") not in _EDIT_OBSERVATIONS or command not in _EDIT_COMMANDS or not isinstance(path, str):
        return
    if observation.get("error"):
        return
    new_content = observation.get("new_content")
    data = new_content.encode() if isinstance(new_content, str) else None
    op = "write" if command != "create" or observation.get("prev_exist") else "create"
    run.builder.file_op(
        op,
        path,
        size_bytes=len(data) if data else 0,
        sha256=hashlib.sha256(data).hexdigest() if data is not None else None,
    )


def _on_state(run: _Run, index: int, event: dict[str, Any]) -> None:
    key, value = event.get("key"), event.get("value")
    if key == "execution_status" and isinstance(value, str):
        run.status = value
    elif key == "full_state" and isinstance(value, dict) and isinstance(value.get("execution_status"), str):
        run.status = value["execution_status"]


def _on_conversation_error(run: _Run, index: int, event: dict[str, Any]) -> None:
    run.error = ": ".join(str(event[k]) for k in ("code", "detail") if event.get(k))


def _on_system_update(run: _Run, index: int, event: dict[str, Any]) -> None:
    """A new system prompt (and tool list) for the calls that follow."""
    tools = list_of(event.get("tools"))
    if tools:
        run.tools = tools
    if event.get("system_prompt"):
        run.builder.calls.append({"role": "system", "content": _text(event.get("system_prompt"))})


def _on_condensation(run: _Run, index: int, event: dict[str, Any]) -> None:
    """The history was condensed: later calls see the summary in place of the forgotten events."""
    summary = event.get("summary")
    forgotten = len(list_of(event.get("forgotten_event_ids")))
    if isinstance(summary, str) and summary:
        run.builder.calls.append({"role": "user", "content": summary})
        run.context.append(f"[history condensed: {forgotten} events summarised]\n{summary}")
    elif forgotten:
        run.context.append(f"[history condensed: {forgotten} events forgotten]")


def _on_summary(run: _Run, index: int, event: dict[str, Any]) -> None:
    summary = _text(event.get("summary"))
    if summary:
        run.builder.calls.append({"role": "user", "content": summary})
        run.context.append(summary)


def _on_user_action(run: _Run, index: int, event: dict[str, Any]) -> None:
    """A pause or an interrupt from the user: the conversation stops there unless it goes on."""
    run.status = "paused" if event.get("kind") == "PauseEvent" else "interrupted"


_HANDLERS = {
    "SystemPromptEvent": _on_system,
    "MessageEvent": _on_message,
    "ObservationEvent": _on_observation,
    "AgentErrorEvent": _on_observation,
    "UserRejectObservation": _on_observation,
    "ConversationStateUpdateEvent": _on_state,
    "ConversationErrorEvent": _on_conversation_error,
    "SystemPromptUpdateEvent": _on_system_update,
    "Condensation": _on_condensation,
    "CondensationSummaryEvent": _on_summary,
    "PauseEvent": _on_user_action,
    "InterruptEvent": _on_user_action,
}


def _usage_by_response(events: list[dict[str, Any]], state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Token usage per ``llm_response_id`` from the last stats the stream (or the saved state) holds."""
    stats: dict[str, Any] = object_of(state.get("stats"))
    for event in events:
        if event.get("kind") == "ConversationStateUpdateEvent":
            value = object_of(event.get("value"))
            if event.get("key") == "stats":
                stats = value
            elif event.get("key") == "full_state" and value.get("stats"):
                stats = object_of(value.get("stats"))
    usage: dict[str, dict[str, Any]] = {}
    for metrics in object_of(stats.get("usage_to_metrics")).values():
        for entry in list_of(object_of(metrics).get("token_usages")):
            if isinstance(entry, dict) and entry.get("response_id"):
                usage[str(entry["response_id"])] = entry
    return usage


def _convert(source: SourceFile, events: list[dict[str, Any]], run: dict[str, Any]) -> ImportedSession:
    """One V1 conversation; ``run`` holds what the caller knows (task id, verdict, patch, saved state)."""
    state = _begin(source, [e for e in events if isinstance(e, dict)], run)
    for index, group in _response_groups(state.events):
        if len(group) > 1 or group[0][1].get("kind") == "ActionEvent":
            _on_actions(state, group)
        else:
            handler = _HANDLERS.get(str(group[0][1].get("kind")))
            if handler is not None:
                handler(state, index, group[0][1])
        for i, _ in group:
            passed(state, i)
    return _end(state, source, run)


def _begin(source: SourceFile, events: list[dict[str, Any]], run: dict[str, Any]) -> _Run:
    """The conversation's task, model, tools and saved state read into a started builder.

    Raises:
        ImportFormatError: no instruction given and no user message with the task.
    """
    issues = FieldIssues()
    stamps = [iso_micros(e.get("timestamp"), f"event {str(e.get('id'))[:40]}.timestamp", issues) for e in events]
    first_user = next(
        (i for i, e in enumerate(events) if e.get("kind") == "MessageEvent" and e.get("source") == "user"), None
    )
    instruction = run.get("instruction") or (
        _text(object_of(events[first_user].get("llm_message")).get("content")) if first_user is not None else None
    )
    if not instruction:
        raise ImportFormatError(source.path, "no user message with the task")
    state = object_of(run.get("state"))
    system = next((e for e in events if e.get("kind") == "SystemPromptEvent"), {})
    model = run.get("agent_model") or object_of(object_of(state.get("agent")).get("llm")).get("model")
    builder = RunBuilder(
        source,
        FRAMEWORK,
        "openhands-v1-events",
        {
            "task_id": str(run.get("task_id") or source.path.stem),
            "task_type": str(run.get("task_type") or "openhands"),
            "image_version": "v1",
            "agent_name": "openhands",
            "agent_version": run.get("agent_version"),
            "agent_model": str(model) if model else None,
        },
        source_session_id=str(state["id"]) if state.get("id") else None,
        issues=issues,
    )
    known = [s for s in stamps if s is not None]
    builder.at(min(known) if known else None)
    builder.start(str(instruction), workspace_root="/workspace", task_family=run.get("task_id"))
    if first_user is None:
        builder.calls.append({"role": "user", "content": str(instruction)})
    return _Run(
        builder,
        events,
        stamps,
        first_user if first_user is not None else -1,
        _usage_by_response(events, state),
        list_of(system.get("tools")) or None,
        str(model or ""),
        previous_ts=known[0] if known else None,
        status=str(state.get("execution_status") or ""),
    )


def _end(state: _Run, source: SourceFile, run: dict[str, Any]) -> ImportedSession:
    """The exit (with the patch as the finishing action's feedback) and the harness's verdict, or the one beside."""
    builder = state.builder
    known = [s for s in state.stamps if s is not None]
    builder.advance(max(known) if known else None)
    submission_event = None
    patch = run.get("submission")
    target = state.finish or state.last_action
    if patch and target is not None:
        builder.tick()
        submission_event = builder.feedback(target[0], str(patch), tool_call_id=target[1])
    status = state.status or ("finished" if state.finish else "stopped")
    error = run.get("error") or state.error or None
    builder.end(
        exit_outcome(status, error),
        wall_seconds(state.stamps),
        exit_reason(status, error),
        submission_event=submission_event,
    )
    verdict = run.get("verdict")
    if verdict is not None:
        details = json.dumps({"test_result": run.get("test_result")}, sort_keys=True, default=str)
        task = str(run.get("task_id"))
        builder.verdict(Verdict(task, verdict, 1.0 if verdict else 0.0, HARNESS, "openhands", 1, int(verdict), details))
    elif run.get("task_id"):
        attach_verdict_beside(builder, source, str(run["task_id"]))
    return builder.finish()


def _output_run(record: dict[str, Any]) -> dict[str, Any]:
    instance = object_of(record.get("instance"))
    metadata = object_of(record.get("metadata"))
    model = (
        metadata.get("model_name")
        or object_of(metadata.get("llm")).get("model")
        or object_of(metadata.get("llm_config")).get("model")
    )
    error = record.get("error")
    return {
        "task_id": str(record.get("instance_id") or instance.get("instance_id") or record.get("id") or ""),
        "task_type": str(metadata.get("dataset") or "openhands").strip().lower(),
        "instruction": record.get("instruction"),
        "agent_model": str(model) if model else None,
        "error": str(error) if error else None,
        "verdict": _verdict(record.get("test_result")),
        "test_result": record.get("test_result"),
        "submission": _patch_of(record.get("test_result")),
    }


def convert(source: SourceFile) -> list[ImportedSession]:
    """The session(s) of a V1 event array, an evaluation output record, or one event of a JSON Lines stream.

    Raises:
        ImportFormatError: no user message with the task, or not V1 events.
    """
    data = source.data
    if isinstance(data, list):
        return [_convert(source, data, {"task_id": source.path.name.split(".")[0]})]
    if _is_v1_output(data):
        return [_convert(source, list_of(data.get("history")), _output_run(data))]
    if isinstance(data, dict) and data.get("history") == []:
        instance = data.get("instance_id") or object_of(data.get("instance")).get("instance_id")
        raise ImportFormatError(source.path, f"instance {instance!r}: empty history (the run recorded no event)")
    raise ImportFormatError(source.path, "not OpenHands V1 events (objects with 'kind', 'source' and 'id')")


def convert_stream(source: SourceFile) -> list[ImportedSession]:
    """A JSON Lines file whose lines are V1 events of one conversation (or V1 evaluation output lines)."""
    assert isinstance(source.data, JsonLines)
    if _is_v1_output(source.data.first):
        raise ImportFormatError(source.path, "evaluation output is read line by line")  # handled per record
    events = []
    for record in source.data.records():
        if isinstance(record, ImportFormatError):
            raise record
        events.append(record.data)
    return [_convert(source, events, {"task_id": source.path.name.split(".")[0]})]


def convert_event_files(path: Path, files: list[Path], state: dict[str, Any], task_id: str) -> list[ImportedSession]:
    """A persisted V1 conversation: one event per file (``files`` in order), with its saved state if any.

    Raises:
        ImportFormatError: an event file is not JSON, or no user message with the task.
    """
    events = [e for e in (read_json_file(f) for f in files) if isinstance(e, dict)]
    digest = hashlib.sha256(b"".join(read_bytes(f) for f in files)).hexdigest()
    run = {"task_id": task_id, "state": state}
    return [_convert(SourceFile(path, digest, events), events, run)]


def convert_directory(path: Path) -> list[ImportedSession]:
    """A persisted V1 conversation directory: ``events/event-*.json`` in order, ``base_state.json`` beside.

    Raises:
        ImportFormatError: an event file is not JSON, or no user message with the task.
    """
    files = sorted((path / "events").glob("event-*.json"))
    state = read_json_file(path / "base_state.json") if (path / "base_state.json").is_file() else {}
    return convert_event_files(path, files, object_of(state), path.name)
