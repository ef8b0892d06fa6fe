"""The records of one session in each export format (hf, openai, sharegpt, rl, atif).

Every record of hf, openai, sharegpt and rl carries the same metadata (:func:`metadata`): quality,
outcome, flags with class and severity, the down-weighting the governance table applies, group,
attempt, policy version, task family, split, ``prompt_source`` and the session's ``usage``
(prompt, cached and completion tokens and the cost, priced like the ``trajectories`` view), so a
trainer can choose what to keep. ``rl`` is built by :mod:`pipelines.export.rl` (one record per
segment), ``atif`` by :mod:`pipelines.export.atif` (the trajectory, with this lake's judgement in
a file of its own); :mod:`pipelines.export.records` chooses among them.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from common.prices import PriceTable, exact_cost
from pipelines.export.conversation import Call, Conversation, tool_spec
from producers.fleet.agent_caps import CAP_REASONS

FORMATS = ("hf", "openai", "sharegpt", "rl", "atif")
#: exit reasons that truncate an episode (a cap hit), as ``stop_reason = "truncated:<cap>"``: every cap
#: of the fleet's agents (a new cap truncates too), an imported run's limits
TRUNCATING = frozenset({*CAP_REASONS, "timeout", "max_turns"})


def call_cost(call: Call, prices: PriceTable) -> Decimal:
    """The cost of one model call: what the server (or a simulator) recorded, else its tokens priced.

    Exact to 12 decimal places, as the ``trajectories`` view computes it (:mod:`warehouse.prices`).
    """
    if call.cost_usd is not None:
        return exact_cost(call.cost_usd)
    return prices.cost(call.priced_model, call.prompt_tokens, call.cached_tokens, call.completion_tokens)


def usage(session: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """The session's token and cost totals (the ``trajectories`` row) and how many model calls it made."""
    return {
        "input_tokens": session.get("input_tokens"),
        "cached_tokens": session.get("cached_tokens"),
        "output_tokens": session.get("output_tokens"),
        "cost_usd": session.get("cost_usd"),
        "model_calls": len(conversation.calls),
    }


def prompt_source(session: dict[str, Any], conversation: Conversation) -> str:
    """``recorded`` or ``reconstructed``: how the conversation was first obtained (an import keeps the original's)."""
    carried = session.get("carried_prompt_source")
    return str(carried) if carried in ("recorded", "reconstructed") else conversation.prompt_source


def metadata(session: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """Fields every record carries: identity, grouping, split, outcome, quality, flags and usage."""
    return {
        "session_id": session["session_id"],
        "task_id": session["task_id"],
        "task_type": session["task_type"],
        "task_family": session.get("task_family"),
        "split": session.get("split"),
        # where the session came from: sandbox, sdk, otlp, import:<format> (synthetic only when asked for)
        "origin": session.get("origin"),
        "group_id": session.get("group_id"),
        "attempt": session.get("attempt"),
        "policy_version": session.get("policy_version"),
        "agent_model": session.get("agent_model"),
        "prompt_source": prompt_source(session, conversation),
        "outcome": session.get("outcome"),
        "quality": session["quality"],
        "completion": session["completion"],
        # suspicions travel with the record (down-weighted, not dropped): the consumer decides
        "weight": session.get("weight", 1.0),
        "flags": session.get("flag_list") or [],
        "submission": session.get("submission"),
        "usage": usage(session, conversation),
    }


def strip_nulls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


#: Tool calls that end a session (the agent hands its work in): ``submit`` (the fleet's agents, SWE-agent),
#: ``finish`` (OpenHands).
ENDING_TOOLS = frozenset({"submit", "finish"})
#: The ``submit`` tool as the LLM agent defines it (what a rebuilt session's final turn calls).
SUBMIT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Finish: the workspace is handed to the evaluator.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def sft_messages(
    session: dict[str, Any], conversation: Conversation
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The messages and tools of a supervised example: ending on the agent's last assistant turn.

    Tool results after the last assistant turn are dropped (a model learns nothing from them and a
    trainer's last turn must be the model's). A session the agent ended itself (``terminal``) whose
    rebuilt conversation has no ending call (a scripted or user agent that just returned: nothing
    recorded its hand-in) gets the ``submit`` call that stood for it, so a model learns to finish;
    a session a cap cut short ends on its last real turn. Every tool a message calls is defined in
    ``tools`` (a name the recorded list lacks gets a stand-in definition).
    """
    messages = [dict(m) for m in conversation.messages]
    while messages and messages[-1]["role"] == "tool":
        messages.pop()
    tools = [dict(t) for t in conversation.tools]
    defined = {str((t.get("function") or {}).get("name")) for t in tools}
    last = messages[-1] if messages else None
    ended = any(c["function"]["name"] in ENDING_TOOLS for c in ((last or {}).get("tool_calls") or [])) or (
        last is not None and last["role"] == "assistant" and not last.get("tool_calls")
    )
    if not ended and stop_reason(session, conversation) == "terminal" and conversation.prompt_source == "reconstructed":
        call = {"id": "call_submit", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
        messages.append(
            {"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": [call], "tool_call_id": None}
        )
    for m in messages:
        for c in m.get("tool_calls") or []:
            name = c["function"]["name"]
            if name not in defined:
                tools.append(SUBMIT_TOOL if name == "submit" else tool_spec(name))
                defined.add(name)
    return messages, tools


def stop_reason(session: dict[str, Any], conversation: Conversation) -> str:
    """``terminal`` or ``truncated:<cap>`` (a cap of the fleet, or the model's ``length`` finish)."""
    reason = str(session.get("exit_reason") or "")
    if reason in TRUNCATING or session.get("status") in ("timeout", "capped"):
        return f"truncated:{reason or 'timeout'}"
    if conversation.calls and conversation.calls[-1].finish_reason == "length":
        return "truncated:length"
    return "terminal"


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


def arguments_object(text: str) -> Any:
    """A tool call's JSON arguments as an object (``{"_raw": text}`` when they are not JSON)."""
    try:
        parsed = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return {"_raw": text}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def sharegpt_conversations(conversation: Conversation) -> list[dict[str, str]]:
    """The ShareGPT ``conversations`` list (a tool call is a ``function_call`` turn)."""
    conversations = []
    for m in conversation.messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            if m.get("content") or m.get("reasoning_content"):
                conversations.append({"from": "gpt", "value": m.get("content") or ""})
            for call in m["tool_calls"]:
                value = {"name": call["function"]["name"], "arguments": arguments_object(call["function"]["arguments"])}
                conversations.append({"from": "function_call", "value": json.dumps(value, sort_keys=True)})
        else:
            role = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}[m["role"]]
            conversations.append({"from": role, "value": m.get("content") or ""})
    return conversations
