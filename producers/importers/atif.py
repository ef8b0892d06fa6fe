"""Import Harbor's Agent Trajectory Interchange Format (ATIF v1.2 to v1.8, one trajectory per file or line).

Each agent step becomes one model call (schema v3 ``model_call``: the messages so far as the
request, the step's message, reasoning and tool calls as the reply, its metrics' token counts,
cost, token ids and logprobs, reasoning tokens), one ``agent_action`` per tool call (the original
``tool_call_id``) and one ``env_feedback`` per observation result. System and user steps are
messages of the next request; the first user step is the task statement.

Versions: v1.2 (system-step observations: a tool result without an agent turn), v1.3/v1.4
(completion/prompt token ids), v1.5 (``agent.tool_definitions``; earlier files of ours kept them
in ``agent.extra``), v1.6 (a message or result may be a list of content parts: text parts are
joined, an image or audio part becomes ``[image: path]``), v1.7 (``session_id`` optional — then
``trajectory_id``, else an id derived from the file —, ``llm_call_count``: an agent step of 0
calls is a deterministic dispatch, its actions recorded without a model call;
``is_copied_context`` steps are context, not new turns) and v1.8 (audio content parts).

What ``trajlake export --format atif`` writes is read back whole: the trajectory's own
``session_id``; the run's task, group, attempt, policy version, status, exit reason, the
evaluator's verdict and reward, submission and ``prompt_source`` (``extra``); each step's finish
reason, weights' version and engine (``extra``) and reasoning tokens (``metrics.extra``). So
export → import → export gives the same trajectory.
"""

from __future__ import annotations

import json
import re
from typing import Any

from producers.importers._common import (
    ImportFormatError,
    JsonLines,
    RunBuilder,
    SourceFile,
    iso_micros,
    object_of,
)
from producers.sdk import Event

FRAMEWORK = "atif"
#: ATIF versions this importer reads (minor versions of 1).
SUPPORTED_MINORS = range(0, 9)
_VERSION = re.compile(r"^ATIF-v1\.(\d+)$")
#: Step ``extra`` keys that go back into the model call's event (what the server said about itself).
_SERVED = ("engine", "dtype", "system_fingerprint")


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is an ATIF trajectory, or JSON Lines of them (``trajlake export --format atif``)."""
    if isinstance(data, JsonLines):
        return bool(data.records) and all(looks_like(record) for _, record in data.records)
    return isinstance(data, dict) and str(data.get("schema_version", "")).startswith("ATIF") and "steps" in data


def text(content: Any) -> str:
    """A message or observation content as text: a string, or its content parts (v1.6+) joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict):
                parts.append(str(part))
            elif part.get("type") == "text":
                parts.append(str(part.get("text") or ""))
            else:  # image (v1.6), audio (v1.8): the reference, not the media
                parts.append(f"[{part.get('type')}: {object_of(part.get('source')).get('path') or ''}]")
        return "\n".join(parts)
    return str(content)


def _call(tool_call: dict[str, Any]) -> dict[str, Any]:
    arguments = tool_call.get("arguments")
    return {
        "id": str(tool_call.get("tool_call_id") or ""),
        "type": "function",
        "function": {
            "name": str(tool_call.get("function_name") or ""),
            "arguments": json.dumps(arguments if arguments is not None else {}, sort_keys=True),
        },
    }


def convert(source: SourceFile) -> list[Event]:
    """All events of an ATIF file: one trajectory, or one per line of a JSON Lines file.

    Raises:
        ImportFormatError: an unsupported version, a trajectory without a steps list or a user step with the task.
    """
    if isinstance(source.data, JsonLines):
        return [e for sha, record in source.data.records for e in _convert(SourceFile(source.path, sha, record))]
    return _convert(source)


