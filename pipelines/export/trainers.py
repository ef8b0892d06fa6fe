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
rewrote history) is one record. Otherwise (chat mode against a template that re-renders history,
drops earlier reasoning, or a summarised history) it is one record per segment
(:func:`pipelines.export.rl.token_segments`: a run of calls whose prompts extend the previous
prompt + completion; ``extra_fields``/``env_metrics`` ``segment`` = the index of its first call,
``last_segment`` whether the episode ended in it): its prompt as the server tokenized it and what
followed, never re-tokenized. Where some calls recorded no ids, each call that did is its own
record. A session without token ids cannot be a trainer record (message-level servers): it is
left out with the reason ``no_token_ids``.

Each record is also a row of the trainer's own prompt dataset, so an export's split file (verl's
``RLHFDataset``: ``data.train_files=DIR/data/train.jsonl``) or the export directory (SkyRL's
``PromptDataset``: ``data.train_data=["DIR:train"]``, loaded with ``datasets.load_dataset(DIR)``)
loads as it is: ``prompt`` — the messages the session began with, system and user turns through
the first user turn, ``role`` and ``content`` only (what both render with the tokenizer's chat
template to filter overlong prompts and to start a new rollout) — and ``data_source``
(``trajlake/<task family>``, the key both trainers group metrics and pick reward functions by).
SkyRL's ``TrajectoryOutput`` is a dataclass that takes its own fields only: the record's other
columns are exactly those fields; ``PromptDataset`` hands them to the environment as its extras.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.errors import RecordError
from pipelines.export.conversation import Conversation
from pipelines.export.rl import rl_records, token_segments

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
    last: bool = True  # the episode ended in this sample


def _tool_turns(messages: list[dict[str, Any]]) -> int:
    """Runs of consecutive tool messages (verl appends a turn's tool results as one user turn)."""
    return sum(
        1 for i, m in enumerate(messages) if m["role"] == "tool" and (i == 0 or messages[i - 1]["role"] != "tool")
    )


def samples(conversation: Conversation) -> list[Sample]:
    """The session as one exact sequence, else one sample per segment (or per call with ids).

    Raises:
        RecordError: ``no_token_ids``: no call recorded token ids (a message-level server).
    """
    calls = conversation.calls
    segments = token_segments(calls)
    if segments is not None and len(segments) == 1:
        (only,) = segments
        has_logprobs = all(len(c.logprobs) == len(c.completion_token_ids) for c in calls)
        assistant = sum(1 for m in conversation.messages if m["role"] == "assistant")
        return [
            Sample(
                only.prompt_ids,
                only.response_ids,
                only.response_mask,
                only.logprobs if has_logprobs else None,
                calls[-1].finish_reason,
                assistant,
                _tool_turns(conversation.messages),
                sum(c.latency_ms or 0.0 for c in calls) / 1000,
            )
        ]
    if segments is not None:
        out = []
        for index, segment in enumerate(segments):
            turns = [calls[i] for i in segment.turns]
            first = segment.turns[0]
            aligned = all(len(c.logprobs) == len(c.completion_token_ids) for c in turns)
            out.append(
                Sample(
                    segment.prompt_ids,
                    segment.response_ids,
                    segment.response_mask,
                    segment.logprobs if aligned else None,
                    turns[-1].finish_reason,
                    first + len(turns),  # its replies and every earlier one (the prompt holds those)
                    first + len(turns) - 1,  # the tool results before each of its replies
                    sum(c.latency_ms or 0.0 for c in turns) / 1000,
                    segment=calls[first].call_index,
                    last=index == len(segments) - 1,
                )
            )
        return out
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
                last=i == len(calls) - 1,
            )
        )
    if not out:
        raise RecordError("no_token_ids", "no model call recorded token ids: a trainer record needs them")
    return out


