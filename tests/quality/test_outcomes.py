"""Outcomes: what an export selects by, and why a failure is never exportable whatever its quality."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quality.failure import OUTCOMES, RETRY_ADVICE, outcome

CONFIG_REASON = "model_config_error: HTTP 401 (the endpoint refused the key)"

CASES = [
    # (failure_cause, status, exit_reason, eval_passed, reward) -> outcome
    (("success", "completed", "agent_finished", True, 1.0), "success"),
    (("success", "capped", "max_steps", True, 1.0), "success"),  # the deliverable passed before the cap
    (("wrong_answer", "completed", "agent_finished", False, 0.0), "failure"),
    (("agent_gave_up", "gave_up", "gave_up", False, 0.0), "failure"),
    (("limit_reached", "capped", "max_model_tokens", False, 0.0), "failure"),
    (("cheating", "completed", "agent_finished", True, 1.0), "failure"),  # a voided verdict
    (("agent_crashed", "failed", "agent_raised", False, 0.0), "agent_crash"),
    (("success", "failed", "agent_raised", True, 1.0), "agent_crash"),  # passed, but the agent raised
    (("infrastructure_error", "error", "sandbox died: x", False, 0.0), "infrastructure"),
    (("success", "error", "model_api_error: HTTP 503", True, 1.0), "infrastructure"),
    (("reaper_timeout", "timeout", "reaper", False, 0.0), "infrastructure"),
    # the endpoint refused the request as configured (401/403/404): no signal about the policy
    (("configuration_error", "error", "model_config_error: HTTP 401", False, 0.0), "infrastructure"),
    (("configuration_error", "completed", "AuthenticationError: bad key", None, None), "infrastructure"),
    (("success", "error", "model_config_error: HTTP 404", True, 1.0), "infrastructure"),
    (("success", "completed", "AuthenticationError: bad key", True, 1.0), "infrastructure"),
    (("unevaluated", "completed", None, None, None), "unevaluated"),
    (("limit_reached", "capped", "max_steps", None, None), "unevaluated"),  # nobody evaluated it
    (("still_running", "running", None, None, None), "running"),
]


def _frame(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(
        rows,
        schema={
            "failure_cause": pl.Utf8,
            "status": pl.Utf8,
            "exit_reason": pl.Utf8,
            "eval_passed": pl.Boolean,
            "reward": pl.Float64,
        },
        orient="row",
    )


@pytest.mark.parametrize(("row", "expected"), CASES)
def test_outcome_of_each_way_a_session_ends(row: tuple, expected: str) -> None:
    assert _frame([row]).select(outcome().alias("outcome"))["outcome"][0] == expected


@pytest.mark.fuzz
@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(RETRY_ADVICE)),
            st.sampled_from(["completed", "capped", "failed", "error", "timeout", "gave_up", "running"]),
            st.sampled_from(
                [None, "agent_raised", "agent_finished", "reaper", "max_steps", "sandbox died: x", CONFIG_REASON]
            ),
            st.sampled_from([None, True, False]),
            st.sampled_from([None, 0.0, 0.5, 1.0]),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_a_success_is_evaluated_passed_unvoided_and_uncrashed(rows: list[tuple]) -> None:
    frame = _frame(rows)
    result = frame.with_columns(outcome().alias("outcome"))
    assert set(result["outcome"]) <= set(OUTCOMES)
    for cause, status, reason, passed, reward, got in result.iter_rows():
        if got == "success":
            assert cause == "success" and passed is True and status not in ("error", "failed")
        if got in ("success", "failure"):  # a verdict about the policy exists
            assert passed is not None or reward is not None
        if reason == "agent_raised" and status == "failed":
            assert got == "agent_crash" or cause == "still_running"
        if cause == "configuration_error" or (cause == "success" and reason == CONFIG_REASON):
            assert got in ("infrastructure", "agent_crash")  # never an RL episode nor an SFT example
