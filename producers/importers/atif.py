"""Import Harbor's Agent Trajectory Interchange Format (ATIF v1.0 through v1.8, one trajectory per file or line).

Each agent step becomes one model call (schema v3 ``model_call``: the messages so far as the
request, the step's message, reasoning and tool calls as the reply, its metrics' token counts,
cost, token ids and logprobs, reasoning tokens), one ``agent_action`` per tool call (the original
``tool_call_id``) and one ``env_feedback`` per observation result. System and user steps are
messages of the next request; the first user step is the task statement.

Versions: v1.2 (system-step observations: a tool result without an agent turn), v1.3/v1.4
(completion/prompt token ids), v1.5 (``agent.tool_definitions``; earlier files kept them in
``agent.extra``), v1.6 (a message or result may be a list of content parts: text parts are joined,
an image part becomes ``[image: path]``), v1.7 (``trajectory_id`` beside an optional
``session_id``; ``llm_call_count`` 0: a deterministic dispatch, its actions recorded without a
model call; ``is_copied_context`` steps are context, not new turns) and v1.8 (audio parts,
``[audio: path]``). Another version is refused with one clear error.

The trajectory's own ``session_id`` (or ``trajectory_id``) is kept as ``extra.source_session_id``;
the session id is derived from the file like every import's, so a file cannot take over a session
another producer owns. A verdict in the trajectory's ``extra`` (``eval_passed``, ``reward``) is the
file's own claim (provenance ``self_reported``, the claim restated in ``details``); Harbor's
verifier writes the trusted one into the trial's ``result.json`` (``producers.importers.harbor``).

What ``trajlake export --format atif`` writes is read back whole: the run's task, group, attempt,
policy version, status, exit reason, submission and ``prompt_source`` (``extra``), each step's
finish reason, weights' version and engine (``extra``) and reasoning tokens (``metrics.extra``),
so export → import → export gives the same trajectory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from producers.importers._builder import canonical
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
from producers.importers._values import FieldIssues, count, iso_micros, number, optional_count
from producers.importers.verdicts import SELF_REPORTED

FRAMEWORK = "atif"
#: ATIF versions this importer reads (minor versions of 1).
SUPPORTED_MINORS = range(0, 9)
_VERSION = re.compile(r"^ATIF-v1\.(\d+)$")
#: Keys of a step's ``extra.engine`` that go back into its call's event (what the server said about itself).
_SERVED = ("engine", "dtype", "system_fingerprint")
#: How a conversation was first obtained, as ``trajlake export`` writes it (``extra.prompt_source``).
_PROMPT_SOURCES = ("recorded", "reconstructed")


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is an ATIF trajectory, or JSON Lines of them (``trajlake export --format atif``)."""
    if isinstance(data, JsonLines):
        return looks_like(data.first)
    return isinstance(data, dict) and str(data.get("schema_version", "")).startswith("ATIF") and "steps" in data


def why_not(data: Any) -> str:
    """Why ``data`` is not ATIF (for the unknown-format message)."""
    return "no schema_version 'ATIF-…' with 'steps'"


def content_text(content: Any) -> str:
    """A message or observation content as text: a string, or its content parts (v1.6+) joined.

    An image (v1.6) or audio (v1.8) part becomes a reference, ``[image: path]``: the media stays where it is.
    """
    if not isinstance(content, list):
        return text_of(content)
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("image", "audio"):
            path = object_of(part.get("source")).get("path")
            parts.append(f"[{kind}: {path if isinstance(path, str) else ''}]")
        else:
            parts.append(text_of([part]))
    return "\n".join(parts)


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
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (feedback event id, output): the submission's


