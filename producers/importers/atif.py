"""Import Harbor's Agent Trajectory Interchange Format (ATIF v1.0 through v1.8, one trajectory per file or line).

Each agent step becomes one model call (schema v3 ``model_call``: the messages so far as the
request, the step's message, reasoning and tool calls as the reply, its metrics' token counts,
token ids and logprobs), one ``agent_action`` per tool call (the original ``tool_call_id``) and
one ``env_feedback`` per observation result. System and user steps are messages of the next
request; the first user step is the task statement. Messages and observation contents may be
strings or (v1.6+) lists of content parts; tool definitions come from ``agent.tool_definitions``
(v1.5+) or ``agent.extra.tool_definitions``.

The trajectory's own ``session_id`` (or ``trajectory_id``) is kept as ``extra.source_session_id``;
the session id is derived from the file like every import's, so a file cannot take over a session
another producer owns. A ``reward`` in the trajectory's ``extra`` is the file's own claim
(provenance ``self_reported``); Harbor's verifier writes the trusted one into the trial's
``result.json`` (``producers.importers.harbor``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from producers.importers._common import (
    ImportedSession,
    ImportFormatError,
    RunBuilder,
    SourceFile,
    Verdict,
    arguments_text,
    command_of,
    exit_outcome,
    exit_reason,
    list_of,
    object_of,
    text_of,
)
from producers.importers._source import JsonLines
from producers.importers._values import count, iso_micros, number, optional_count
from producers.importers.verdicts import SELF_REPORTED

FRAMEWORK = "atif"


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is an ATIF trajectory, or JSON Lines of them (``trajlake export --format atif``)."""
    if isinstance(data, JsonLines):
        return looks_like(data.first)
    return isinstance(data, dict) and str(data.get("schema_version", "")).startswith("ATIF") and "steps" in data


def why_not(data: Any) -> str:
    """Why ``data`` is not ATIF (for the unknown-format message)."""
    return "no schema_version 'ATIF-…' with 'steps'"


def _call(tool_call: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(tool_call.get("tool_call_id") or ""),
        "type": "function",
        "function": {
            "name": str(tool_call.get("function_name") or ""),
            "arguments": arguments_text(tool_call.get("arguments")),
        },
    }


@dataclass(frozen=True)
class Trial:
    """What a Harbor trial's ``result.json`` adds to its trajectory: the task, the agent, how it ended, the verdict."""

    task_id: str | None = None
    agent_name: str | None = None
    agent_version: str | None = None
    agent_model: str | None = None
    exception: str | None = None
    verdict: Verdict | None = None
    workspace_root: str | None = None


@dataclass
class _Run:
    builder: RunBuilder
    steps: list[dict[str, Any]]
    stamps: list[int | None]
    tools: list[dict[str, Any]] | None
    pending_context: list[dict[str, Any]] = field(default_factory=list)


def _on_context_step(run: _Run, step: dict[str, Any]) -> None:
    """A system or user step: a message of the next request (a bare observation: tool messages)."""
    source = step.get("source")
    text = text_of(step.get("message"))
    results = list_of(object_of(step.get("observation")).get("results")) if source == "system" else []
    if results and not text:  # a tool result without an agent turn before it
        for r in results:
            result = object_of(r)
            run.builder.calls.append(
                {
                    "role": "tool",
                    "tool_call_id": result.get("source_call_id"),
                    "content": text_of(result.get("content")),
                }
            )
    else:
        run.builder.calls.append({"role": "system" if source == "system" else "user", "content": text})


def _on_agent_step(run: _Run, index: int, step: dict[str, Any]) -> None:
    """An agent step: its model call, an action per tool call, the feedback of each observation result."""
    builder, issues = run.builder, run.builder.issues
    where = f"steps[{index}]"
    builder.advance(run.stamps[index])
    metrics = object_of(step.get("metrics"))
    text = text_of(step.get("message"))
    reply: dict[str, Any] = {"role": "assistant", "content": text}
    if isinstance(step.get("reasoning_content"), str) and step["reasoning_content"]:
        reply["reasoning_content"] = step["reasoning_content"]
    calls = [_call(c) for c in list_of(step.get("tool_calls")) if isinstance(c, dict)]
    if calls:
        reply["tool_calls"] = calls
    prompt_tokens = optional_count(metrics.get("prompt_tokens"), f"{where}.prompt_tokens", issues)
    completion_tokens = optional_count(metrics.get("completion_tokens"), f"{where}.completion_tokens", issues)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": optional_count(metrics.get("cached_tokens"), where, issues)},
    }
    cost = number(metrics.get("cost_usd"), f"{where}.cost_usd", issues)
    message_id = f"step-{step.get('step_id', index)}"
    record = builder.model_call(
        reply,
        tools=run.tools,
        model=str(step.get("model_name") or ""),  # the agent's default model stays the agent's
        usage=usage,
        finish_reason=_str_or_none(object_of(step.get("extra")).get("finish_reason")),
        prompt_token_ids=_ints(metrics.get("prompt_token_ids")),
        completion_token_ids=_ints(metrics.get("completion_token_ids")),
        logprobs=_floats(metrics.get("logprobs")),
        cost_usd=cost,
    )
    builder.agent_input(
        prompt_digest=record["request_sha256"],
        input_tokens=prompt_tokens or 0,
        cached_tokens=count(metrics.get("cached_tokens"), where, issues),
        n_messages=record["n_messages"],
        model_call=record,
        message_id=message_id,
    )
    results = {
        str(object_of(r).get("source_call_id")): text_of(object_of(r).get("content"))
        for r in list_of(object_of(step.get("observation")).get("results"))
        if isinstance(r, dict)
    }
    for position, call in enumerate(calls):
        arguments = call["function"]["arguments"]
        action_id = builder.action(
            call["function"]["name"],
            arguments,
            command_of(arguments),
            text or None,
            tool_call_id=call["id"],
            message_id=message_id,
            output_tokens=(completion_tokens or 0) if position == 0 else 0,
            cost_usd=(cost or 0.0) if position == 0 else 0.0,
        )
        if call["id"] in results:
            builder.feedback(action_id, results[call["id"]], tool_call_id=call["id"])
            builder.calls.append({"role": "tool", "tool_call_id": call["id"], "content": results[call["id"]]})


