"""Import SWE-agent ``.traj`` files (v0.x and v1.x function calling, EnIGMA CTF mode).

Each ``trajectory`` entry is one step: an agent_input, an agent_action (tool
name and arguments from the matching ``history`` tool call in v1, else the
ACI command's first word or ``bash``), and the env_feedback holding its
observation. SWE-agent records no exit codes, no rewards and no per-turn
tokens: ``info.model_stats`` totals are apportioned evenly over the turns
(sums stay exact). There are no timestamps either, so time is a synthetic
clock from a fixed epoch advanced by ``execution_time`` where recorded.
Successful ``create``/``edit``/``insert`` commands become file_op events,
their path read from the ``[File: …]`` header the command printed. A step
whose model turn is in the ``history`` carries it as a ``model_call`` (schema
v3): the history before it, demonstrations included, is the exact request. A verdict comes
from a report beside the file (``results.json``, ``report.json``, …).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from producers.importers._common import (
    ImportedSession,
    ImportFormatError,
    RunBuilder,
    SourceFile,
    apportion,
    arguments_text,
    chat_message,
    digest,
    exit_outcome,
    object_of,
    text_of,
)
from producers.importers._source import read_bytes
from producers.importers._values import count, number
from producers.importers.verdicts import attach_verdict_beside

FRAMEWORK = "swe-agent"
# SWE-agent's own interface commands (v0 and EnIGMA); any other first word is a shell command.
ACI_COMMANDS = frozenset(
    {
        "open",
        "goto",
        "scroll_up",
        "scroll_down",
        "create",
        "edit",
        "insert",
        "search_dir",
        "search_file",
        "find_file",
        "submit",
        "filemap",
        "str_replace_editor",
        "decompile",
        "disassemble",
        "debug_start",
        "debug_add_breakpoint",
        "debug_continue",
        "debug_step",
        "debug_exec",
        "debug_stop",
        "connect_start",
        "connect_sendline",
        "connect_exec",
        "connect_stop",
        "exit_forfeit",
    }
)
_EDIT_OPS = {"create": "create", "edit": "write", "insert": "write"}
_FILE_HEADER = re.compile(r"^\s*\[File: (.+?) \(\d+ lines total\)\]")
_EDIT_FAILED = re.compile(r"^\s*(Your proposed edit has introduced|Error|Usage:)", re.IGNORECASE)
_CTF = re.compile(r"\bCTF\b")


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is a SWE-agent trajectory."""
    return isinstance(data, dict) and isinstance(data.get("trajectory"), list) and "history" in data


def why_not(data: Any) -> str:
    """Why ``data`` is not a SWE-agent trajectory (for the unknown-format message)."""
    return "no 'trajectory' list with a 'history'"


def _as_dict(value: Any) -> dict[str, Any]:
    """A dict field that older files store as a JSON string."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def companion_model(path: Path) -> str | None:
    """The model name from a run's ``args.yaml`` next to the file (v0 keeps it only there), if readable."""
    for candidate in (path.with_name(f"{path.stem}.args.yaml"), path.with_name("args.yaml")):
        if candidate.is_file():
            try:
                args = yaml.safe_load(read_bytes(candidate))
            except (ImportFormatError, yaml.YAMLError):
                return None  # the model name is optional metadata; a broken config does not block the run
            model = ((args or {}).get("agent") or {}).get("model") or (args or {}).get("model") or {}
            return str(model["model_name"]) if isinstance(model, dict) and model.get("model_name") else None
    return None