def _reply(step: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """An agent step as the assistant message the model gave."""
    reply: dict[str, Any] = {"role": "assistant", "content": content_text(step.get("message"))}
    if isinstance(step.get("reasoning_content"), str) and step["reasoning_content"]:
        reply["reasoning_content"] = step["reasoning_content"]
    if calls:
        reply["tool_calls"] = calls
    return reply


def _results(step: dict[str, Any]) -> dict[str, str]:
    """The step's observation results by the call they answer."""
    return {
        str(object_of(r).get("source_call_id")): content_text(object_of(r).get("content"))
        for r in list_of(object_of(step.get("observation")).get("results"))
        if isinstance(r, dict)
    }


def _on_context_step(run: _Run, step: dict[str, Any]) -> None:
    """A system or user step: a message of the next request (a bare observation: tool messages)."""
    source = step.get("source")
    text = content_text(step.get("message"))
    results = list_of(object_of(step.get("observation")).get("results")) if source == "system" else []
    if results and not text:  # a tool result without an agent turn before it
        for r in results:
            result = object_of(r)
            run.builder.calls.append(
                {
                    "role": "tool",
                    "tool_call_id": result.get("source_call_id"),
                    "content": content_text(result.get("content")),
                }
            )
    else:
        run.builder.calls.append({"role": "system" if source == "system" else "user", "content": text})


def _on_copied_step(run: _Run, step: dict[str, Any]) -> None:
    """An agent step copied from an earlier trajectory (v1.7 ``is_copied_context``): context, not a turn."""
    calls = [_call(c) for c in list_of(step.get("tool_calls")) if isinstance(c, dict)]
    run.builder.calls.append(_reply(step, calls))
    results = _results(step)
    for call in calls:
        if call["id"] in results:
            run.builder.calls.append({"role": "tool", "tool_call_id": call["id"], "content": results[call["id"]]})


def _served(step_extra: dict[str, Any]) -> dict[str, str]:
    """What the server said about the step's call: the weights' version, the engine (``extra`` of its event)."""
    served = {
        key: str(value)
        for key, value in object_of(step_extra.get("engine")).items()
        if key in _SERVED and isinstance(value, str | int | float) and not isinstance(value, bool)
    }
    version = step_extra.get("policy_version")
    if isinstance(version, str | int) and not isinstance(version, bool):
        served["policy_version"] = str(version)
    return served


def _dispatch(step: dict[str, Any]) -> bool:
    """Whether the step says no model call was behind it (v1.7 ``llm_call_count`` 0: a deterministic dispatch)."""
    calls = step.get("llm_call_count")
    return type(calls) is int and calls == 0


def _on_agent_step(run: _Run, index: int, step: dict[str, Any]) -> None:
    """An agent step: its model call, an action per tool call, the feedback of each observation result."""
    builder, issues = run.builder, run.builder.issues
    where = f"steps[{index}]"
    builder.advance(run.stamps[index])
    metrics = object_of(step.get("metrics"))
    step_extra = object_of(step.get("extra"))
    calls = [_call(c) for c in list_of(step.get("tool_calls")) if isinstance(c, dict)]
    reply = _reply(step, calls)
    text = reply["content"]
    completion_tokens = optional_count(metrics.get("completion_tokens"), f"{where}.completion_tokens", issues)
    reasoning_tokens = optional_count(
        object_of(metrics.get("extra")).get("reasoning_tokens"), f"{where}.reasoning_tokens", issues
    )
    cost = number(metrics.get("cost_usd"), f"{where}.cost_usd", issues)
    message_id = f"step-{step.get('step_id', index)}"
    if _dispatch(step):
        builder.calls.append(reply)  # what the model sees next, though no model wrote it
    else:
        prompt_tokens = optional_count(metrics.get("prompt_tokens"), f"{where}.prompt_tokens", issues)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": optional_count(metrics.get("cached_tokens"), where, issues)},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        }
        record = builder.model_call(
            reply,
            tools=run.tools,
            model=str(step.get("model_name") or ""),  # the agent's default model stays the agent's
            usage=usage,
            finish_reason=_str_or_none(step_extra.get("finish_reason")),
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
            extra=_served(step_extra),
        )
    results = _results(step)
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
            reasoning_tokens=(reasoning_tokens or 0) if position == 0 else 0,
            cost_usd=(cost or 0.0) if position == 0 else 0.0,
        )
        if call["id"] in results:
            output = results[call["id"]]
            run.outputs.append((builder.feedback(action_id, output, tool_call_id=call["id"]), output))
            builder.calls.append({"role": "tool", "tool_call_id": call["id"], "content": output})


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


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


def _version(source: SourceFile, data: dict[str, Any]) -> None:
    """Refuse a version this importer does not read (its fields could mean something else)."""
    found = _VERSION.match(str(data.get("schema_version") or ""))
    if found is None or int(found.group(1)) not in SUPPORTED_MINORS:
        raise ImportFormatError(
            source.path, f"unsupported ATIF version {str(data.get('schema_version'))[:40]!r} (reads ATIF-v1.0 to v1.8)"
        )


