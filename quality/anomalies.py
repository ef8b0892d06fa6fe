"""Behaviour features per session and the anomaly flags of their robust outlier scores.

An agent is compared with the other agents on the same kind of task: a session's **profile** is its
origin and task family (:func:`profile_key`, e.g. ``sandbox/bugfix.clamp``), so synthetic load is
never a baseline of real runs, nor an import of a sandbox session. Features are compared on a
``log1p`` scale against the median of the session's baseline (its profile on the previous or its
own day: :mod:`quality.combine`), scaled by the median absolute deviation (MAD × 1.4826, a robust
σ). A session whose largest |z| passes the configured threshold gets an ``anomaly`` flag with that
score — e.g. a one-step success where the profile's median is twenty steps. Resource features
(:data:`HIGH_SIDE_ONLY`) count only above the median: using less of a resource is no anomaly.

A profile flags nothing until it has :data:`MIN_GROUP` sessions (docs/quality.md, "Behaviour
anomalies", has the measurement): with fewer, the median and MAD of the baseline are too unstable
for a 3.5 σ threshold over eleven features — an honest session drawn from the baseline's own
distribution would be flagged more than 5 % of the time.
"""

from __future__ import annotations

import json

import polars as pl

from quality.cheats import FLAGS_SCHEMA
from quality.config import MIN_GROUP

#: Features per session from the trajectories table (runtime, CPU, peak memory, processes started,
#: bytes written, outbound attempts: what a session did, compared within its task type).
TRAJECTORY_FEATURES = [
    "n_steps",
    "duration_s",
    "n_file_writes",
    "disk_write_bytes",
    "cpu_seconds",
    "peak_memory_bytes",
    "peak_processes",
    "processes_started",
    "n_network_requests",
]
#: Features per session (log1p scale for scoring); the last two come from the steps.
FEATURES = [*TRAJECTORY_FEATURES, "error_rate", "run_tests_share"]
#: Features that count on their high side only: using far less of a resource than the profile
#: (nothing written, a low memory peak, no process started) is not worth a look — a session that
#: hung or gave up early does that, and its status already says so (the fleet's honest ``hang``
#: policy was flagged on every session for ``disk_write_bytes`` 0). Steps, duration, error rate and
#: test-run share count both ways: one step where the others need twenty is the anomaly to see.
HIGH_SIDE_ONLY = frozenset(TRAJECTORY_FEATURES) - {"n_steps", "duration_s"}
__all__ = [
    "FEATURES",
    "HIGH_SIDE_ONLY",
    "MIN_GROUP",
    "TRAJECTORY_FEATURES",
    "anomaly_flags",
    "profile_key",
    "session_features",
]


def profile_key() -> pl.Expr:
    """A session's behaviour profile: ``origin/task family`` (task type, else ``unknown``, without a family).

    Reads the frame's ``origin`` (null: ``unknown``), ``task_family`` and ``task_type`` columns.
    """
    return pl.concat_str(
        pl.col("origin").fill_null("unknown"),
        pl.lit("/"),
        pl.coalesce(pl.col("task_family"), pl.col("task_type"), pl.lit("unknown")),
    )


def session_features(trajectories: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """One row per session: ``session_id``, ``task_type`` and :data:`FEATURES`.

    Args:
        trajectories: the ``trajectories`` columns session_id, task_type and :data:`TRAJECTORY_FEATURES`
            (a missing feature column counts as 0).
        steps: session_id, tool_name, exit_code.
    """
    per_session = steps.group_by("session_id").agg(
        (pl.col("exit_code").fill_null(0) != 0).mean().alias("error_rate"),
        (pl.col("tool_name") == "run_tests").mean().alias("run_tests_share"),
    )
    missing = [c for c in TRAJECTORY_FEATURES if c not in trajectories.columns]
    return (
        trajectories.with_columns(*[pl.lit(None, pl.Float64).alias(c) for c in missing])
        .select(
            "session_id",
            pl.col("task_type").fill_null("unknown"),
            *[pl.col(c).cast(pl.Float64).fill_null(0.0) for c in TRAJECTORY_FEATURES],
        )
        .join(per_session, on="session_id", how="left")
        .with_columns(pl.col("error_rate").fill_null(0.0), pl.col("run_tests_share").fill_null(0.0))
    )


def anomaly_flags(scored: pl.DataFrame, threshold: float) -> pl.DataFrame:
    """Flags for sessions whose largest |z| exceeds ``threshold``.

    Args:
        scored: the features with their ``z_<feature>`` columns (:func:`quality.combine.z_scores`).
        threshold: robust z above which a session is anomalous.

    Returns:
        Rows in the flags schema: flag ``behaviour_anomaly``, class ``anomaly``, severity ``low``
        (``medium`` above twice the threshold), score = the largest counted |z|, evidence = the
        features beyond the threshold with value and z.
    """
    zcols = [f"z_{c}" for c in FEATURES]
    # the distance that counts per feature: |z|, or only z above the median for HIGH_SIDE_ONLY
    scored = scored.with_columns(
        (pl.col(f"z_{c}").clip(lower_bound=0.0) if c in HIGH_SIDE_ONLY else pl.col(f"z_{c}").abs()).alias(f"d_{c}")
        for c in FEATURES
    )
    top = scored.with_columns(pl.max_horizontal([pl.col(f"d_{c}") for c in FEATURES]).alias("score")).filter(
        pl.col("score") > threshold
    )
    if top.is_empty():
        return pl.DataFrame(schema=FLAGS_SCHEMA)
    evidence = []
    for row in top.select("session_id", *FEATURES, *zcols, *[f"d_{c}" for c in FEATURES]).iter_rows(named=True):
        beyond = {
            name: {"value": round(row[name], 4), "z": round(row[f"z_{name}"], 2)}
            for name in FEATURES
            if row[f"d_{name}"] > threshold
        }
        evidence.append(json.dumps({"features": beyond}, sort_keys=True))
    return top.select(
        "session_id",
        pl.lit("behaviour_anomaly").alias("flag"),
        pl.lit("anomaly").alias("flag_class"),
        pl.when(pl.col("score") > 2 * threshold).then(pl.lit("medium")).otherwise(pl.lit("low")).alias("severity"),
        pl.Series("evidence", evidence, dtype=pl.Utf8),
        pl.col("score").round(3),
        pl.lit(False).alias("confirmed"),
    ).cast(FLAGS_SCHEMA)
