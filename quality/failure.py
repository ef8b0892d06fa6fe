"""Why a session did not succeed, and whether rerunning it can help.

Environment failures (the sandbox or host broke, the session was lost) are worth a rerun;
capability failures (wrong answer, gave up, cheated) are not — rerunning only burns compute
on the same policy. A reaper timeout is ambiguous (a hung agent or a slow machine), so it
gets one rerun.
"""

from __future__ import annotations

import polars as pl

#: failure cause → retry advice
RETRY_ADVICE = {
    "success": "none",
    "infrastructure_error": "rerun",
    "reaper_timeout": "rerun_once",
    "agent_gave_up": "do_not_rerun",
    "wrong_answer": "do_not_rerun",
    "cheating": "do_not_rerun",
    "still_running": "wait",
}


def failure_causes(trajectories: pl.DataFrame, steps: pl.DataFrame, cheaters: pl.Series) -> pl.DataFrame:
    """``session_id``, ``failure_cause``, ``retry_advice`` for every session.

    Args:
        trajectories: session_id, status, exit_reason, eval_passed, n_missing_seq.
        steps: session_id, step_index, failure_reason (the last step's decides a tail failure).
        cheaters: session ids with a confirmed cheat flag.
    """
    last = (
        steps.sort("session_id", "step_index")
        .group_by("session_id")
        .agg(pl.col("failure_reason").last().alias("last_failure"))
    )
    status = pl.col("status").fill_null("")
    reason = pl.col("exit_reason").fill_null("").str.to_lowercase()
    cause = (
        pl.when(pl.col("session_id").is_in(cheaters.implode()))
        .then(pl.lit("cheating"))
        .when(pl.col("eval_passed").fill_null(False))
        .then(pl.lit("success"))
        .when(status == "running")
        .then(pl.lit("still_running"))
        .when(
            (status == "error")
            | reason.str.contains("sandbox died|infra|oom|crash|host")
            | (reason == "idle_timeout")  # no session_end: the host or its stream was lost
            | pl.col("last_failure").is_not_null()
        )
        .then(pl.lit("infrastructure_error"))
        .when((status == "timeout") | (reason == "reaper"))
        .then(pl.lit("reaper_timeout"))
        .when(status == "gave_up")
        .then(pl.lit("agent_gave_up"))
        .otherwise(pl.lit("wrong_answer"))
    )
    return (
        trajectories.select("session_id", "status", "exit_reason", "eval_passed")
        .join(last, on="session_id", how="left")
        .select("session_id", cause.alias("failure_cause"))
        .with_columns(pl.col("failure_cause").replace_strict(RETRY_ADVICE).alias("retry_advice"))
    )
