"""Import Harbor's Agent Trajectory Interchange Format (ATIF v1.x, one trajectory per file).

Each agent step becomes one model call (schema v3 ``model_call``: the messages so far as the
request, the step's message, reasoning and tool calls as the reply, its metrics' token counts,
token ids and logprobs), one ``agent_action`` per tool call (the original ``tool_call_id``) and
one ``env_feedback`` per observation result. System and user steps are messages of the next
request; the first user step is the task statement. The trajectory's own ``session_id`` is kept,
so ``trajlake export --format atif`` writes the same trajectory back.
"""

from __future__ import annotations

import json
from typing import Any

from producers.importers._common import (
    ImportFormatError,
    JsonLines,
    RunBuilder,
    SourceFile,
    iso_micros,
    object_of,
    text_of,
)
from producers.sdk import Event

FRAMEWORK = "atif"


def looks_like(data: Any) -> bool:
    """Whether parsed JSON is an ATIF trajectory, or JSON Lines of them (``trajlake export --format atif``)."""
    if isinstance(data, JsonLines):
        return bool(data.records) and all(looks_like(record) for _, record in data.records)
    return isinstance(data, dict) and str(data.get("schema_version", "")).startswith("ATIF") and "steps" in data


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
        ImportFormatError: a trajectory without a steps list, a session id or a user step with the task.
    """
    if isinstance(source.data, JsonLines):
        return [e for sha, record in source.data.records for e in _convert(SourceFile(source.path, sha, record))]
    return _convert(source)


def _convert(source: SourceFile) -> list[Event]:
    data = source.data
    if not isinstance(data, dict):
        raise ImportFormatError(source.path, "an ATIF trajectory is a JSON object")
    steps = data.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ImportFormatError(source.path, "ATIF trajectory without a 'steps' list of objects")
    session_id = str(data.get("session_id") or "")
    if not session_id:
        raise ImportFormatError(source.path, "ATIF trajectory without a session_id")
    instruction = next((text_of(s.get("message")) for s in steps if s.get("source") == "user"), None)
    if instruction is None:
        raise ImportFormatError(source.path, "no user step with the task statement")
    agent = object_of(data.get("agent"))
    extra = object_of(data.get("extra"))
    tools = object_of(agent.get("extra")).get("tool_definitions") or None
    builder = RunBuilder(
        source,
        FRAMEWORK,
        str(data["schema_version"]),
        {
            "task_id": str(extra.get("task_id") or session_id),
            "task_type": str(extra.get("task_type") or "imported"),
            "image_version": str(data["schema_version"]),
            "agent_name": agent.get("name"),
            "agent_version": agent.get("version"),
            "agent_model": agent.get("model_name"),
            "policy_version": extra.get("policy_version"),
        },
        session_id=session_id,
    )
    stamps = [iso_micros(s["timestamp"]) if s.get("timestamp") else None for s in steps]
    builder.at(next((t for t in stamps if t is not None), None))
    builder.start(instruction, data.get("agent"), task_family=extra.get("task_family"))
    messages: list[dict[str, Any]] = []
    for index, step in enumerate(steps):
        source_name = step.get("source")
        text = text_of(step.get("message"))
        if source_name != "agent":
            role = "system" if source_name == "system" else "user"
            results = (object_of(step.get("observation")).get("results") or []) if source_name == "system" else []
            if results and not text:  # a tool result without an agent turn before it
                messages += [
                    {"role": "tool", "tool_call_id": r.get("source_call_id"), "content": text_of(r.get("content"))}
                    for r in results
                ]
            else:
                messages.append({"role": role, "content": text})
            continue
        builder.advance(stamps[index])
        metrics = object_of(step.get("metrics"))
        reply: dict[str, Any] = {"role": "assistant", "content": text}
        if step.get("reasoning_content"):
            reply["reasoning_content"] = step["reasoning_content"]
        calls = [_call(c) for c in step.get("tool_calls") or [] if isinstance(c, dict)]
        if calls:
            reply["tool_calls"] = calls
        usage = {
            "prompt_tokens": metrics.get("prompt_tokens"),
            "completion_tokens": metrics.get("completion_tokens"),
            "prompt_tokens_details": {"cached_tokens": metrics.get("cached_tokens")},
        }
        message_id = f"step-{step.get('step_id', index)}"
        record = builder.model_call(
            list(messages),
            reply,
            tools=tools,
            model=str(step.get("model_name") or ""),  # the agent's default model stays the agent's
            usage=usage,
            finish_reason=object_of(step.get("extra")).get("finish_reason"),
            prompt_token_ids=metrics.get("prompt_token_ids"),
            completion_token_ids=metrics.get("completion_token_ids"),
            logprobs=metrics.get("logprobs"),
            cost_usd=metrics.get("cost_usd"),
        )
        builder.emitter.agent_input(
            prompt_digest=record["request_sha256"],
            input_tokens=int(metrics.get("prompt_tokens") or 0),
            cached_tokens=int(metrics.get("cached_tokens") or 0),
            n_messages=len(messages),
            content=None,
            model_call=record,
            message_id=message_id,
        )
        messages.append(reply)
        results = {
            str(r.get("source_call_id")): text_of(r.get("content"))
            for r in object_of(step.get("observation")).get("results") or []
            if isinstance(r, dict)
        }
        for position, call in enumerate(calls):
            arguments = call["function"]["arguments"]
            parsed = json.loads(arguments)
            action_id = builder.action(
                call["function"]["name"],
                arguments,
                parsed.get("command") if isinstance(parsed, dict) else None,
                text or None,
                tool_call_id=call["id"],
                message_id=message_id,
                output_tokens=int(metrics.get("completion_tokens") or 0) if position == 0 else 0,
                cost_usd=float(metrics.get("cost_usd") or 0.0) if position == 0 else 0.0,
            )
            if call["id"] in results:
                builder.feedback(action_id, results[call["id"]], tool_call_id=call["id"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": results[call["id"]]})
    builder.tick()
    reward = extra.get("reward")
    stop = str(extra.get("stop_reason") or "terminal")
    payload = {
        "status": "completed" if stop == "terminal" else "timeout",
        "runtime_s": 0.0,
        "reward": float(reward) if isinstance(reward, int | float) else None,
        "exit_reason": stop.removeprefix("truncated:") if stop != "terminal" else None,
    }
    builder.emitter.emit("session_end", payload, "system")
    if isinstance(reward, int | float):
        builder.tick()
        builder.emitter.evaluation(
            passed=float(reward) >= 1.0,
            tests_total=0,
            tests_passed=0,
            reward=float(reward),
            fresh_sandbox=False,
            evaluator=f"imported:{FRAMEWORK}",
            duration_ms=0.0,
            details=None,
        )
    return builder.events