def task_prompt(conversation: Conversation) -> list[dict[str, Any]]:
    """The messages the session began with (system turns, then the first user turn), ``role`` and ``content``.

    Raises:
        RecordError: ``no_prompt``: the conversation does not begin with a user turn (after system turns).
    """
    prompt: list[dict[str, Any]] = []
    for m in conversation.messages:
        if m["role"] not in ("system", "user"):
            break
        prompt.append({"role": m["role"], "content": m["content"] if m["content"] is not None else ""})
        if m["role"] == "user":
            return prompt
    raise RecordError("no_prompt", "the conversation does not begin with a user turn: no prompt to load")


def _prompt_columns(rl: dict[str, Any], conversation: Conversation) -> dict[str, Any]:
    """The columns verl's ``RLHFDataset`` and SkyRL's ``PromptDataset`` read from a row."""
    return {"prompt": task_prompt(conversation), "data_source": f"trajlake/{rl.get('task_family') or 'unknown'}"}


def _extra(rl: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "session_id",
        "task_id",
        "task_family",
        "split",
        "group_id",
        "attempt",
        "policy_version",
        "agent_model",
        "origin",
    )
    out = {k: rl.get(k) for k in keep}
    out.update(quality=rl.get("quality"), weight=rl.get("weight"), flags=rl.get("flags") or [])
    out["trajlake_stop_reason"] = rl["stop_reason"]
    return out


def verl_records(session: dict[str, Any], conversation: Conversation) -> list[dict[str, Any]]:
    """verl ``AgentLoopOutput`` records of one session.

    Raises:
        RecordError: ``no_reward`` (never evaluated), ``no_token_ids``, ``no_prompt``.
    """
    rl = rl_records(session, conversation)[-1]  # the episode's reward, and how it ended (its last record)
    extra = _extra(rl)
    prompt = _prompt_columns(rl, conversation)
    return [
        {
            **prompt,
            "prompt_ids": s.prompt_ids,
            "response_ids": s.response_ids,
            "response_mask": s.mask,
            "response_logprobs": s.logprobs,
            "reward_score": rl["reward"],
            "num_turns": 1 + s.assistant_turns + s.tool_turns,
            "metrics": {"generate_sequences": round(s.latency_s, 6)},
            "extra_fields": {**extra, "segment": s.segment, "last_segment": s.last},
        }
        for s in samples(conversation)
    ]


def skyrl_stop_reason(rl_stop_reason: str, finish_reason: str | None) -> str:
    """SkyRL's ``stop_reason``: ``length`` when the model or a cap cut the episode short, else ``stop``."""
    return "length" if finish_reason == "length" or rl_stop_reason.startswith("truncated") else "stop"


def skyrl_records(session: dict[str, Any], conversation: Conversation) -> list[dict[str, Any]]:
    """SkyRL ``TrajectoryOutput`` records of one session.

    Raises:
        RecordError: ``no_reward`` (never evaluated), ``no_token_ids``, ``no_prompt``.
    """
    rl = rl_records(session, conversation)[-1]  # the episode's reward, and how it ended (its last record)
    extra = _extra(rl)
    prompt = _prompt_columns(rl, conversation)
    out = []
    for s in samples(conversation):
        episode_stop = rl["stop_reason"] if s.last else "terminal"  # a cap truncates the episode's last part only
        out.append(
            {
                **prompt,
                "prompt_ids": s.prompt_ids,
                "response_ids": s.response_ids,
                "loss_mask": s.mask,
                "rollout_logprobs": s.logprobs,
                "reward": rl["reward"],
                "stop_reason": skyrl_stop_reason(episode_stop, s.finish_reason),
                "env_metrics": {
                    **extra,
                    "segment": s.segment,
                    "last_segment": s.last,
                    "num_turns": 1 + s.assistant_turns + s.tool_turns,
                    "generate_seconds": round(s.latency_s, 6),
                },
            }
        )
    return out


def trainer_records(fmt: str, session: dict[str, Any], conversation: Conversation) -> list[dict[str, Any]]:
    """The records of one session in a trainer format (one, or one per model call)."""
    return verl_records(session, conversation) if fmt == "verl" else skyrl_records(session, conversation)
