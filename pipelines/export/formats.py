"""The record of one session in each export format (hf, openai, sharegpt, rl, atif).

Every record carries the same metadata (:func:`metadata`): quality, flags with class and severity,
the down-weighting the governance table applies, group, attempt, policy version, task family,
split and ``prompt_source``, so a trainer can choose what to keep.

``rl`` is token level where the session's model calls recorded token ids (verl's agent-loop
output / SkyRL's trajectory output): ``prompt_ids`` (the first call's prompt), ``response_ids``
(each completion, then the tool/environment tokens the next prompt appended), ``response_mask`` and
its SkyRL name ``loss_mask`` (1 sampled, 0 tool/environment), ``logprobs`` (verl
``response_logprobs``, SkyRL ``rollout_logprobs``; 0.0 under mask 0). Ids are never re-tokenized:
a session without ids, or whose next prompt does not extend the previous prompt and completion
(a chat template that rewrote history), has ``has_token_ids = false`` and empty id lists; its
messages are in ``messages``.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from pipelines.errors import ExportError, RecordError
from pipelines.export.conversation import Conversation

FORMATS = ("hf", "openai", "sharegpt", "rl", "atif")
ATIF_VERSION = "ATIF-v1.4"
#: exit reasons that truncate an episode (a cap hit), as ``stop_reason = "truncated:<cap>"``
TRUNCATING = frozenset({"max_steps", "max_model_tokens", "max_cost_usd", "deadline", "timeout", "max_turns"})

_TOOL_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("reasoning_content", pa.string()),
        ("tool_calls", pa.list_(_TOOL_CALL)),
        ("tool_call_id", pa.string()),
    ]
)
_FLAG = pa.struct(
    [("flag", pa.string()), ("flag_class", pa.string()), ("severity", pa.string()), ("weight", pa.float64())]
)
#: The Parquet schema of ``rl`` records (names and dtypes as verl/SkyRL read them; metadata after).
RL_SCHEMA = pa.schema(
    [
        ("prompt_ids", pa.list_(pa.int64())),
        ("response_ids", pa.list_(pa.int64())),
        ("response_mask", pa.list_(pa.int64())),
        ("loss_mask", pa.list_(pa.int64())),
        ("logprobs", pa.list_(pa.float64())),
        ("has_token_ids", pa.bool_()),
        ("reward", pa.float64()),
        ("step_rewards", pa.list_(pa.float64())),
        ("num_turns", pa.int64()),
        ("stop_reason", pa.string()),
        ("messages", pa.list_(_MESSAGE)),
        ("tools", pa.string()),
        ("submission", pa.string()),
        ("session_id", pa.string()),
        ("task_id", pa.string()),
        ("task_type", pa.string()),
        ("task_family", pa.string()),
        ("split", pa.string()),
        ("group_id", pa.string()),
        ("attempt", pa.int64()),
        ("policy_version", pa.string()),
        ("agent_model", pa.string()),
        ("prompt_source", pa.string()),
        ("quality", pa.float64()),
        ("completion", pa.float64()),
        ("weight", pa.float64()),
        ("flags", pa.list_(_FLAG)),
    ]
)


def metadata(session: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """Fields every record carries: identity, grouping, split, quality and flags."""
    return {
        "session_id": session["session_id"],
        "task_id": session["task_id"],
        "task_type": session["task_type"],
        "task_family": session.get("task_family"),
        "split": session.get("split"),
        "group_id": session.get("group_id"),
        "attempt": session.get("attempt"),
        "policy_version": session.get("policy_version"),
        "agent_model": session.get("agent_model"),
        "prompt_source": conversation.prompt_source,
        "quality": session["quality"],
        "completion": session["completion"],
        # suspicions travel with the record (down-weighted, not dropped): the consumer decides
        "weight": session.get("weight", 1.0),
        "flags": session.get("flag_list") or [],
        "submission": session.get("submission"),
    }


def _strip_nulls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def stop_reason(session: dict[str, Any], conversation: Conversation) -> str:
    """``terminal`` or ``truncated:<cap>`` (a cap of the fleet, or the model's ``length`` finish)."""
    reason = str(session.get("exit_reason") or "")
    if reason in TRUNCATING or session.get("status") == "timeout":
        return f"truncated:{reason or 'timeout'}"
    if conversation.calls and conversation.calls[-1].finish_reason == "length":
        return "truncated:length"
    return "terminal"


def token_sequences(conversation: Conversation) -> tuple[list[int], list[int], list[int], list[float]] | None:
    """(prompt_ids, response_ids, response_mask, logprobs) from the recorded ids, or None.

    None when a call has no ids or a prompt does not start with the previous prompt + completion.
    """
    calls = conversation.calls
    if not calls or any(c.prompt_token_ids is None or not c.completion_token_ids for c in calls):
        return None
    prompt = list(calls[0].prompt_token_ids or [])
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    context = list(prompt)
    for i, call in enumerate(calls):
        if len(call.logprobs) not in (0, len(call.completion_token_ids)):
            return None
        if i:
            ids = call.prompt_token_ids or []
            if ids[: len(context)] != context:
                return None
            observed = ids[len(context) :]  # what the tools and the chat template added: not sampled
            response += observed
            mask += [0] * len(observed)
            logprobs += [0.0] * len(observed)
            context = list(ids)
        response += call.completion_token_ids
        mask += [1] * len(call.completion_token_ids)
        logprobs += call.logprobs or [0.0] * len(call.completion_token_ids)
        context += call.completion_token_ids
    return prompt, response, mask, logprobs


def episode_reward(session: dict[str, Any]) -> float | None:
    """The reward an RL trainer gets: the scored completion (a verdict a flag voided is 0), None when never evaluated.

    Never the evaluator's raw reward: a cheat that forged its verdict would be rewarded. A session
    nobody evaluated has no reward at all (0 would teach the policy that an honest run failed).
    """
    unevaluated = session.get("failure_cause") == "unevaluated" or (
        "eval_passed" in session and session.get("eval_passed") is None and session.get("reward") is None
    )
    if unevaluated or session.get("completion") is None:
        return None
    return float(session["completion"])


def rl_record(session: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """The ``rl`` record: token level when ids were recorded, else message form with ``has_token_ids = false``."""
    tokens = token_sequences(conversation)
    prompt, response, mask, logprobs = tokens or ([], [], [], [])
    reward = episode_reward(session)
    if reward is None:
        raise RecordError("no_reward", "the session was never evaluated: an RL record needs a reward")
    turns = len(conversation.calls) or sum(1 for m in conversation.messages if m["role"] == "assistant")
    return {
        "prompt_ids": prompt,
        "response_ids": response,
        "response_mask": mask,
        "loss_mask": mask,
        "logprobs": logprobs,
        "has_token_ids": tokens is not None,
        "reward": reward,
        # sparse: the episode reward on the last turn (the evaluator scores the episode, not the turns)
        "step_rewards": [0.0] * (turns - 1) + [reward] if turns else [],
        "num_turns": turns,
        "stop_reason": stop_reason(session, conversation),
        "messages": conversation.messages,
        "tools": json.dumps(conversation.tools, sort_keys=True),
        **metadata(session, conversation),
    }


def _arguments_object(text: str) -> Any:
    try:
        parsed = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return {"_raw": text}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def atif_record(session: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """The session as one ATIF v1.4 trajectory (Harbor's Agent Trajectory Interchange Format)."""
    steps: list[dict[str, Any]] = []
    assistant = 0
    for m in conversation.messages:
        if m["role"] == "tool":
            if steps and steps[-1]["source"] == "agent":
                results = steps[-1].setdefault("observation", {"results": []})["results"]
                results.append({"source_call_id": m.get("tool_call_id"), "content": m.get("content") or ""})
                continue
            source = "system"  # a tool message with no agent turn before it: kept as a system observation
        else:
            source = {"system": "system", "user": "user", "assistant": "agent"}.get(m["role"], "user")
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": source, "message": m.get("content") or ""}
        if source == "agent":
            when = conversation.assistant_times[assistant] if assistant < len(conversation.assistant_times) else None
            if when:
                step["timestamp"] = when
            if m.get("reasoning_content"):
                step["reasoning_content"] = m["reasoning_content"]
            if m.get("tool_calls"):
                step["tool_calls"] = [
                    {
                        "tool_call_id": c["id"],
                        "function_name": c["function"]["name"],
                        "arguments": _arguments_object(c["function"]["arguments"]),
                    }
                    for c in m["tool_calls"]
                ]
            if assistant < len(conversation.calls):
                call = conversation.calls[assistant]
                if call.model:
                    step["model_name"] = call.model
                metrics = {
                    "prompt_tokens": call.prompt_tokens,
                    "completion_tokens": call.completion_tokens,
                    "cached_tokens": call.cached_tokens,
                    "cost_usd": call.cost_usd,
                    "prompt_token_ids": call.prompt_token_ids,
                    "completion_token_ids": call.completion_token_ids or None,
                    "logprobs": call.logprobs or None,
                }
                if any(v is not None for v in metrics.values()):
                    step["metrics"] = {k: v for k, v in metrics.items() if v is not None}
                if call.finish_reason:
                    step["extra"] = {"finish_reason": call.finish_reason}
            assistant += 1
        elif m["role"] == "tool":
            step["observation"] = {"results": [{"source_call_id": m.get("tool_call_id"), "content": step["message"]}]}
            step["message"] = ""
        steps.append(step)
    calls = conversation.calls
    final = {
        "total_prompt_tokens": sum(c.prompt_tokens or 0 for c in calls) if calls else session.get("input_tokens"),
        "total_completion_tokens": sum(c.completion_tokens or 0 for c in calls)
        if calls
        else session.get("output_tokens"),
        "total_cached_tokens": sum(c.cached_tokens or 0 for c in calls) if calls else session.get("cached_tokens"),
        "total_cost_usd": session.get("cost_usd"),
        "total_steps": len(steps),
    }
    meta = metadata(session, conversation)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": session["session_id"],
        "agent": {
            "name": session.get("agent_name") or "unknown",
            "version": session.get("agent_version") or "unknown",
            "model_name": session.get("agent_model"),
            "extra": {"tool_definitions": conversation.tools},
        },
        "steps": steps,
        "final_metrics": {k: v for k, v in final.items() if v is not None},
        "extra": {
            "reward": episode_reward(session),
            "stop_reason": stop_reason(session, conversation),
            **{k: v for k, v in meta.items() if k != "session_id"},
        },
    }


def to_record(fmt: str, session: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """One record of ``session`` in format ``fmt`` (text fields redacted by the caller).

    Raises:
        ExportError: an unknown format.
    """
    meta = metadata(session, conversation)
    if fmt == "hf":
        return {"messages": conversation.messages, "tools": json.dumps(conversation.tools, sort_keys=True), **meta}
    if fmt == "openai":
        return {"messages": _strip_nulls(conversation.messages), "tools": conversation.tools, **meta}
    if fmt == "sharegpt":
        conversations = []
        for m in conversation.messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                if m.get("content") or m.get("reasoning_content"):
                    conversations.append({"from": "gpt", "value": m.get("content") or ""})
                for call in m["tool_calls"]:
                    value = {
                        "name": call["function"]["name"],
                        "arguments": _arguments_object(call["function"]["arguments"]),
                    }
                    conversations.append({"from": "function_call", "value": json.dumps(value, sort_keys=True)})
            else:
                role = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}[m["role"]]
                conversations.append({"from": role, "value": m.get("content") or ""})
        return {"conversations": conversations, "tools": json.dumps(conversation.tools, sort_keys=True), **meta}
    if fmt == "rl":
        return rl_record(session, conversation)
    if fmt == "atif":
        return atif_record(session, conversation)
    raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
