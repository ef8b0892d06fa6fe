"""One session as the model saw it: the exact messages and tools of its recorded model calls, else rebuilt from steps.

Recorded (``prompt_source = "recorded"``): the session's ``model_call`` records (schema v3; the
live LLM agent and the importers of runs that keep their chat write them) are rebuilt with
:func:`producers.fleet.llm.record.reconstruct`: the last request's messages followed by the last
reply are the whole conversation, system prompt, tool definitions, reasoning and original
tool-call ids included, and each call keeps its token ids and logprobs as the server returned them.

Reconstructed (``prompt_source = "reconstructed"``): nothing was recorded (synthetic fleet
sessions, OpenHands event lists), so the conversation is rebuilt from the ``steps`` table with a
stand-in system prompt and tool list; an agent reply (a ``message`` action) is an assistant
message, not a call to a tool named ``message``; the original tool-call ids are kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines.errors import RecordError
from producers.fleet.llm.record import reconstruct

#: Stand-ins used only when a session recorded no model call (``prompt_source = "reconstructed"``).
SYSTEM_PROMPT = "You are an agent working in a sandbox. Use the tools to complete the task."
TOOLS = ("bash", "read_file", "write_file", "run_tests")
#: Tool names that are the agent talking, not acting (OpenHands' ``message``/``finish`` actions).
REPLY_TOOLS = frozenset({"message"})


@dataclass
class Call:
    """One successful model call of a session (the token-level facts an RL trainer needs), or, for a
    session that recorded none, one agent turn rebuilt from its step (no ids, its usage as recorded)."""

    call_index: int
    model: str | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    cost_usd: float | None  # as recorded: a cost the server (or the simulator) reported, else None
    timestamp: str | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int]
    logprobs: list[float]
    latency_ms: float | None = None
    reasoning_tokens: int | None = None
    #: the model the price table prices it by: the one the request named, else the one that answered
    priced_model: str | None = None
    #: the weights' version that sampled it (what the server reported, else the session's policy version)
    policy_version: str | None = None
    #: the sampling engine as the server described it (engine, dtype, system_fingerprint; model)
    engine: dict[str, str] = field(default_factory=dict)


@dataclass
class Conversation:
    """A session's messages (OpenAI chat shape), tools, calls and where the prompt came from."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    prompt_source: str
    calls: list[Call] = field(default_factory=list)
    #: per assistant message: the time of its step/call (ATIF timestamps), None when unknown
    assistant_times: list[str | None] = field(default_factory=list)
    #: a reconstructed session's turns (one per step: its recorded usage; no token ids)
    turns: list[Call] = field(default_factory=list)

    @property
    def usage_turns(self) -> list[Call]:
        """The turns whose usage the session's totals sum: its model calls, else its rebuilt turns."""
        return self.calls or self.turns


def message(
    role: str,
    content: Any,
    *,
    reasoning_content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str | None = None,
) -> dict[str, Any]:
    """A message with the fixed key set every format starts from (one Arrow type per column in ``datasets``)."""
    return {
        "role": role,
        "content": content if isinstance(content, str) or content is None else json.dumps(content),
        "reasoning_content": reasoning_content,
        "tool_calls": tool_calls,
        "tool_call_id": tool_call_id,
    }


def _normalized(raw: Mapping[str, Any]) -> dict[str, Any]:
    calls = raw.get("tool_calls") or None
    if calls:
        calls = [
            {
                "id": str(c.get("id") or ""),
                "type": str(c.get("type") or "function"),
                "function": {
                    "name": str((c.get("function") or {}).get("name") or ""),
                    "arguments": (c.get("function") or {}).get("arguments") or "{}",
                },
            }
            for c in calls
        ]
    content = raw.get("content")
    return message(
        str(raw.get("role") or "user"),
        content if content is not None else "",
        reasoning_content=raw.get("reasoning_content") or None,
        tool_calls=calls,
        tool_call_id=raw.get("tool_call_id") or None,
    )


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return text.replace("+00:00", "Z")


