"""Token-exact RL segments: every sampled token in exactly one segment, never re-tokenized, split where history was
rewritten (a chat template dropping reasoning, a summary) — a property test over random strip/rewrite points."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.export.conversation import Call, Conversation
from pipelines.export.rl import rl_records, token_segments

_IDS = st.lists(st.integers(min_value=0, max_value=2**31), min_size=1, max_size=12)


def _call(index: int, prompt: list[int], completion: list[int], logprobs: list[float]) -> Call:
    return Call(
        call_index=index,
        model="m",
        finish_reason="stop",
        prompt_tokens=len(prompt),
        completion_tokens=len(completion),
        cached_tokens=0,
        cost_usd=None,
        timestamp=None,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=logprobs,
        policy_version=f"v{index // 2}",
    )


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Call], list[bool]]:
    """Calls whose prompts extend the history, except at random points where it is rewritten.

    Returns the calls and, per call, whether its prompt rewrote the history (the first call: False).
    """
    n = draw(st.integers(min_value=1, max_value=8))
    calls: list[Call] = []
    rewritten: list[bool] = []
    context: list[int] = []
    for i in range(n):
        observed = draw(st.lists(st.integers(0, 2**31), max_size=6))  # tool result + template tokens
        how = draw(st.sampled_from(["extend", "extend", "strip", "rewrite"])) if i else "first"
        if how == "strip":  # the template left (part of) the previous completion out: reasoning
            cut = draw(st.integers(min_value=1, max_value=len(calls[-1].completion_token_ids)))
            kept = context[: len(context) - cut]
            prompt = kept + [-1] + observed  # -1: never an id the model sampled, so the prompt cannot extend
        elif how == "rewrite":  # a summary replaced the history
            prompt = [-2, *draw(_IDS), *observed]
        else:
            prompt = context + observed if i else draw(_IDS)
        completion = draw(_IDS)
        logprobs = draw(st.lists(st.floats(-20, 0), min_size=len(completion), max_size=len(completion)))
        calls.append(_call(i, prompt, completion, logprobs))
        rewritten.append(how in ("strip", "rewrite"))
        context = prompt + completion
    return calls, rewritten


@pytest.mark.fuzz
@settings(deadline=None)
@given(sessions())
def test_every_sampled_token_is_in_exactly_one_segment_as_the_server_returned_it(
    session: tuple[list[Call], list[bool]],
) -> None:
    calls, rewritten = session
    segments = token_segments(calls)
    assert segments is not None
    # a new segment exactly where a prompt rewrote the history
    assert [s.turns[0] for s in segments] == [i for i, r in enumerate(rewritten) if i == 0 or r]
    assert [t for s in segments for t in s.turns] == list(range(len(calls)))
    sampled, sampled_lp = [], []
    for segment in segments:
        assert len(segment.response_ids) == len(segment.response_mask) == len(segment.logprobs)
        assert segment.prompt_ids == calls[segment.turns[0]].prompt_token_ids  # the server's ids, not re-tokenized
        sampled += [t for t, m in zip(segment.response_ids, segment.response_mask, strict=True) if m == 1]
        sampled_lp += [lp for lp, m in zip(segment.logprobs, segment.response_mask, strict=True) if m == 1]
        assert all(lp == 0.0 for lp, m in zip(segment.logprobs, segment.response_mask, strict=True) if m == 0)
        # what the model saw before each of its completions is exactly that call's prompt
        position = 0
        for index in segment.turns:
            call = calls[index]
            starts = [i for i in range(position, len(segment.response_mask)) if segment.response_mask[i] == 1]
            start = starts[0]
            seen = segment.prompt_ids + segment.response_ids[:start]
            assert seen == call.prompt_token_ids
            end = start + len(call.completion_token_ids)
            assert segment.response_ids[start:end] == call.completion_token_ids
            position = end
    assert sampled == [t for c in calls for t in c.completion_token_ids]  # each sampled token once, in order
    assert sampled_lp == [lp for c in calls for lp in c.logprobs]


def test_segments_share_session_group_and_reward_and_carry_their_turns_policy_versions() -> None:
    calls = [
        _call(0, [1, 2], [3, 4], [-0.1, -0.2]),
        _call(1, [1, 2, 3, 4, 9], [5], [-0.3]),  # extends: same segment, 9 observed
        _call(2, [1, 2, 9, 9], [6, 7], [-0.4, -0.5]),  # the reasoning (3, 4 …) left out: a new segment
    ]
    conversation = Conversation(messages=[], tools=[], prompt_source="recorded", calls=calls)
    session = {
        "session_id": "s",
        "task_id": "t",
        "task_type": "x",
        "group_id": "g",
        "attempt": 1,
        "completion": 1.0,
        "quality": 1.0,
        "eval_passed": True,
        "reward": 1.0,
        "failure_cause": "success",
        "policy_version": "p",
    }
    first, second = rl_records(session, conversation)
    assert (first["session_id"], first["group_id"], first["reward"]) == (second["session_id"], "g", 1.0)
    assert second["reward"] == 1.0
    assert (first["segment_index"], first["num_segments"], first["is_last_segment"]) == (0, 2, False)
    assert (second["segment_index"], second["is_last_segment"], second["first_turn"]) == (1, True, 2)
    assert first["response_ids"] == [3, 4, 9, 5] and first["response_mask"] == [1, 1, 0, 1]
    assert first["policy_versions"] == ["v0", "v0"] and second["policy_versions"] == ["v1"]
    assert first["stop_reason"] == "continued" and second["stop_reason"] == "terminal"
    assert first["step_rewards"] == [0.0, 0.0] and second["step_rewards"] == [1.0]


def test_a_call_without_ids_makes_the_session_message_form() -> None:
    calls = [_call(0, [1], [2], [-0.1]), _call(1, [1, 2, 3], [4], [-0.2])]
    calls[1].prompt_token_ids = None
    assert token_segments(calls) is None
    calls[1].prompt_token_ids = [1, 2, 3]
    calls[1].logprobs = [-0.2, -0.3]  # misaligned logprobs: never guessed
    assert token_segments(calls) is None