def _version(source: SourceFile, data: dict[str, Any]) -> int:
    found = _VERSION.match(str(data.get("schema_version") or ""))
    if found is None or int(found.group(1)) not in SUPPORTED_MINORS:
        raise ImportFormatError(
            source.path, f"unsupported ATIF version {data.get('schema_version')!r} (reads ATIF-v1.0 to v1.8)"
        )
    return int(found.group(1))


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _convert(source: SourceFile) -> list[Event]:
    data = source.data
    if not isinstance(data, dict):
        raise ImportFormatError(source.path, "an ATIF trajectory is a JSON object")
    minor = _version(source, data)
    steps = data.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ImportFormatError(source.path, "ATIF trajectory without a 'steps' list of objects")
    session_id = str(data.get("session_id") or data.get("trajectory_id") or "") or None
    if minor < 7 and not data.get("session_id"):
        raise ImportFormatError(source.path, "ATIF trajectory without a session_id (required before v1.7)")
    instruction = next((text(s.get("message")) for s in steps if s.get("source") == "user"), None)
    if instruction is None:
        raise ImportFormatError(source.path, "no user step with the task statement")
    agent = object_of(data.get("agent"))
    extra = object_of(data.get("extra"))
    tools = agent.get("tool_definitions") or object_of(agent.get("extra")).get("tool_definitions") or None
    builder = RunBuilder(
        source,
        FRAMEWORK,
        str(data["schema_version"]),
        {
            "task_id": str(extra.get("task_id") or session_id or source.sha256[:32]),
            "task_type": str(extra.get("task_type") or "imported"),
            "image_version": str(data["schema_version"]),
            "agent_name": agent.get("name"),
            "agent_version": agent.get("version"),
            "agent_model": agent.get("model_name"),
            "policy_version": extra.get("policy_version"),
        },
        session_id=session_id,
    )
    group = {"group_id": extra.get("group_id"), "attempt": _int(extra.get("attempt"))}
    if any(v is not None for v in group.values()):
        builder.emitter.envelope.update(group)
    if extra.get("prompt_source") in ("recorded", "reconstructed"):  # how the conversation was first obtained
        builder.emitter.envelope["extra"]["prompt_source"] = str(extra["prompt_source"])
    stamps = [iso_micros(s["timestamp"]) if isinstance(s.get("timestamp"), str) else None for s in steps]
    builder.at(next((t for t in stamps if t is not None), None))
    builder.start(instruction, data.get("agent"), task_family=extra.get("task_family"))
    messages: list[dict[str, Any]] = []
    outputs: dict[str, str] = {}  # feedback event id -> output (the submission is one of them)
    for index, step in enumerate(steps):
        source_name = step.get("source")
        message = text(step.get("message"))
        calls = [_call(c) for c in step.get("tool_calls") or [] if isinstance(c, dict)]
        results = [r for r in object_of(step.get("observation")).get("results") or [] if isinstance(r, dict)]
        if source_name != "agent" or step.get("is_copied_context"):
            if source_name == "agent":  # context copied from an earlier trajectory: a message, not a turn
                messages.append(_reply(step, message, calls))
            elif results and not message:  # a tool result without an agent turn before it
                messages += [
                    {"role": "tool", "tool_call_id": r.get("source_call_id"), "content": text(r.get("content"))}
                    for r in results
                ]
            else:
                messages.append({"role": "system" if source_name == "system" else "user", "content": message})
            continue
        builder.advance(stamps[index])
        metrics = object_of(step.get("metrics"))
        step_extra = object_of(step.get("extra"))
        reply = _reply(step, message, calls)
        message_id = f"step-{step.get('step_id', index)}"
        first_output, first_cost = int(metrics.get("completion_tokens") or 0), float(metrics.get("cost_usd") or 0.0)
        if step.get("llm_call_count") != 0:  # 0: a deterministic dispatch, no model call behind it
            _model_call(builder, messages, reply, tools, step, metrics, step_extra, message_id)
        messages.append(reply)
        by_call = {str(r.get("source_call_id")): text(r.get("content")) for r in results}
        for position, call in enumerate(calls):
            arguments = call["function"]["arguments"]
            parsed = json.loads(arguments)
            action_id = builder.action(
                call["function"]["name"],
                arguments,
                parsed.get("command") if isinstance(parsed, dict) else None,
                message or None,
                tool_call_id=call["id"],
                message_id=message_id,
                output_tokens=first_output if position == 0 else 0,
                cost_usd=first_cost if position == 0 else 0.0,
            )
            if call["id"] in by_call:
                feedback = builder.feedback(action_id, by_call[call["id"]], tool_call_id=call["id"])
                outputs[feedback] = by_call[call["id"]]
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": by_call[call["id"]]})
    _end(builder, extra, outputs)
    return builder.events


