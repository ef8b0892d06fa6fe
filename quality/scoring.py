"""Scores per session and the whole quality run (flags → scores → duplicates) as one pure function.

- completion: the evaluator's reward (else its pass/fail); 0 when a flag voids the verdict
  (its governance says so, or its effect reached the evaluated deliverable: ``confirmed``).
- validity: 1, minus ``LOOP_PENALTY`` for a loop of identical actions (transient environment
  failures excluded: a harness retry is not a loop), minus ``STEPS_PENALTY`` for a step count
  implausible for the task type (robust z beyond the outlier threshold); 0 when the session
  was ended by an infrastructure failure or the reaper, or has not ended.
- novelty: 1 − the highest similarity to an earlier trajectory of the same task family.
- quality: ``w_c·completion + w_v·validity + w_n·novelty``, × the smallest governance weight of the
  session's flags (a suspicion is down-weighted, not dropped).
- exportable: quality ≥ ``min_quality``, no security flag, ended, and not a non-representative
  duplicate. The record carries the session's flags (``scores.flags``).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from quality.anomalies import anomaly_flags, behaviour_profiles, robust_z, session_features
from quality.cheats import FLAGS_SCHEMA, detect_cheats
from quality.config import QualityConfig
from quality.dedup import DUPLICATES_SCHEMA, action_tokens, build_documents, find_duplicates, novelty
from quality.failure import failure_causes

LOOP_PENALTY = 0.4
STEPS_PENALTY = 0.3

SCORES_SCHEMA = pl.Schema(
    {
        "session_id": pl.Utf8,
        "task_id": pl.Utf8,
        "task_type": pl.Utf8,
        "completion": pl.Float64,
        "validity": pl.Float64,
        "novelty": pl.Float64,
        "quality": pl.Float64,
        "has_loop": pl.Boolean,
        "steps_z": pl.Float64,
        "n_cheat_flags": pl.Int64,
        "security_flagged": pl.Boolean,
        "failure_cause": pl.Utf8,
        "retry_advice": pl.Utf8,
        "exportable": pl.Boolean,
        "scorer_version": pl.Utf8,
        "flags": pl.Utf8,
        "task_family": pl.Utf8,
        "config_digest": pl.Utf8,
    }
)


@dataclass
class QualityResult:
    """Everything one quality run produces (frames in the table schemas)."""

    scores: pl.DataFrame
    flags: pl.DataFrame
    duplicates: pl.DataFrame
    profiles: pl.DataFrame


def longest_identical_run(tokens: pl.DataFrame) -> pl.DataFrame:
    """``session_id``, ``max_run``: longest run of identical consecutive actions (transient failures skipped).

    Args:
        tokens: :func:`quality.dedup.action_tokens` of the steps.
    """
    actions = tokens.filter(pl.col("failure_reason").is_null())
    changed = (pl.col("token") != pl.col("token").shift(1)) | (pl.col("session_id") != pl.col("session_id").shift(1))
    runs = actions.select("session_id", changed.fill_null(True).cum_sum().alias("run"))
    return (
        runs.group_by("run")
        .agg(pl.col("session_id").first(), pl.len())
        .group_by("session_id")
        .agg(pl.col("len").max().alias("max_run"))
    )


def score_sessions(
    trajectories: pl.DataFrame,
    steps: pl.DataFrame,
    file_ops: pl.DataFrame,
    network: pl.DataFrame,
    config: QualityConfig | None = None,
    sessions: pl.DataFrame | None = None,
) -> QualityResult:
    """Flags, scores, duplicates and behaviour profiles for every session in ``trajectories``.

    Args:
        trajectories: the ``trajectories`` view (session_id, task_id, task_type, status, exit_reason,
            started_at, n_steps, duration_s, resource peaks, instruction, eval_passed, reward, …).
        steps: session_id, step_index, action_event_id, tool_name, command, exit_code, failure_reason.
        file_ops: session_id, event_id, op, path, in_workspace.
        network: session_id, event_id, host, port, allowed.
        config: weights, thresholds and the governance table.
        sessions: per-session context for the detectors (:data:`quality.cheats.SESSION_COLUMNS`).

    Returns:
        :class:`QualityResult`; ``scores`` has one row per session.
    """
    config = config or QualityConfig()
    # Work on integer session keys (sorted like the ids): string sorts, joins and group-bys over
    # millions of step rows dominate the run time otherwise. Outputs are decoded at the end.
    keys = trajectories.select("session_id").unique().sort("session_id").with_row_index("key")
    if "task_family" not in trajectories.columns:
        trajectories = trajectories.with_columns(pl.lit(None, pl.Utf8).alias("task_family"))
    trajectories, steps, file_ops, network = (_encode(f, keys) for f in (trajectories, steps, file_ops, network))
    # the detectors' per-session context, with the task statement (a file it names is the task's subject)
    statement = pl.col("instruction").cast(pl.Utf8) if "instruction" in trajectories.columns else pl.lit(None, pl.Utf8)
    context = trajectories.select("session_id", statement.alias("instruction"))
    if sessions is not None:
        given = _encode(sessions.drop("instruction", strict=False), keys)
        context = context.join(given, on="session_id", how="left")
    key_type = keys.schema["key"]
    policies = config.policies()
    cheat_flags = detect_cheats(steps, file_ops, network, context, config).with_columns(
        pl.col("session_id").cast(key_type)
    )
    features = robust_z(session_features(trajectories, steps))
    anomalies = anomaly_flags(features, config.outlier_z).with_columns(pl.col("session_id").cast(key_type))
    flags = pl.concat([cheat_flags, anomalies]).sort("session_id", "flag")
    governance = pl.DataFrame(
        {
            "flag": list(policies),
            "weight": [p.weight for p in policies.values()],
            "voids": [p.voids_verdict for p in policies.values()],
        },
        schema={"flag": pl.Utf8, "weight": pl.Float64, "voids": pl.Boolean},
    )
    per_session_flags = (
        flags.join(governance, on="flag", how="left")
        .group_by("session_id")
        .agg(
            (pl.col("flag_class") != "anomaly").sum().alias("n_cheat_flags"),
            (pl.col("flag_class") == "security").any().alias("security_flagged"),
            pl.col("weight").fill_null(1.0).min().alias("flag_weight"),
            ((pl.col("flag_class") != "anomaly") & (pl.col("voids").fill_null(False) | pl.col("confirmed")))
            .any()
            .alias("cheat_confirmed"),
            pl.col("flag").filter(pl.col("flag_class") != "anomaly").unique().sort().alias("flag_names"),
        )
    )
    confirmed = per_session_flags.filter("cheat_confirmed")["session_id"]
    causes = failure_causes(trajectories, steps, confirmed)
    tokens = action_tokens(steps)
    docs = build_documents(trajectories, steps, config, tokens)
    novel = novelty(docs, trajectories, config)
    runs = longest_identical_run(tokens)

    base = (
        trajectories.select(
            "session_id",
            "task_id",
            "task_type",
            "task_family",
            "status",
            "exit_reason",
            "started_at",
            "eval_passed",
            "reward",
        )
        .join(per_session_flags, on="session_id", how="left")
        .join(causes, on="session_id", how="left")
        .join(novel, on="session_id", how="left")
        .join(runs, on="session_id", how="left")
        .join(features.select("session_id", pl.col("z_n_steps").alias("steps_z")), on="session_id", how="left")
        .with_columns(
            pl.col("n_cheat_flags").fill_null(0).cast(pl.Int64),
            pl.col("security_flagged").fill_null(False),
            pl.col("flag_weight").fill_null(1.0),
            pl.col("cheat_confirmed").fill_null(False),
            (pl.col("max_run").fill_null(0) >= config.loop_run).alias("has_loop"),
        )
    )
    evaluator = pl.coalesce(pl.col("reward").cast(pl.Float64), pl.col("eval_passed").cast(pl.Float64), pl.lit(0.0))
    completion = pl.when(pl.col("cheat_confirmed")).then(0.0).otherwise(evaluator.clip(0.0, 1.0))
    bad_end = pl.col("failure_cause").is_in(["infrastructure_error", "reaper_timeout", "still_running"])
    validity = (
        pl.when(bad_end)
        .then(0.0)
        .otherwise(
            1.0
            - LOOP_PENALTY * pl.col("has_loop").cast(pl.Float64)
            - STEPS_PENALTY * (pl.col("steps_z").abs() > config.outlier_z).cast(pl.Float64)
        )
        .clip(0.0, 1.0)
    )
    scored = base.with_columns(completion.alias("completion"), validity.alias("validity")).with_columns(
        pl.col("novelty").fill_null(1.0),
        (
            (
                config.w_completion * pl.col("completion")
                + config.w_validity * pl.col("validity")
                + config.w_novelty * pl.col("novelty").fill_null(1.0)
            )
            * pl.col("flag_weight")
        )
        .round(6)
        .alias("quality"),
    )
    duplicates = find_duplicates(docs, scored, config)
    shadowed = duplicates.filter(~pl.col("is_representative"))["session_id"].cast(key_type)
    scores = (
        scored.with_columns(
            (
                (pl.col("quality") >= config.min_quality)
                & ~pl.col("security_flagged")
                & (pl.col("failure_cause") != "still_running")
                & ~pl.col("session_id").is_in(shadowed.implode())
            ).alias("exportable"),
            pl.lit(config.scorer_version).alias("scorer_version"),
            pl.col("flag_names").fill_null([]).list.join(",").alias("flags"),
            pl.lit(config.digest()).alias("config_digest"),
        )
        .select(list(SCORES_SCHEMA))
        .cast(SCORES_SCHEMA)
        .sort("session_id")
    )
    return QualityResult(
        scores=_decode(scores, keys, ["session_id"]).sort("session_id"),
        flags=_decode(flags.cast(FLAGS_SCHEMA), keys, ["session_id"]).sort("session_id", "flag"),
        duplicates=_decode(duplicates.cast(DUPLICATES_SCHEMA), keys, ["session_id", "cluster_id"]).sort(
            "cluster_id", "session_id"
        ),
        profiles=behaviour_profiles(features, steps, trajectories),
    )


def _encode(frame: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """Replace ``session_id`` by its integer key (rows of unknown sessions are dropped)."""
    columns = frame.columns
    return (
        frame.join(keys, on="session_id", how="inner").drop("session_id").rename({"key": "session_id"}).select(columns)
    )


def _decode(frame: pl.DataFrame, keys: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """Integer keys (possibly cast to strings) in ``columns`` back to session ids."""
    lookup = keys.select(pl.col("key").cast(pl.Utf8), pl.col("session_id").alias("_id"))
    order = frame.columns
    for column in columns:
        frame = (
            frame.with_columns(pl.col(column).cast(pl.Utf8))
            .join(lookup, left_on=column, right_on="key", how="left")
            .drop(column)
            .rename({"_id": column})
        )
    return frame.select(order)