def _begin(source: SourceFile, trial: Trial) -> _Run:
    data = source.data
    if not isinstance(data, dict):
        raise ImportFormatError(source.path, "an ATIF trajectory is a JSON object")
    _version(source, data)
    steps = data.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ImportFormatError(source.path, "ATIF trajectory without a 'steps' list of objects")
    own_id = str(data.get("session_id") or data.get("trajectory_id") or "")
    instruction = next((content_text(s.get("message")) for s in steps if s.get("source") == "user"), None)
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
    builder.group(_str_or_none(extra.get("group_id")), _int_or_none(extra.get("attempt")))
    stamps = [iso_micros(s.get("timestamp"), f"steps[{i}].timestamp", builder.issues) for i, s in enumerate(steps)]
    builder.at(next((t for t in stamps if t is not None), None))
    family = extra.get("task_family") or trial.task_id
    carried = extra.get("prompt_source")
    builder.start(
        instruction,
        data.get("agent"),
        workspace_root=trial.workspace_root,
        task_family=str(family) if family else None,
        # how the conversation was first obtained, when an export says so
        extra={"prompt_source": carried} if carried in _PROMPT_SOURCES else None,
    )
    return _Run(builder, steps, stamps, [t for t in tools if isinstance(t, dict)] or None)


def _claim(extra: dict[str, Any], task: str, issues: FieldIssues) -> Verdict | None:
    """The file's own verdict (``eval_passed``, ``reward``), self-reported; None when it claims none."""
    passed = extra.get("eval_passed")
    passed = passed if isinstance(passed, bool) else None
    reward = number(extra.get("reward"), "extra.reward", issues)
    if passed is None and reward is None:
        return None
    return Verdict(
        task,
        passed if passed is not None else bool(reward is not None and reward >= 1.0),
        reward if reward is not None else float(bool(passed)),
        SELF_REPORTED,
        f"imported:{FRAMEWORK}",
        details=canonical({"eval_passed": passed, "reward": reward}),  # the claim as the file states it
    )


def _end(run: _Run, data: dict[str, Any], trial: Trial) -> None:
    builder = run.builder
    builder.tick()
    extra = object_of(data.get("extra"))
    stop = str(extra.get("stop_reason") or "terminal")
    known = [s for s in run.stamps if s is not None]
    runtime = (max(known) - min(known)) / 1e6 if known else 0.0
    submission = extra.get("submission")
    answered = [event for event, output in run.outputs if isinstance(submission, str) and output == submission]
    submitted = answered[-1] if answered else None
    # a patch no observation showed (the fleet's evaluator took it from the workspace) travels on session_end
    kept = submission if isinstance(submission, str) and submission and not submitted else None
    status = extra.get("status")
    if trial.exception:
        builder.end(exit_outcome(None, trial.exception), runtime, exit_reason(None, trial.exception))
    elif isinstance(status, str) and status:  # the run's own end, as a trajlake export records it
        builder.end(
            status, runtime, _str_or_none(extra.get("exit_reason")), submission_event=submitted, submission=kept
        )
    elif stop == "terminal":
        builder.end("completed", runtime, None, submission_event=submitted, submission=kept)
    else:
        reason = stop.removeprefix("truncated:")
        builder.end(
            "timeout" if "timeout" in reason else "capped", runtime, reason, submission_event=submitted, submission=kept
        )
    # the file's own verdict is a self-reported evaluation, never session_end's reward
    if trial.verdict is not None:
        builder.verdict(trial.verdict)
    else:
        claim = _claim(extra, str(builder.emitter.envelope["task_id"]), builder.issues)
        if claim is not None:
            builder.verdict(claim)


def convert(source: SourceFile, trial: Trial | None = None) -> list[ImportedSession]:
    """The session of one ATIF trajectory (a whole file, or one line of a JSON Lines export).

    Args:
        source: the trajectory.
        trial: what the Harbor trial it belongs to says about it (task, agent, exception, verdict).

    Raises:
        ImportFormatError: an unsupported version, a trajectory without a steps list or a user step with the task.
    """
    trial = trial or Trial()
    run = _begin(source, trial)
    for index, step in enumerate(run.steps):
        if step.get("source") != "agent":
            _on_context_step(run, step)
        elif step.get("is_copied_context") is True:
            _on_copied_step(run, step)
        else:
            _on_agent_step(run, index, step)
    _end(run, source.data, trial)
    return [run.builder.finish()]


__all__ = ["FRAMEWORK", "SUPPORTED_MINORS", "Trial", "content_text", "convert", "looks_like", "why_not"]