def _reply(step: dict[str, Any], message: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    reply: dict[str, Any] = {"role": "assistant", "content": message}
    if step.get("reasoning_content"):
        reply["reasoning_content"] = step["reasoning_content"]
    if calls:
        reply["tool_calls"] = calls
    return reply


def _model_call(
    builder: RunBuilder,
    messages: list[dict[str, Any]],
    reply: dict[str, Any],
    tools: Any,
    step: dict[str, Any],
    metrics: dict[str, Any],
    step_extra: dict[str, Any],
    message_id: str,
) -> None:
    """The step's model call: its request (the messages so far), reply, usage and ids, as one ``agent_input``."""
    usage = {
        "prompt_tokens": metrics.get("prompt_tokens"),
        "completion_tokens": metrics.get("completion_tokens"),
        "prompt_tokens_details": {"cached_tokens": metrics.get("cached_tokens")},
        "completion_tokens_details": {"reasoning_tokens": object_of(metrics.get("extra")).get("reasoning_tokens")},
    }
    cost = metrics.get("cost_usd")
    record = builder.model_call(
        list(messages),
        reply,
        tools=tools,
        model=str(step.get("model_name") or ""),  # the agent's default model stays the agent's
        usage=usage,
        finish_reason=step_extra.get("finish_reason"),
        prompt_token_ids=metrics.get("prompt_token_ids"),
        completion_token_ids=metrics.get("completion_token_ids"),
        logprobs=metrics.get("logprobs"),
        cost_usd=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
    )
    served = {k: str(v) for k, v in object_of(step_extra.get("engine")).items() if k in _SERVED and v is not None}
    if step_extra.get("policy_version") is not None:
        served["policy_version"] = str(step_extra["policy_version"])
    builder.emitter.agent_input(
        prompt_digest=record["request_sha256"],
        input_tokens=int(metrics.get("prompt_tokens") or 0),
        cached_tokens=int(metrics.get("cached_tokens") or 0),
        n_messages=len(messages),
        content=None,
        model_call=record,
        message_id=message_id,
        extra=served or None,
    )


def _end(builder: RunBuilder, extra: dict[str, Any], outputs: dict[str, str]) -> None:
    """``session_end`` (the run's own status and exit reason when the file carries them) and the verdict."""
    builder.tick()
    reward = extra.get("reward")
    reward = float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else None
    stop = str(extra.get("stop_reason") or "terminal")
    if extra.get("status"):  # the run's own end, as a trajlake export records it
        status, reason = str(extra["status"]), extra.get("exit_reason")
    else:
        status = "completed" if stop == "terminal" else "timeout"
        reason = stop.removeprefix("truncated:") if stop != "terminal" else None
    submission = extra.get("submission")
    answered = [event for event, output in outputs.items() if submission and output == submission]
    payload = {"status": status, "runtime_s": 0.0, "reward": reward, "exit_reason": reason}
    builder.emitter.emit(
        "session_end", payload, "system", extra={"submission_event_id": answered[-1]} if answered else None
    )
    passed = extra.get("eval_passed")
    if isinstance(passed, bool) or reward is not None:
        builder.tick()
        builder.emitter.evaluation(
            passed=passed if isinstance(passed, bool) else bool(reward is not None and reward >= 1.0),
            tests_total=0,
            tests_passed=0,
            reward=reward if reward is not None else float(bool(passed)),
            fresh_sandbox=False,
            evaluator=f"imported:{FRAMEWORK}",
            duration_ms=0.0,
            details=None,
        )
