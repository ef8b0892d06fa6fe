"""``atif`` records: a session as Harbor's Agent Trajectory Interchange Format, ATIF-v1.7.

ATIF-v1.7 is the newest version whose specification we could check (Harbor's RFC 0001, v1.7
changelog: ``trajectory_id``, ``llm_call_count``, extras on tool calls and observation results,
``session_id`` optional). What a trajectory holds:

- a ``system`` step (the system prompt) and a ``user`` step (the task), stamped with the session's
  start; a later user or system message is a step of its own;
- one ``agent`` step per model call (per step, for a session that recorded none): timestamp,
  ``model_name``, ``message``, ``reasoning_content``, ``tool_calls`` (the original call ids,
  arguments as objects), the ``observation`` of its calls' results, ``llm_call_count`` 1 for a
  recorded call, and ``metrics``: prompt, completion and cached tokens, the cost (what the server
  reported, else priced with the price table), ``prompt_token_ids``, ``completion_token_ids``,
  ``logprobs`` and ``extra`` (reasoning tokens); the step's ``extra`` holds the finish reason,
  the weights' version and the sampling engine;
- ``agent.tool_definitions`` (v1.5+), ``final_metrics`` as the sums of the steps' metrics;
- ``extra``: what happened in the run — task, group, attempt, policy version, status, exit
  reason, the evaluator's verdict and reward (for an imported run no trusted verdict judged, the
  verdict its own file claimed), stop reason, submission, ``prompt_source``;
- ``session_id``: an imported run's own id (the one its file gave it), else the session's.

What this lakehouse concluded about the session (quality, completion, outcome, weight, flags) is
not trajectory content: another lakehouse importing the file would conclude from its own
evidence. It goes to ``<file>.scores.jsonl`` next to the trajectories, one line per session. So
export → ``trajlake import --format atif`` → export gives the same bytes (lines are written with
sorted keys).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from common.prices import PriceTable
from pipelines.export.conversation import Call, Conversation
from pipelines.export.formats import (
    arguments_object,
    call_cost,
    episode_reward,
    metadata,
    prompt_source,
    stop_reason,
)

ATIF_VERSION = "ATIF-v1.7"
#: ``extra`` keys of a trajectory that describe the run (restored by the importer).
RUN_FIELDS = (
    "task_id",
    "task_type",
    "task_family",
    "split",
    "group_id",
    "attempt",
    "policy_version",
    "status",
    "exit_reason",
    "eval_passed",
    "reward",
    "stop_reason",
    "submission",
    "prompt_source",
)


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return text.replace("+00:00", "Z")


def _metrics(call: Call, cost: Decimal) -> dict[str, Any]:
    metrics: dict[str, Any] = {
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": call.completion_tokens,
        "cached_tokens": call.cached_tokens,
        "cost_usd": float(cost),
        "prompt_token_ids": call.prompt_token_ids,
        "completion_token_ids": call.completion_token_ids or None,
        "logprobs": call.logprobs or None,
    }
    if call.reasoning_tokens is not None:
        metrics["extra"] = {"reasoning_tokens": call.reasoning_tokens}
    return {k: v for k, v in metrics.items() if v is not None}


def _step_extra(call: Call) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if call.finish_reason:
        extra["finish_reason"] = call.finish_reason
    if call.policy_version:
        extra["policy_version"] = call.policy_version
    engine = {k: v for k, v in call.engine.items() if k != "model"}
    if engine:
        extra["engine"] = engine
    return extra


def atif_session_id(session: dict[str, Any]) -> str:
    """The trajectory's ``session_id``: an imported run's own id (``extra.source_session_id``), else the session's.

    Selection leaves the own id out when another session of the lake could be meant by it
    (:mod:`pipelines.export.select`).
    """
    return str(session.get("source_session_id") or session["session_id"])


def verdict(session: dict[str, Any]) -> tuple[bool | None, float | None]:
    """``eval_passed`` and ``reward`` of a trajectory: the verdict that counted, else what the run's own file claimed.

    A self-reported verdict never counts in this lake (``pipelines.intake.ownership``); restating it here
    gives it no more trust than the file it came from had, and keeps export → import → export
    byte-stable. The lake's own judgement is in the scores file.
    """
    claim = session.get("claimed_verdict")
    if session.get("verdict_provenance") is not None or not claim:
        return session.get("eval_passed"), session.get("reward")
    try:
        stated = json.loads(claim.get("details") or "")
    except (TypeError, ValueError):
        stated = None
    if isinstance(stated, dict) and {"eval_passed", "reward"} <= stated.keys():
        return stated["eval_passed"], stated["reward"]  # the claim as the file stated it
    return claim.get("passed"), claim.get("reward")


@dataclass
class _Totals:
    """The sums of an ATIF trajectory's steps (its ``final_metrics``)."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    cost: Decimal = field(default_factory=lambda: Decimal(0))


