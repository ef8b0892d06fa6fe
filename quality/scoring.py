"""Scores per session and the whole quality run (flags → scores → duplicates) as one pure function.

- completion: the evaluator's reward (else its pass/fail); 0 when a flag voids the verdict
  (its governance says so, or its effect reached the evaluated deliverable: ``confirmed``).
- validity: 1, minus ``LOOP_PENALTY`` for a loop of identical actions (transient environment
  failures excluded: a harness retry is not a loop), minus ``STEPS_PENALTY`` for a step count
  implausible for the task type (robust z within its task type and day beyond the outlier
  threshold); 0 when the session was ended by an infrastructure failure or the reaper, or has not ended.
- novelty: 1 − the highest similarity to an earlier trajectory of the same task family.
- quality: ``raw_quality`` = ``w_c·completion + w_v·validity + w_n·novelty``, × ``governance_weight``,
  the smallest governance weight of the session's flags (a suspicion is down-weighted, not dropped),
  set by ``weight_flag``. Each row carries its weights and ``min_quality``, so the arithmetic reads
  back from the row (``trajlake show``, the report and ``SELECT … FROM scores`` show it).
- outcome: ``success``, ``failure``, ``unevaluated``, ``infrastructure``, ``agent_crash`` or
  ``running`` (:func:`quality.failure.outcome`).
- exportable: a verified success (outcome ``success``), quality ≥ ``min_quality``, no security
  flag, and not a non-representative duplicate. The record carries the session's flags (``scores.flags``).

:func:`score_sessions` runs both levels (:mod:`quality.facts`, :mod:`quality.combine`) over one set
of sessions in memory; ``pipelines/score/`` computes the same tables incrementally.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from quality.cheats import FLAGS_SCHEMA
from quality.combine import (
    COMBINED_SCHEMA,
    LOOP_PENALTY,
    STEPS_PENALTY,
    baseline_days,
    baseline_of,
    clusters,
    combine,
    exportable,
    profiles,
)
from quality.config import QualityConfig
from quality.dedup import DUPLICATES_SCHEMA
from quality.facts import session_facts

__all__ = ["LOOP_PENALTY", "SCORES_SCHEMA", "STEPS_PENALTY", "QualityResult", "score_sessions"]

#: ``scores`` rows: level 2's, with ``exportable`` (clusters applied) for ``exportable_base``, and the configuration.
_SCORES_TYPES: dict[str, pl.DataType | type[pl.DataType]] = {
    ("exportable" if k == "exportable_base" else k): v for k, v in COMBINED_SCHEMA.items()
}
#: The configuration each row was scored with, so that its arithmetic can be read back from the row.
SCORE_CONFIG_COLUMNS = ("w_completion", "w_validity", "w_novelty", "min_quality")
SCORES_SCHEMA = pl.Schema(
    {
        **_SCORES_TYPES,
        "scorer_version": pl.Utf8,
        "config_digest": pl.Utf8,
        **dict.fromkeys(SCORE_CONFIG_COLUMNS, pl.Float64),
    }
)


@dataclass
class QualityResult:
    """Everything one quality run produces (frames in the table schemas)."""

    scores: pl.DataFrame
    flags: pl.DataFrame
    duplicates: pl.DataFrame
    profiles: pl.DataFrame


def finish_scores(combined: pl.DataFrame, duplicates: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """:data:`SCORES_SCHEMA` rows from level-2 scores and the duplicate clusters they are in."""
    return (
        combined.with_columns(
            exportable(combined, duplicates).alias("exportable"),
            pl.lit(config.scorer_version).alias("scorer_version"),
            pl.lit(config.digest()).alias("config_digest"),
            *[pl.lit(float(getattr(config, name))).alias(name) for name in SCORE_CONFIG_COLUMNS],
        )
        .select(list(SCORES_SCHEMA))
        .cast(SCORES_SCHEMA)
        .sort("session_id")
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
        :class:`QualityResult`; ``scores`` has one row per session, ``profiles`` one per (profile, day).
    """
    config = config or QualityConfig()
    level1 = session_facts(trajectories, steps, file_ops, network, config, sessions)
    facts = level1.facts
    counts = facts.group_by(pl.col("profile").fill_null("unknown"), "day").agg(pl.len().alias("n"))
    baselines = baseline_days(counts, config.min_profile_sessions)
    day_profiles = profiles(facts)
    level2 = combine(
        facts,
        facts.select("session_id", "family", "started_at", "signature"),
        config,
        baselines,
        baseline_of(day_profiles),
    )
    ranking = level2.scores.select("session_id", "quality", "started_at")
    duplicates = clusters(
        facts.select("session_id", "exact_key", "signature", "started_at", "task_id"), ranking, config
    )
    flags = pl.concat([level1.cheat_flags, level2.anomaly_flags]).cast(FLAGS_SCHEMA).sort("session_id", "flag")
    return QualityResult(
        scores=finish_scores(level2.scores, duplicates, config),
        flags=flags,
        duplicates=duplicates.cast(DUPLICATES_SCHEMA).sort("cluster_id", "session_id"),
        profiles=day_profiles,
    )
