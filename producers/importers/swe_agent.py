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
v3): the history before it, demonstrations included, is the exact request.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from producers.importers._common import (
    ImportFormatError,
    RunBuilder,
    SourceFile,
    apportion,
    chat_message,
    digest,
    end_status,
    object_of,
    text_of,
)
from producers.sdk import Event

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
                args = yaml.safe_load(candidate.read_text())
            except (OSError, yaml.YAMLError):
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


def convert(source: SourceFile) -> list[Event]:
    """All events of one SWE-agent run.

    Raises:
        ImportFormatError: required fields are missing or of the wrong type.
    """
    data = source.data
    steps, history = data.get("trajectory"), data.get("history")
    lists = isinstance(steps, list) and isinstance(history, list)
    if not lists or not all(isinstance(item, dict) for item in [*steps, *history]):
        reason = "SWE-agent trajectory whose 'trajectory'/'history' are not lists of objects"
        raise ImportFormatError(source.path, reason)
    info = object_of(data.get("info"))
    replay = _as_dict(data.get("replay_config"))
    version = "v1" if replay or any("message_type" in h for h in history) else "v0"
    full_history = history  # what the model saw, demonstrations included (the exact requests)
    positions = [i for i, h in enumerate(history) if not h.get("is_demo")]
    history = [h for h in history if not h.get("is_demo")]  # in-context demonstrations are not this run
    problem = object_of(replay.get("problem_statement"))
    instruction = next((text_of(h.get("content")) for h in history if h.get("role") == "user"), None)
    instruction = instruction or text_of(problem.get("text")) or None
    if instruction is None:
        raise ImportFormatError(source.path, "no non-demo user message or problem statement with the task")
    system = next((text_of(h.get("content")) for h in history if h.get("role") == "system"), "")
    model = ((replay.get("agent") or {}).get("model") or {}).get("name") or companion_model(source.path)
    stats = object_of(info.get("model_stats"))

    builder = RunBuilder(
        source,
        FRAMEWORK,
        f"swe-agent-traj-{version}",
        {
            "task_id": str(problem.get("id") or source.path.stem),
            "task_type": "ctf" if _CTF.search(system) or _CTF.search(instruction) else "swe",
            "image_version": version,
            "agent_name": FRAMEWORK,
            "agent_model": str(model) if model else None,
        },
    )
    task_id = str(problem.get("id") or source.path.stem)
    states = [_as_dict(step.get("state")) for step in steps]
    workspace = next((str(state["working_dir"]) for state in states if state.get("working_dir")), None)
    builder.start(instruction, replay or None, workspace_root=workspace, task_family=task_id)
    submission = text_of(info.get("submission"))
    submission_event: str | None = None

    matches = _match_assistant(history, steps)
    input_tokens = apportion(int(stats.get("tokens_sent") or 0), len(steps))
    output_tokens = apportion(int(stats.get("tokens_received") or 0), len(steps))
    cost = float(stats.get("instance_cost") or 0.0) / len(steps) if steps else 0.0
    runtime_s = 0.0
    for number, step in enumerate(steps):
        index = matches[number]
        entry = history[index] if index is not None else {}
        builder.tick()
        message_id = f"step-{number}"
        record = None
        if index is not None:  # the step's model turn is in the history: its request and reply as recorded
            record = builder.model_call(
                [chat_message(h) for h in full_history[: positions[index]]],
                chat_message(entry),
                model=str(model or ""),
                usage={"prompt_tokens": input_tokens[number], "completion_tokens": output_tokens[number]},
                cost_usd=cost,
            )
        builder.emitter.agent_input(
            prompt_digest=digest(history[:index] if index is not None else [number, step.get("response")]),
            input_tokens=input_tokens[number],
            n_messages=index or 0,
            content=instruction if number == 0 else None,
            message_id=message_id,
            model_call=record,
        )
        builder.tick()
        action = str(step.get("action") or "")
        calls = entry.get("tool_calls") or []
        call = calls[0] if calls and isinstance(calls[0], dict) else None
        if call is not None:
            function = call.get("function") or {}
            tool_name = str(function.get("name") or "bash")
            arguments = function.get("arguments")
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments or {}, sort_keys=True)
            call_id = str(call.get("id") or f"step-{number}")
        else:
            word = action.strip().split(maxsplit=1)[0] if action.strip() else ""
            tool_name = word if word in ACI_COMMANDS else "bash"
            arguments, call_id = json.dumps({"command": action}), f"step-{number}"
        action_id = builder.action(
            tool_name,
            arguments,
            action,
            text_of(step.get("thought")),
            tool_call_id=call_id,
            message_id=message_id,
            output_tokens=output_tokens[number],
            cost_usd=cost,
        )
        seconds = float(step.get("execution_time") or 0.0)
        runtime_s += seconds
        builder.tick(seconds)
        observation = text_of(step.get("observation"))
        feedback_id = builder.feedback(action_id, observation, tool_call_id=call_id, duration_ms=seconds * 1000)
        if submission and observation == submission:
            submission_event = feedback_id
        file_op = _file_op(step, version)
        if file_op is not None:
            builder.emitter.file_op(*file_op)

    builder.tick()
    exit_status = str(info.get("exit_status") or "")
    extra = {"submission_event_id": submission_event} if submission_event else None
    payload = {"status": end_status(exit_status), "runtime_s": runtime_s, "exit_reason": exit_status or None}
    builder.emitter.emit("session_end", payload, "system", extra=extra)
    return builder.events
