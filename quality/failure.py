"""Why a session did not succeed, and whether rerunning it can help.

Environment failures (the sandbox, the host or the model API broke, the session was lost) are
worth a rerun; capability failures (wrong answer, gave up, cheated) are not — rerunning only
burns compute on the same policy. A reaper timeout is ambiguous (a hung agent or a slow
machine), so it gets one rerun. A run that hit its framework's step, cost or context limit is
``limit_reached``; a run nobody evaluated is ``unevaluated`` (never ``wrong_answer``: nothing
says it was wrong); a custom agent whose own code raised is ``agent_crashed`` (a bug of the agent
harness, not a decision of the policy). A model endpoint that refused the request as configured (a
wrong model name, key or path: HTTP 401/403/404) is ``configuration_error``: rerunning repeats it
until the configuration changes. The framework's own exit status stays in ``exit_reason``.

The **outcome** (:func:`outcome`) is what an export selects by: ``success`` (evaluated, passed,
not voided by a flag, not ended by a crash), ``failure`` (evaluated and not a success: a wrong
answer, a cap, giving up, a voided verdict), and three that carry no signal about the policy:
``infrastructure`` (the sandbox, host or model API broke — a configuration error too —, or the
reaper killed it), ``agent_crash`` and ``unevaluated``; ``running`` until the session ends.
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
    "agent_crashed": "fix_agent",
    "still_running": "wait",
}

#: Outcomes an export chooses among (see :func:`outcome`).
OUTCOMES = ("success", "failure", "unevaluated", "infrastructure", "agent_crash", "running")
#: Outcomes with a verdict about the policy (what ``--outcome any`` exports).
EVALUATED_OUTCOMES = ("success", "failure")
#: The live fleet's exit reason of a custom agent whose code raised (``producers.fleet.local``).
AGENT_RAISED = "agent_raised"

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
        .when((status == "failed") & (reason == AGENT_RAISED))
        .then(pl.lit("agent_crashed"))
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


def outcome(
    failure_cause: pl.Expr = pl.col("failure_cause"),
    status: pl.Expr = pl.col("status"),
    exit_reason: pl.Expr = pl.col("exit_reason"),
    eval_passed: pl.Expr = pl.col("eval_passed"),
    reward: pl.Expr = pl.col("reward"),
) -> pl.Expr:
    """The session's outcome (one of :data:`OUTCOMES`) from its failure cause and how it ended.

    A passing verdict does not make a crashed session a success: a session whose agent raised, or
    that ended in an environment or configuration error, is ``agent_crash`` / ``infrastructure``
    whatever the evaluator found afterwards (its trajectory stops where the crash cut it), so it is
    neither an RL episode nor an SFT example.
    """
    reason = exit_reason.fill_null("").str.to_lowercase()
    state = status.fill_null("")
    crashed = (state == "failed") & (reason == AGENT_RAISED)
    # a configuration error (the endpoint refused the request as configured) says nothing about the policy
    # either, even when an evaluator passed what the session left behind
    broken = failure_cause.is_in(["infrastructure_error", "reaper_timeout", "configuration_error"]) | (
        (failure_cause == "success")
        & (
            (state == "error")
            | (reason == "idle_timeout")
            | reason.str.contains(INFRASTRUCTURE_PATTERN)
            | reason.str.contains(CONFIGURATION_PATTERN)
        )
    )
    return (
        pl.when(failure_cause == "still_running")
        .then(pl.lit("running"))
        .when(crashed | (failure_cause == "agent_crashed"))
        .then(pl.lit("agent_crash"))
        .when(broken)
        .then(pl.lit("infrastructure"))
        .when(eval_passed.is_null() & reward.is_null())
        .then(pl.lit("unevaluated"))
        .when((failure_cause == "success") & eval_passed.fill_null(False))
        .then(pl.lit("success"))
        .otherwise(pl.lit("failure"))
    )
