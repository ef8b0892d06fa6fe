"""``rl`` records: token-exact samples for verl and SkyRL, split where a prompt rewrote history.

A session whose model calls recorded token ids becomes one or more **segments**. Within a segment
every prompt extends the previous prompt + completion, so the segment is one sample: ``prompt_ids``
(its first call's prompt), ``response_ids`` (each completion, then the tokens the next prompt
appended: tool results and chat-template tokens), ``response_mask`` / SkyRL's ``loss_mask`` (1
sampled, 0 appended) and ``logprobs`` (verl ``response_logprobs``, SkyRL ``rollout_logprobs``;
0.0 under mask 0). Where a prompt does **not** extend the previous prompt + completion — a chat
template that leaves the previous turn's reasoning out of the next prompt (DeepSeek-R1/V3.x
reasoner, Qwen3 thinking, gpt-oss), a summarised or truncated history — a new segment starts,
with that call's prompt as its ``prompt_ids``. So every sampled token is in exactly one segment,
under mask 1, with the logprob the server returned, and no token is ever re-tokenized.

Segments of one session share ``session_id``, ``group_id``, ``attempt`` and ``reward`` (the episode's:
the scored completion, on every segment) and say where they are (``segment_index``,
``num_segments``, ``is_last_segment``; ``stop_reason`` is the episode's on the last segment and
``continued`` before it; ``step_rewards`` is sparse: the reward on the session's last turn). Each
carries the policy version of each of its turns (``policy_versions``: what the server reported,
else the session's), so an asynchronous trainer can drop or down-weight stale turns, and the
sampling engines that produced it (``sampling_engines``: model, engine, dtype, system fingerprint,
as far as the server said). The session's ``messages`` are on its last segment only (every
segment holding them would cost O(turns²) bytes).

A session without token ids (a scripted or imported run, a server that returned none) is one
record in message form: ``has_token_ids = false``, empty id lists, its ``messages`` kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pipelines.errors import RecordError
from pipelines.export.conversation import Call, Conversation
from pipelines.export.formats import episode_reward, metadata, stop_reason

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
_ENGINE = pa.struct(
    [("model", pa.string()), ("engine", pa.string()), ("dtype", pa.string()), ("system_fingerprint", pa.string())]
)
_USAGE = pa.struct(
    [
        ("input_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()),
        ("model_calls", pa.int64()),
    ]
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
        ("has_logprobs", pa.bool_()),
        ("reward", pa.float64()),
        ("step_rewards", pa.list_(pa.float64())),
        ("num_turns", pa.int64()),
        ("stop_reason", pa.string()),
        ("segment_index", pa.int64()),
        ("num_segments", pa.int64()),
        ("is_last_segment", pa.bool_()),
        ("first_turn", pa.int64()),
        ("policy_versions", pa.list_(pa.string())),
        ("sampling_engines", pa.list_(_ENGINE)),
        ("messages", pa.list_(_MESSAGE)),
        ("tools", pa.string()),
        ("submission", pa.string()),
        ("session_id", pa.string()),
        ("task_id", pa.string()),
        ("task_type", pa.string()),
        ("task_family", pa.string()),
        ("split", pa.string()),
        ("origin", pa.string()),
        ("group_id", pa.string()),
        ("attempt", pa.int64()),
        ("policy_version", pa.string()),
        ("agent_model", pa.string()),
        ("prompt_source", pa.string()),
        ("outcome", pa.string()),
        ("quality", pa.float64()),
        ("completion", pa.float64()),
        ("weight", pa.float64()),
        ("flags", pa.list_(_FLAG)),
        ("usage", _USAGE),
    ]
)


@dataclass
class Segment:
    """One token-exact sample: a run of calls each of whose prompt extends the previous prompt + completion."""

    turns: list[int] = field(default_factory=list)  # indices of its calls in the session
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def token_segments(calls: list[Call]) -> list[Segment] | None:
    """The session's segments from its calls' recorded ids, or None when it cannot be token level.

    None when there is no call, a call has no prompt ids or no completion ids, or a call's logprobs
    do not align with its completion (some but not all). Logprobs missing from every call are
    0.0 placeholders (``has_logprobs`` false).
    """
    if not calls or any(c.prompt_token_ids is None or not c.completion_token_ids for c in calls):
        return None
    if any(len(c.logprobs) not in (0, len(c.completion_token_ids)) for c in calls):
        return None
    segments: list[Segment] = []
    context: list[int] | None = None
    for index, call in enumerate(calls):
        prompt = list(call.prompt_token_ids or [])
        if context is not None and len(prompt) >= len(context) and prompt[: len(context)] == context:
            segment = segments[-1]
            appended = prompt[len(context) :]  # tool results and template tokens: observed, not sampled
            segment.response_ids += appended
            segment.response_mask += [0] * len(appended)
            segment.logprobs += [0.0] * len(appended)
        else:  # the first call, or a prompt that rewrote what came before: a new sample
            segment = Segment(prompt_ids=prompt)
            segments.append(segment)
        segment.turns.append(index)
        completion = list(call.completion_token_ids)
        segment.response_ids += completion
        segment.response_mask += [1] * len(completion)
        segment.logprobs += list(call.logprobs) or [0.0] * len(completion)
        context = prompt + completion
    return segments


def _engines(turns: list[Call]) -> list[dict[str, str | None]]:
    """The distinct sampling engines of ``turns``, in order of first use."""
    seen: list[dict[str, str | None]] = []
    for call in turns:
        engine = {k: call.engine.get(k) for k in ("model", "engine", "dtype", "system_fingerprint")}
        if any(engine.values()) and engine not in seen:
            seen.append(engine)
    return seen


def rl_records(session: dict[str, Any], conversation: Conversation) -> list[dict[str, Any]]:
    """The session's ``rl`` records: one per segment when ids were recorded, else one in message form.

    Raises:
        RecordError: the session was never evaluated (an RL record needs a reward).
    """
    reward = episode_reward(session)
    if reward is None:
        raise RecordError("no_reward", "the session was never evaluated: an RL record needs a reward")
    usage_turns = conversation.usage_turns
    meta = metadata(session, conversation)
    common = {"reward": reward, "tools": conversation.tools, **meta}
    segments = token_segments(conversation.calls)
    if segments is None:
        count = len(conversation.calls) or sum(1 for m in conversation.messages if m["role"] == "assistant")
        return [
            {
                "prompt_ids": [],
                "response_ids": [],
                "response_mask": [],
                "loss_mask": [],
                "logprobs": [],
                "has_token_ids": False,
                "has_logprobs": False,
                # sparse: the episode reward on the last turn (the evaluator scores the episode, not the turns)
                "step_rewards": [0.0] * (count - 1) + [reward] if count else [],
                "num_turns": count,
                "stop_reason": stop_reason(session, conversation),
                "segment_index": 0,
                "num_segments": 1,
                "is_last_segment": True,
                "first_turn": 0,
                "policy_versions": [c.policy_version or session.get("policy_version") for c in usage_turns],
                "sampling_engines": _engines(usage_turns),
                "messages": conversation.messages,
                **common,
            }
        ]
    records = []
    last = len(segments) - 1
    has_logprobs = all(c.logprobs for c in conversation.calls)
    for index, segment in enumerate(segments):
        turns: list[Call] = [conversation.calls[i] for i in segment.turns]
        records.append(
            {
                "prompt_ids": segment.prompt_ids,
                "response_ids": segment.response_ids,
                "response_mask": segment.response_mask,
                "loss_mask": segment.response_mask,
                "logprobs": segment.logprobs,
                "has_token_ids": True,
                "has_logprobs": has_logprobs,
                "step_rewards": [0.0] * (len(turns) - 1) + [reward if index == last else 0.0],
                "num_turns": len(turns),
                "stop_reason": stop_reason(session, conversation) if index == last else "continued",
                "segment_index": index,
                "num_segments": len(segments),
                "is_last_segment": index == last,
                "first_turn": segment.turns[0],
                "policy_versions": [c.policy_version or session.get("policy_version") for c in turns],
                "sampling_engines": _engines(turns),
                "messages": conversation.messages if index == last else [],
                **common,
            }
        )
    return records
