"""Failure causes of the live fleet's caps: a capped session reached a limit, whatever the cap."""

from __future__ import annotations

import polars as pl
import pytest

from quality.failure import failure_causes


@pytest.mark.parametrize("exit_reason", ["max_steps", "max_model_tokens", "max_cost_usd", "deadline"])
def test_every_cap_is_a_limit_reached(exit_reason: str) -> None:
    trajectories = pl.DataFrame(
        {"session_id": ["s"], "status": ["capped"], "exit_reason": [exit_reason], "eval_passed": [False]}
    )
    steps = pl.DataFrame(
        {"session_id": ["s"], "step_index": [0], "failure_reason": [None]}, schema_overrides={"failure_reason": pl.Utf8}
    )
    causes = failure_causes(trajectories, steps, pl.Series([], dtype=pl.Utf8))
    assert causes.row(0, named=True) == {
        "session_id": "s",
        "failure_cause": "limit_reached",
        "retry_advice": "rerun_with_higher_limits",
    }


def test_an_agent_that_raised_is_a_crash_of_the_agent_not_a_limit_nor_a_wrong_answer() -> None:
    trajectories = pl.DataFrame(
        {"session_id": ["s"], "status": ["failed"], "exit_reason": ["agent_raised"], "eval_passed": [False]}
    )
    steps = pl.DataFrame(
        {"session_id": ["s"], "step_index": [0], "failure_reason": [None]}, schema_overrides={"failure_reason": pl.Utf8}
    )
    causes = failure_causes(trajectories, steps, pl.Series([], dtype=pl.Utf8))
    assert causes.row(0, named=True) == {
        "session_id": "s",
        "failure_cause": "agent_crashed",
        "retry_advice": "fix_agent",
    }


@pytest.mark.parametrize(
    ("exit_reason", "cause"), [("disk_quota", "limit_reached"), ("egress_monitor_failed", "infrastructure_error")]
)
def test_a_session_its_host_ended(exit_reason: str, cause: str) -> None:
    """A full disk is the agent's limit; a failed monitor is the host's fault (status ``failed`` both)."""
    trajectories = pl.DataFrame(
        {"session_id": ["s"], "status": ["failed"], "exit_reason": [exit_reason], "eval_passed": [False]}
    )
    steps = pl.DataFrame(
        {"session_id": ["s"], "step_index": [0], "failure_reason": [None]}, schema_overrides={"failure_reason": pl.Utf8}
    )
    assert failure_causes(trajectories, steps, pl.Series([], dtype=pl.Utf8))["failure_cause"][0] == cause
