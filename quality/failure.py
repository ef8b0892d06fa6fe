"""Why a session did not succeed, and whether rerunning it can help.

Environment failures (the sandbox, the host or the model API broke, the session was lost) are
worth a rerun; capability failures (wrong answer, gave up, cheated) are not — rerunning only
burns compute on the same policy. A reaper timeout is ambiguous (a hung agent or a slow
machine), so it gets one rerun. A run that hit its framework's step, cost or context limit is
``limit_reached``; a run nobody evaluated is ``unevaluated`` (never ``wrong_answer``: nothing
says it was wrong). A model endpoint that refused the request as configured (a wrong model name,
key or path: HTTP 401/403/404) is ``configuration_error``: rerunning repeats it until the
configuration changes. The framework's own exit status stays in ``exit_reason``.
"""

from __future__ import annotations

import polars as pl

#: failure cause → retry advice
RETRY_ADVICE = {
    "success": "none",
    "infrastructure_error": "rerun",
    "configuration_error": "fix_configuration",
    "reaper_timeout": "rerun_once",
    "limit_reached": "rerun_with_higher_limits",
    "agent_gave_up": "do_not_rerun",
    "wrong_answer": "do_not_rerun",
    "unevaluated": "evaluate",
    "cheating": "do_not_rerun",
    "still_running": "wait",
}

#: Exit reasons of a broken environment or model API (case-insensitive regex): the framework's
#: exception names (litellm, openai, anthropic, httpx, docker), HTTP 5xx/429 and the fleet's own words.
INFRASTRUCTURE_PATTERN = (
    r"internalservererror|serviceunavailable|apiconnectionerror|apierror|apitimeouterror|badgateway|gatewaytimeout"
    r"|ratelimit|rate[ _-]limit|too many requests|overloaded|litellm\.timeout|timeout error|connection (?:timed out"
    r"|error|reset|refused|aborted)|connecterror|readtimeout|remoteprotocolerror|ssl|unexpected_eof|eof occurred"
    r"|\b(?:429|500|502|503|504|529)\b|sandbox died|infra|\boom\b|out of memory|crash|host lost|docker|container"
    r"|runtime (?:died|error)|agentruntime|environment (?:error|failed)"
    r"|^egress_monitor_failed$"  # the sandbox host's own monitor failed (it ended the session)
)
#: Exit reasons of a request the model endpoint refused as configured (the fleet's words; 401/403/404 answers).
CONFIGURATION_PATTERN = r"^model_config_error\b|authenticationerror|permissiondeniederror|notfounderror"
#: Exit reasons of a framework limit: steps, iterations, cost, tokens or context window.
LIMIT_PATTERN = (
    r"limitsexceeded|limit[s]? (?:reached|exceeded)|exit_cost|exit_context|exit_total_execution_time|cost limit"
    r"|step limit|step_limit|max[_ ]?iterations?|maximum iterations?|max_steps|context ?window|context length"
    r"|contextwindowexceeded|budget exceeded|token limit|max_tokens|time limit|time_limit|exceeded"
    r"|max_model_tokens|max_model_calls|max_cost_usd|^deadline$"  # the live fleet's own caps (status ``capped``)
    r"|agenttimeouterror"  # Harbor: the agent ran out of its time budget
    r"|^disk_quota$"  # the sandbox filled its writable layer (its host ended the session)
)


def failure_causes(trajectories: pl.DataFrame, steps: pl.DataFrame, cheaters: pl.Series) -> pl.DataFrame:
    """``session_id``, ``failure_cause``, ``retry_advice`` for every session.

    Args:
        trajectories: session_id, status, exit_reason, eval_passed (null: never evaluated).
        steps: session_id, step_index, failure_reason (the last step's decides a tail failure).
        cheaters: session ids whose verdict a flag voided (a confirmed cheat).

    Returns:
        One row per session of ``trajectories``.
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
        .when(reason.str.contains(CONFIGURATION_PATTERN))
        .then(pl.lit("configuration_error"))
        # a cap the producer says it hit (the fleet's caps, an importer's reading of the framework's own
        # exit status) is a limit even when the framework worded it as an error
        .when(status == "capped")
        .then(pl.lit("limit_reached"))
        .when(
            reason.str.contains(INFRASTRUCTURE_PATTERN)
            | (reason == "idle_timeout")  # no session_end: the host or its stream was lost
            | pl.col("last_failure").is_not_null()
            | ((status == "error") & ~reason.str.contains(LIMIT_PATTERN))
        )
        .then(pl.lit("infrastructure_error"))
        .when(reason.str.contains(LIMIT_PATTERN) | (status == "capped"))
        .then(pl.lit("limit_reached"))
        .when((status == "timeout") | (reason == "reaper"))
        .then(pl.lit("reaper_timeout"))
        .when(status == "gave_up")
        .then(pl.lit("agent_gave_up"))
        .when(pl.col("eval_passed").is_null())
        .then(pl.lit("unevaluated"))
        .otherwise(pl.lit("wrong_answer"))
    )
    return (
        trajectories.select("session_id", "status", "exit_reason", "eval_passed")
        .join(last, on="session_id", how="left")
        .select("session_id", cause.alias("failure_cause"))
        .with_columns(pl.col("failure_cause").replace_strict(RETRY_ADVICE).alias("retry_advice"))
    )
