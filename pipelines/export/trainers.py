"""Records that RL trainers load as they are: verl's ``AgentLoopOutput`` and SkyRL's ``TrajectoryOutput``.

Both are built from what the ``rl`` record holds (the recorded calls' token ids, the episode reward,
how the episode ended), with each trainer's own field names and meanings:

- ``verl`` (``verl.experimental.agent_loop.agent_loop.AgentLoopOutput``): ``prompt_ids``,
  ``response_ids``, ``response_mask`` (1 sampled, 0 environment), ``response_logprobs``,
  ``reward_score``, ``num_turns`` as verl counts it (the prompt's user turn, every assistant turn,
  every turn of tool results: ``1 + assistant + tool turns``), ``metrics`` (its
  ``AgentLoopMetrics``: seconds spent generating; the other timings are not recorded and keep
  verl's defaults) and ``extra_fields`` (the session's identity, quality and flags).
- ``skyrl`` (``skyrl_train.generators.skyrl_gym_generator.TrajectoryOutput``): ``prompt_ids``,
  ``response_ids``, ``loss_mask``, ``rollout_logprobs``, ``reward``, ``stop_reason`` as SkyRL reads
  it — the engine's ``stop`` or ``length`` (``length`` also for an episode a cap truncated, so an
  overlong filter treats it as cut short; the precise reason is in ``env_metrics``) — and
  ``env_metrics``.

A session whose calls form one exact token sequence (token-in/token-out, or a template that never
rewrote history) is one record. Otherwise (chat mode against a template that re-renders history)
each model call is its own record (``extra_fields``/``env_metrics`` ``segment`` = its call
index): its prompt as the server tokenized it and its sampled completion, never re-tokenized. A
session without token ids cannot be a trainer record (message-level servers): it is left out with
the reason ``no_token_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.errors import RecordError
from pipelines.export.conversation import Conversation
from pipelines.export.formats import rl_record, token_sequences

#: Trainer record formats (``trajlake export --format verl|skyrl``).
TRAINER_FORMATS = ("verl", "skyrl")


@dataclass
class Sample:
    """One training sample: a prompt, what followed it, which of it was sampled, and how it ended."""

    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[int]
    logprobs: list[float] | None
    finish_reason: str | None
    assistant_turns: int
    tool_turns: int
    latency_s: float
    segment: int | None = None


def _tool_turns(messages: list[dict[str, Any]]) -> int:
    """Runs of consecutive tool messages (verl appends a turn's tool results as one user turn)."""
    return sum(
        1 for i, m in enumerate(messages) if m["role"] == "tool" and (i == 0 or messages[i - 1]["role"] != "tool")
    )


def samples(conversation: Conversation) -> list[Sample]:
    """The session as one exact sequence, else one sample per model call.

    Raises:
        RecordError: ``no_token_ids``: no call recorded token ids (a message-level server).
    """
    calls = conversation.calls
    latency = sum(c.latency_ms or 0.0 for c in calls) / 1000
    tokens = token_sequences(conversation)
    if tokens is not None:
        prompt, response, mask, logprobs = tokens
        has_logprobs = all(len(c.logprobs) == len(c.completion_token_ids) for c in calls)
        assistant = sum(1 for m in conversation.messages if m["role"] == "assistant")
        return [
            Sample(
                prompt,
                response,
                mask,
                logprobs if has_logprobs else None,
                calls[-1].finish_reason,
                assistant,
                _tool_turns(conversation.messages),
                latency,
            )
        ]
    out = []
    for i, call in enumerate(calls):
        if call.prompt_token_ids is None or not call.completion_token_ids:
            continue
        n = len(call.completion_token_ids)
        out.append(
            Sample(
                list(call.prompt_token_ids),
                list(call.completion_token_ids),
                [1] * n,
                list(call.logprobs) if len(call.logprobs) == n else None,
                call.finish_reason,
                i + 1,  # this call's reply and every earlier one
                i,  # the tool results before it (an agent loop answers every reply that called a tool)
                (call.latency_ms or 0.0) / 1000,
                segment=call.call_index,
            )
        )
    if not out:
        raise RecordError("no_token_ids", "no model call recorded token ids: a trainer record needs them")
    return out


def _extra(rl: dict[str, Any]) -> dict[str, Any]:
    keep = ("session_id", "task_id", "task_family", "split", "group_id", "attempt", "policy_version", "agent_model")
    out = {k: rl.get(k) for k in keep}
    out.update(quality=rl.get("quality"), weight=rl.get("weight"), flags=rl.get("flags") or [])
    out["trajlake_stop_reason"] = rl["stop_reason"]
    return out


def verl_records(session: dict[str, Any], conversation: Conversation) -> list[dict[str, Any]]:
    """verl ``AgentLoopOutput`` records of one session.

    Raises:
        RecordError: ``no_reward`` (never evaluated), ``no_token_ids``.
    """
    rl = rl_record(session, conversation)
    extra = _extra(rl)
    return [
        {
            "prompt_ids": s.prompt_ids,
            "response_ids": s.response_ids,
            "response_mask": s.mask,
            "response_logprobs": s.logprobs,
            "reward_score": rl["reward"],
            "num_turns": 1 + s.assistant_turns + s.tool_turns,
            "metrics": {"generate_sequences": round(s.latency_s, 6)},
            "extra_fields": {**extra, "segment": s.segment},
        }
        for s in samples(conversation)
    ]


def skyrl_stop_reason(rl_stop_reason: str, finish_reason: str | None) -> str:
    """SkyRL's ``stop_reason``: ``length`` when the model or a cap cut the episode short, else ``stop``."""
    return "length" if finish_reason == "length" or rl_stop_reason.startswith("truncated") else "stop"


def skyrl_records(session: dict[str, Any], conversation: Conversation) -> list[dict[str, Any]]:
    """SkyRL ``TrajectoryOutput`` records of one session.

    Raises:
        RecordError: ``no_reward`` (never evaluated), ``no_token_ids``.
    """
    rl = rl_record(session, conversation)
    extra = _extra(rl)
    out = []
    for s in samples(conversation):
        last = s.segment is None or s.segment == conversation.calls[-1].call_index
        episode_stop = rl["stop_reason"] if last else "terminal"  # a cap truncates the episode's last call only
        out.append(
            {
                "prompt_ids": s.prompt_ids,
                "response_ids": s.response_ids,
                "loss_mask": s.mask,
                "rollout_logprobs": s.logprobs,
                "reward": rl["reward"],
                "stop_reason": skyrl_stop_reason(episode_stop, s.finish_reason),
                "env_metrics": {
                    **extra,
                    "segment": s.segment,
                    "num_turns": 1 + s.assistant_turns + s.tool_turns,
                    "generate_seconds": round(s.latency_s, 6),
                },
            }
        )
    return out


def trainer_records(fmt: str, session: dict[str, Any], conversation: Conversation) -> list[dict[str, Any]]:
    """The records of one session in a trainer format (one, or one per model call)."""
    return verl_records(session, conversation) if fmt == "verl" else skyrl_records(session, conversation)