def from_calls(
    records: list[dict[str, Any]],
    lookup: Callable[[Iterable[str]], dict[str, str]],
    steps: list[dict[str, Any]] | None = None,
    agent_model: str | None = None,
) -> Conversation | None:
    """The recorded conversation of one session, or None when it has no successful call.

    The last reply's tool calls were answered after the last request, so their results (no
    request holds them) come from the session's steps, matched by tool-call id.

    Args:
        records: the session's ``model_call`` records, each with ``_ts`` (event time), ``_policy_version``
            and ``_served`` (what the server said about itself: the agent_input event's extra) added.
        lookup: sha256 refs → blob texts for refs whose blob another session emitted.
        steps: the session's steps (text fields redacted), for the results of the last reply's calls.
        agent_model: the session's model (what prices a call whose record names none).

    Raises:
        RecordError: a blob is missing everywhere or a rebuilt request does not match its sha256.
    """
    ok = sorted((r for r in records if r.get("status") == "ok"), key=lambda r: r["call_index"])
    if not ok:
        return None
    own = {b["sha256"] for r in records for b in r.get("blobs") or []}
    wanted = {ref for r in ok for ref in r.get("new_messages") or []}
    wanted |= {r[k] for r in ok for k in ("tools_sha256", "response_message_sha256") if r.get(k)}
    blobs = lookup(sorted(wanted - own))
    texts = {**blobs, **{b["sha256"]: b["text"] for r in records for b in r.get("blobs") or []}}
    try:
        rebuilt = reconstruct(records, blobs)
        last_reply = json.loads(texts[ok[-1]["response_message_sha256"]])
    except KeyError as exc:
        raise RecordError("missing_blob", f"model-call content {exc.args[0]} is in no event") from None
    except ValueError as exc:
        raise RecordError("bad_model_call", str(exc)) from exc
    messages = [_normalized(m) for m in [*rebuilt[-1].messages, last_reply]]
    _restore_reasoning(messages, [texts.get(r.get("response_message_sha256") or "") for r in ok])
    # a call the environment answered (a step with feedback); one it never answered (submit) has no result
    outputs = {
        step["tool_call_id"]: step["output"]
        for step in steps or []
        if step.get("tool_call_id") and step.get("output") is not None
    }
    for call in messages[-1]["tool_calls"] or []:
        if call["id"] in outputs:
            messages.append(message("tool", outputs[call["id"]], tool_call_id=call["id"]))
    calls = [
        Call(
            call_index=r["call_index"],
            model=r.get("response_model") or r.get("model"),
            finish_reason=r.get("finish_reason"),
            prompt_tokens=r.get("prompt_tokens"),
            completion_tokens=r.get("completion_tokens"),
            cached_tokens=r.get("cached_tokens"),
            cost_usd=r.get("cost_usd"),
            timestamp=_iso(r.get("_ts")),
            prompt_token_ids=c.prompt_token_ids,
            completion_token_ids=c.completion_token_ids,
            logprobs=c.completion_logprobs,
            latency_ms=r.get("latency_ms"),
            reasoning_tokens=r.get("reasoning_tokens"),
            priced_model=r.get("model") or r.get("response_model") or agent_model or "",
            policy_version=r.get("_policy_version"),
            engine={
                k: str(v)
                for k, v in {"model": r.get("response_model"), **(r.get("_served") or {})}.items()
                if v not in (None, "")
            },
        )
        for r, c in zip(ok, rebuilt, strict=True)
    ]
    return Conversation(
        messages=messages,
        tools=list(rebuilt[-1].tools or []),
        prompt_source="recorded",
        calls=calls,
        assistant_times=[c.timestamp for c in calls],
    )


def _restore_reasoning(messages: list[dict[str, Any]], replies: list[str | None]) -> None:
    """Give each assistant message the reasoning its call's reply had (in place).

    An agent sends a reasoning model's earlier replies back without their reasoning, so the last
    request holds them bare; the replies themselves were recorded whole. The k-th assistant
    message takes the k-th reply's reasoning when it is that reply (same content and tool calls).
    """
    assistants = [m for m in messages if m["role"] == "assistant"]
    if len(assistants) != len(replies):
        return  # a rewritten history (a summary, a dropped turn): no safe pairing
    for current, raw in zip(assistants, replies, strict=True):
        if raw is None or current["reasoning_content"]:
            continue
        reply = _normalized(json.loads(raw))
        if reply["reasoning_content"] and {**reply, "reasoning_content": None} == current:
            current["reasoning_content"] = reply["reasoning_content"]


def tool_spec(name: str) -> dict[str, Any]:
    """A stand-in definition of a sandbox tool (only when no definition was recorded)."""
    params = {
        "bash": {"command": {"type": "string"}},
        "read_file": {"path": {"type": "string"}},
        "write_file": {"path": {"type": "string"}, "content": {"type": "string"}},
        "run_tests": {"command": {"type": "string"}},
    }.get(name, {"command": {"type": "string"}})
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The sandbox's {name} tool.",
            "parameters": {"type": "object", "properties": params, "required": sorted(params)},
        },
    }


def from_steps(
    session: Mapping[str, Any], steps: list[dict[str, Any]], arguments: Callable[[dict[str, Any]], str]
) -> Conversation:
    """The conversation rebuilt from the steps table (nothing recorded), stand-in system prompt and tools.

    Args:
        session: the session row (``instruction``).
        steps: its steps in order (text fields redacted).
        arguments: step → normalized, redacted arguments JSON.
    """
    messages = [message("system", SYSTEM_PROMPT), message("user", session.get("instruction") or "")]
    times: list[str | None] = []
    turns: list[Call] = []
    used: set[str] = set()
    for i, step in enumerate(steps):
        name = step.get("tool_name") or "bash"
        times.append(_iso(step.get("ts")))
        turns.append(_turn(i, session, step))
        if name in REPLY_TOOLS:  # the agent talking: its words are the assistant's content
            parsed = json.loads(arguments(step))
            text = parsed.get("content") or parsed.get("message") or step.get("thought") or ""
            messages.append(message("assistant", str(text), reasoning_content=None))
            continue
        used.add(name)
        call_id = step.get("tool_call_id") or f"call_{i}"
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments(step)}}
        messages.append(message("assistant", step.get("thought") or "", tool_calls=[call]))
        messages.append(message("tool", step.get("output") or "", tool_call_id=call_id))
    return Conversation(
        messages=messages,
        tools=[tool_spec(t) for t in sorted(used | set(TOOLS))],
        prompt_source="reconstructed",
        assistant_times=times,
        turns=turns,
    )


def _turn(index: int, session: Mapping[str, Any], step: Mapping[str, Any]) -> Call:
    """A step's turn as recorded: its model input (on the first action of its model message), output and cost."""
    return Call(
        call_index=index,
        model=None,
        finish_reason=None,
        prompt_tokens=step.get("input_tokens"),
        completion_tokens=step.get("output_tokens"),
        cached_tokens=step.get("cached_tokens"),
        cost_usd=step.get("cost_usd"),
        timestamp=_iso(step.get("ts")),
        prompt_token_ids=None,
        completion_token_ids=[],
        logprobs=[],
        reasoning_tokens=step.get("reasoning_tokens"),
        priced_model=session.get("agent_model") or "",
        policy_version=session.get("policy_version"),
    )