def atif_record(session: dict[str, Any], conversation: Conversation, prices: PriceTable) -> dict[str, Any]:
    """The session as one ATIF-v1.7 trajectory (see the module docstring)."""
    totals = _Totals()
    steps = _steps(session, conversation, prices, totals)
    # the sums of the steps: equal to the trajectories row (a test checks it for every session)
    final: dict[str, Any] = {
        "total_prompt_tokens": totals.prompt,
        "total_completion_tokens": totals.completion,
        "total_cached_tokens": totals.cached,
        "total_cost_usd": float(totals.cost),
        "total_steps": len(steps),
    }
    meta = metadata(session, conversation)
    eval_passed, reward = verdict(session)
    run = {
        **{k: meta.get(k) for k in RUN_FIELDS if k in meta},
        "status": session.get("status"),
        "exit_reason": session.get("exit_reason"),
        "eval_passed": eval_passed,
        "reward": reward,  # the evaluator's; the trainer's reward is in the scores file
        "stop_reason": stop_reason(session, conversation),
    }
    agent: dict[str, Any] = {
        "name": session.get("agent_name") or "unknown",
        "version": session.get("agent_version") or "unknown",
        "model_name": session.get("agent_model"),
        "tool_definitions": conversation.tools or None,
    }
    return {
        "schema_version": ATIF_VERSION,
        "session_id": atif_session_id(session),
        "agent": {k: v for k, v in agent.items() if v is not None},
        "steps": steps,
        "final_metrics": final,
        "extra": {k: v for k, v in run.items() if v is not None},
    }


def _steps(
    session: dict[str, Any], conversation: Conversation, prices: PriceTable, totals: _Totals
) -> list[dict[str, Any]]:
    """The conversation's messages as ATIF steps (tool results folded into the agent step before them)."""
    steps: list[dict[str, Any]] = []
    turns = conversation.usage_turns
    recorded = prompt_source(session, conversation) == "recorded"
    started = _iso(session.get("started_at"))
    assistant = 0
    for m in conversation.messages:
        if m["role"] == "tool":
            _add_tool_result(steps, m)
            continue
        source = {"system": "system", "user": "user", "assistant": "agent"}.get(m["role"], "user")
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": source, "message": m.get("content") or ""}
        if source != "agent":
            if started and assistant == 0:  # the task as given at the session's start
                step["timestamp"] = started
            steps.append(step)
            continue
        _fill_agent_step(step, m, conversation, turns, assistant, recorded, prices, totals)
        assistant += 1
        steps.append(step)
    return steps


def _add_tool_result(steps: list[dict[str, Any]], m: dict[str, Any]) -> None:
    """A tool message: an observation of the agent step before it (else a system step of its own)."""
    if steps and steps[-1]["source"] == "agent":
        results = steps[-1].setdefault("observation", {"results": []})["results"]
        results.append({"source_call_id": m.get("tool_call_id"), "content": m.get("content") or ""})
        return
    # a tool message with no agent turn before it: kept as a system observation
    result = {"source_call_id": m.get("tool_call_id"), "content": m.get("content") or ""}
    orphan = {"step_id": len(steps) + 1, "source": "system", "message": ""}
    steps.append({**orphan, "observation": {"results": [result]}})


def _fill_agent_step(
    step: dict[str, Any],
    m: dict[str, Any],
    conversation: Conversation,
    turns: list[Call],
    assistant: int,
    recorded: bool,
    prices: PriceTable,
    totals: _Totals,
) -> None:
    """The ``assistant``-th agent step: its time, reasoning, tool calls and its model call's metrics (summed)."""
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
                "arguments": arguments_object(c["function"]["arguments"]),
            }
            for c in m["tool_calls"]
        ]
    if assistant < len(turns):
        call = turns[assistant]
        if call.model:
            step["model_name"] = call.model
        if recorded:
            step["llm_call_count"] = 1
        cost = call_cost(call, prices)
        step["metrics"] = _metrics(call, cost)
        extra = _step_extra(call)
        if extra:
            step["extra"] = extra
        totals.prompt += call.prompt_tokens or 0
        totals.completion += call.completion_tokens or 0
        totals.cached += call.cached_tokens or 0
        totals.cost += cost


def atif_judgement(session: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """What this lakehouse concluded about the session: the line of ``<file>.scores.jsonl``."""
    meta = metadata(session, conversation)
    return {
        "session_id": atif_session_id(session),  # the trajectory's, so the two files join
        "lakehouse_session_id": session["session_id"],
        "origin": meta["origin"],
        "outcome": meta["outcome"],
        "quality": meta["quality"],
        "completion": meta["completion"],
        "reward": episode_reward(session),
        "weight": meta["weight"],
        "flags": meta["flags"],
        "usage": meta["usage"],
    }