def _match_assistant(history: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[int | None]:
    """History index of the assistant message behind each step, matched in order by action text.

    Retried (malformed) model outputs appear in the history but not among the steps, so a plain zip
    could misalign them.
    """
    assistant = [i for i, h in enumerate(history) if h.get("role") == "assistant"]
    matches: list[int | None] = []
    cursor = 0
    for step in steps:
        action = str(step.get("action") or "").strip()
        found = None
        for position in range(cursor, len(assistant)):
            if str(history[assistant[position]].get("action") or "").strip() == action:
                found, cursor = assistant[position], position + 1
                break
        matches.append(found)
    return matches


def _file_op(step: dict[str, Any], version: str) -> tuple[str, str] | None:
    """(op, path) for a create/edit/insert step that succeeded, when its target is clear."""
    action = str(step.get("action") or "").strip()
    word = action.split(maxsplit=1)[0] if action else ""
    if word not in _EDIT_OPS:
        return None
    observation = str(step.get("observation") or "")
    if _EDIT_FAILED.search(observation):
        return None
    state = _as_dict(step.get("state"))
    header = _FILE_HEADER.search(observation)
    if header:
        path = header.group(1)
    elif version == "v1" and state.get("open_file") not in (None, "", "n/a"):
        path = str(state["open_file"])  # v1 records the state after the step
    else:
        return None
    working_dir = str(state.get("working_dir") or "")
    if not path.startswith("/") and working_dir:
        path = f"{working_dir.rstrip('/')}/{path}"
    return _EDIT_OPS[word], path


@dataclass
class _Run:
    """The state of one run while its steps are read."""

    builder: RunBuilder
    source: SourceFile
    version: str
    instruction: str
    model: str
    full_history: list[dict[str, Any]]  # what the model saw, demonstrations included (the exact requests)
    history: list[dict[str, Any]]  # without demonstrations
    positions: list[int]  # index in full_history of each history entry
    matches: list[int | None]
    input_tokens: list[int]
    output_tokens: list[int]
    cost: float
    submission: str
    cursor: int = 0  # full_history messages already in the conversation
    runtime_s: float = 0.0
    submission_event: str | None = None


def _begin(source: SourceFile) -> tuple[_Run, list[dict[str, Any]]]:
    data = source.data
    steps, history = data.get("trajectory"), data.get("history")
    lists = isinstance(steps, list) and isinstance(history, list)
    if not lists or not all(isinstance(item, dict) for item in [*steps, *history]):
        reason = "SWE-agent trajectory whose 'trajectory'/'history' are not lists of objects"
        raise ImportFormatError(source.path, reason)
    info = object_of(data.get("info"))
    replay = _as_dict(data.get("replay_config"))
    version = "v1" if replay or any("message_type" in h for h in history) else "v0"
    positions = [i for i, h in enumerate(history) if not h.get("is_demo")]
    own = [h for h in history if not h.get("is_demo")]  # in-context demonstrations are not this run
    problem = object_of(replay.get("problem_statement"))
    instruction = next((text_of(h.get("content")) for h in own if h.get("role") == "user"), None)
    instruction = instruction or text_of(problem.get("text")) or None
    if instruction is None:
        raise ImportFormatError(source.path, "no non-demo user message or problem statement with the task")
    system = next((text_of(h.get("content")) for h in own if h.get("role") == "system"), "")
    model = object_of(object_of(replay.get("agent")).get("model")).get("name") or companion_model(source.path)
    task_id = str(problem.get("id") or source.path.stem)
    builder = RunBuilder(
        source,
        FRAMEWORK,
        f"swe-agent-traj-{version}",
        {
            "task_id": task_id,
            "task_type": "ctf" if _CTF.search(system) or _CTF.search(instruction) else "swe",
            "image_version": version,
            "agent_name": FRAMEWORK,
            "agent_model": str(model) if model else None,
        },
    )
    stats = object_of(info.get("model_stats"))
    issues = builder.issues
    states = [_as_dict(step.get("state")) for step in steps]
    workspace = next((str(state["working_dir"]) for state in states if state.get("working_dir")), None)
    builder.start(instruction, replay or None, workspace_root=workspace, task_family=task_id)
    run = _Run(
        builder,
        source,
        version,
        instruction,
        str(model or ""),
        history,
        own,
        positions,
        _match_assistant(own, steps),
        apportion(count(stats.get("tokens_sent"), "info.model_stats.tokens_sent", issues), len(steps)),
        apportion(count(stats.get("tokens_received"), "info.model_stats.tokens_received", issues), len(steps)),
        (number(stats.get("instance_cost"), "info.model_stats.instance_cost", issues) or 0.0) / max(len(steps), 1),
        text_of(info.get("submission")),
    )
    return run, steps


def _model_turn(run: _Run, number_: int, step: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The step's agent_input (with its model call when the history has the turn); its history entry and message id."""
    index = run.matches[number_]
    entry = run.history[index] if index is not None else {}
    builder = run.builder
    builder.tick()
    message_id = f"step-{number_}"
    record = None
    if index is not None:  # the step's model turn is in the history: its request and reply as recorded
        position = run.positions[index]
        for message in run.full_history[run.cursor : position]:
            builder.calls.append(chat_message(message))
        run.cursor = position + 1
        record = builder.model_call(
            chat_message(entry),
            model=run.model,
            usage={"prompt_tokens": run.input_tokens[number_], "completion_tokens": run.output_tokens[number_]},
            cost_usd=run.cost,
        )
    builder.agent_input(
        prompt_digest=record["request_sha256"] if record else digest([number_, step.get("response")]),
        input_tokens=run.input_tokens[number_],
        n_messages=record["n_messages"] if record else 0,
        content=run.instruction if number_ == 0 else None,
        message_id=message_id,
        model_call=record,
    )
    return entry, message_id


def _call_of(entry: dict[str, Any], action: str, number_: int) -> tuple[str, str, str]:
    """(tool name, arguments JSON, call id): the v1 tool call, else the ACI command's first word or ``bash``."""
    calls = entry.get("tool_calls") or []
    call = calls[0] if calls and isinstance(calls[0], dict) else None
    if call is not None:
        function = object_of(call.get("function"))
        return (
            str(function.get("name") or "bash"),
            arguments_text(function.get("arguments")),
            str(call.get("id") or f"step-{number_}"),
        )
    word = action.strip().split(maxsplit=1)[0] if action.strip() else ""
    return (word if word in ACI_COMMANDS else "bash"), json.dumps({"command": action}), f"step-{number_}"


def _step(run: _Run, number_: int, step: dict[str, Any]) -> None:
    """One SWE-agent step: its model turn, its action, the observation, and a file_op for an edit."""
    entry, message_id = _model_turn(run, number_, step)
    builder = run.builder
    builder.tick()
    action = text_of(step.get("action"))
    tool_name, arguments, call_id = _call_of(entry, action, number_)
    action_id = builder.action(
        tool_name,
        arguments,
        action,
        text_of(step.get("thought")),
        tool_call_id=call_id,
        message_id=message_id,
        output_tokens=run.output_tokens[number_],
        cost_usd=run.cost,
    )
    seconds = number(step.get("execution_time"), f"trajectory[{number_}].execution_time", builder.issues) or 0.0
    run.runtime_s += max(seconds, 0.0)
    builder.tick(seconds)
    observation = text_of(step.get("observation"))
    feedback_id = builder.feedback(action_id, observation, tool_call_id=call_id, duration_ms=max(seconds, 0.0) * 1000)
    if run.submission and observation == run.submission:
        run.submission_event = feedback_id
    file_op = _file_op(step, run.version)
    if file_op is not None:
        builder.file_op(*file_op)


def convert(source: SourceFile) -> list[ImportedSession]:
    """The session of one SWE-agent run.

    Raises:
        ImportFormatError: required fields are missing or of the wrong type.
    """
    run, steps = _begin(source)
    for number_, step in enumerate(steps):
        _step(run, number_, step)
    run.builder.tick()
    info = object_of(source.data.get("info"))
    exit_status = str(info.get("exit_status") or "")
    run.builder.end(
        exit_outcome(exit_status), run.runtime_s, exit_status or None, submission_event=run.submission_event
    )
    attach_verdict_beside(run.builder, source, str(run.builder.emitter.envelope["task_id"]))
    return [run.builder.finish()]