def _ints(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return value if all(-(2**63) <= v < 2**63 for v in value) else None


def _floats(value: Any) -> list[float] | None:
    if not isinstance(value, list) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return None
    return [float(v) for v in value]


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _begin(source: SourceFile, trial: Trial) -> _Run:
    data = source.data
    if not isinstance(data, dict):
        raise ImportFormatError(source.path, "an ATIF trajectory is a JSON object")
    steps = data.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ImportFormatError(source.path, "ATIF trajectory without a 'steps' list of objects")
    own_id = str(data.get("session_id") or data.get("trajectory_id") or "")
    instruction = next((text_of(s.get("message")) for s in steps if s.get("source") == "user"), None)
    if instruction is None:
        raise ImportFormatError(source.path, "no user step with the task statement")
    agent = object_of(data.get("agent"))
    extra = object_of(data.get("extra"))
    tools = list_of(agent.get("tool_definitions")) or list_of(object_of(agent.get("extra")).get("tool_definitions"))
    builder = RunBuilder(
        source,
        FRAMEWORK,
        str(data["schema_version"]),
        {
            "task_id": trial.task_id or str(extra.get("task_id") or own_id or source.path.stem),
            "task_type": str(extra.get("task_type") or ("harbor" if trial.task_id else "imported")),
            "image_version": str(data["schema_version"]),
            "agent_name": trial.agent_name or _str_or_none(agent.get("name")),
            "agent_version": trial.agent_version or _str_or_none(agent.get("version")),
            "agent_model": trial.agent_model or _str_or_none(agent.get("model_name")),
            "policy_version": _str_or_none(extra.get("policy_version")),
        },
        source_session_id=own_id or None,
    )
    stamps = [iso_micros(s.get("timestamp"), f"steps[{i}].timestamp", builder.issues) for i, s in enumerate(steps)]
    builder.at(next((t for t in stamps if t is not None), None))
    family = extra.get("task_family") or trial.task_id
    builder.start(
        instruction, data.get("agent"), workspace_root=trial.workspace_root, task_family=str(family) if family else None
    )
    return _Run(builder, steps, stamps, [t for t in tools if isinstance(t, dict)] or None)


def _end(run: _Run, data: dict[str, Any], trial: Trial) -> None:
    builder = run.builder
    builder.tick()
    extra = object_of(data.get("extra"))
    reward = number(extra.get("reward"), "extra.reward", builder.issues)
    stop = str(extra.get("stop_reason") or "terminal")
    known = [s for s in run.stamps if s is not None]
    runtime = (max(known) - min(known)) / 1e6 if known else 0.0
    if trial.exception:
        builder.end(exit_outcome(None, trial.exception), runtime, exit_reason(None, trial.exception))
    elif stop == "terminal":
        builder.end("completed", runtime, None)
    else:
        reason = stop.removeprefix("truncated:")
        builder.end("timeout" if "timeout" in reason else "capped", runtime, reason)
    # the file's own reward is a verdict of its own (self-reported), never session_end's reward
    if trial.verdict is not None:
        builder.verdict(trial.verdict)
    elif reward is not None:
        task = str(builder.emitter.envelope["task_id"])
        builder.verdict(Verdict(task, reward >= 1.0, reward, SELF_REPORTED, f"imported:{FRAMEWORK}"))


def convert(source: SourceFile, trial: Trial | None = None) -> list[ImportedSession]:
    """The session of one ATIF trajectory (a whole file, or one line of a JSON Lines export).

    Args:
        source: the trajectory.
        trial: what the Harbor trial it belongs to says about it (task, agent, exception, verdict).

    Raises:
        ImportFormatError: a trajectory without a steps list or a user step with the task.
    """
    trial = trial or Trial()
    run = _begin(source, trial)
    for index, step in enumerate(run.steps):
        if step.get("source") == "agent":
            _on_agent_step(run, index, step)
        else:
            _on_context_step(run, step)
    _end(run, source.data, trial)
    return [run.builder.finish()]


__all__ = ["FRAMEWORK", "Trial", "convert", "looks_like", "why_not"]
