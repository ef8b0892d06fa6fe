"""Level 2 of scoring: a session compared with others, from stored facts only (see :mod:`quality.facts`).

- z-scores and ``behaviour_anomaly`` flags against a **baseline**: the session's profile (origin and
  task family: :func:`quality.anomalies.profile_key`) on the previous day (its ``started_at`` date,
  UTC) when that day has at least ``min_profile_sessions`` sessions of it, else the profile on the
  session's own day (a young or sparse lakehouse); a smaller baseline scores nothing. At scale a new
  session is compared with a completed day, so scoring it changes no other session's z-score;
- novelty against the ``novelty_max_history`` most recent earlier trajectories of its family;
- completion, validity, quality (see :mod:`quality.scoring`);
- duplicate clusters over a closed set of sessions (complete old clusters plus the candidates
  new sessions' LSH band keys found), their representatives, and exportability.

Each function takes exactly the rows its answer depends on, so a caller holding a subset of
history (the incremental scorer) gets the same answer as one holding all of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import polars as pl

from quality.anomalies import FEATURES, MIN_GROUP, anomaly_flags
from quality.cheats import FLAGS_SCHEMA
from quality.config import QualityConfig
from quality.dedup import DUPLICATES_SCHEMA, Documents, estimated_similarity, find_duplicates, task_keys
from quality.facts import signatures_of
from quality.failure import outcome

LOOP_PENALTY = 0.4
STEPS_PENALTY = 0.3

#: ``scores`` rows before exportability's dependence on duplicate clusters (``exportable_base``).
_COMBINED_SCHEMA_TYPES: dict[str, pl.DataType | type[pl.DataType]] = {
    "session_id": pl.Utf8,
    "task_id": pl.Utf8,
    "task_type": pl.Utf8,
    "completion": pl.Float64,
    "validity": pl.Float64,
    "novelty": pl.Float64,
    "quality": pl.Float64,
    # the arithmetic behind quality: raw_quality (the weighted sum) × governance_weight = quality;
    # weight_flag is the flag whose governance weight applied (None when no flag lowered it)
    "raw_quality": pl.Float64,
    "governance_weight": pl.Float64,
    "weight_flag": pl.Utf8,
    "has_loop": pl.Boolean,
    "steps_z": pl.Float64,
    "n_cheat_flags": pl.Int64,
    "security_flagged": pl.Boolean,
    "failure_cause": pl.Utf8,
    "retry_advice": pl.Utf8,
    "outcome": pl.Utf8,  # quality.failure.OUTCOMES: what an export selects by
    "exportable_base": pl.Boolean,
    "flags": pl.Utf8,
    "task_family": pl.Utf8,
    "started_at": pl.Datetime("us", "UTC"),
}
COMBINED_SCHEMA = pl.Schema(_COMBINED_SCHEMA_TYPES)
PROFILE_GROUP = ["profile", "day"]
# Floor of the robust σ on the log scale: integer-valued features (often all equal) would
# otherwise have MAD = 0 and make any difference infinitely anomalous. At 0.5 a session must differ
# from its profile's median by a factor of e^1.75 ≈ 5.8 (log1p scale) to pass 3.5 σ: one step where
# the others need twenty does, four file writes where the others make one do not (0.25 flagged 25 %
# of the honest synthetic sessions of 50-session profiles, 0.5 flags 2 % besides the hang policy's:
# docs/quality.md).
MIN_SCALE = 0.5


@dataclass
class Combined:
    """Level-2 output for a set of sessions."""

    scores: pl.DataFrame  # COMBINED_SCHEMA
    anomaly_flags: pl.DataFrame  # FLAGS_SCHEMA


def novelty(targets: pl.DataFrame, context: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """``session_id``, ``novelty`` of each target: 1 − its highest similarity to an earlier trajectory of its family.

    Args:
        targets: session_id of the sessions to answer for.
        context: session_id, family, started_at, signature — for each family, every session from
            ``novelty_max_history`` before the first target to the last target (in the order
            family, started_at, session_id). Extra rows are harmless.
        config: the history depth and signature size.
    """
    ordered = context.unique("session_id").sort("family", "started_at", "session_id", nulls_last=True)
    signatures = signatures_of(ordered["signature"], config.num_perm)
    rank = ordered.select(pl.int_range(pl.len()).over("family").alias("rank"))["rank"].to_numpy()
    best = np.zeros(ordered.height)
    max_rank = int(rank.max()) if ordered.height else 0
    # only the targets' rows are answered (the context around them can be far larger)
    wanted = ordered["session_id"].is_in(targets["session_id"].implode()).to_numpy()
    rows = np.arange(ordered.height)
    for offset in range(1, min(max_rank, config.novelty_max_history) + 1):
        later = rows[(rank >= offset) & wanted]
        earlier = later - offset
        sim = estimated_similarity(signatures, later, earlier)
        best[later] = np.maximum(best[later], sim)
    out = ordered.select("session_id").with_columns(pl.Series("novelty", np.round(1.0 - best, 4)))
    return targets.select("session_id").join(out, on="session_id", how="left")


GROUP = ["profile", "day"]


def baseline_days(counts: pl.DataFrame, min_group: int = MIN_GROUP) -> pl.DataFrame:
    """``profile``, ``day``, ``baseline_day`` for each group of ``counts`` (profile, day, n).

    The baseline is the previous calendar day when it holds at least ``min_group`` sessions of the
    profile, else the day itself.
    """
    counts = counts.with_columns(pl.col("profile").fill_null("unknown"))
    previous = counts.select("profile", (pl.col("day") + timedelta(days=1)).alias("day"), pl.col("n").alias("prev"))
    return (
        counts.join(previous, on=GROUP, how="left", nulls_equal=True)
        .select(
            *GROUP,
            pl.when(pl.col("prev").fill_null(0) >= min_group)
            .then(pl.col("day") - timedelta(days=1))
            .otherwise(pl.col("day"))
            .alias("baseline_day"),
        )
        .unique(GROUP)
    )


def _log_scale_aggs() -> list[pl.Expr]:
    """Per group: median and robust σ (1.4826 × MAD) of each feature on the log1p scale."""
    aggs: list[pl.Expr] = []
    for name in FEATURES:
        x = pl.col(name).log1p()
        aggs.append(x.median().alias(f"{name}_log_median"))
        aggs.append(((x - x.median()).abs().median() * 1.4826).alias(f"{name}_log_sigma"))
    return aggs


def baseline_of(profiles: pl.DataFrame) -> pl.DataFrame:
    """The baseline stats (profile, baseline_day, n, m_*, s_*: median and robust σ) of :func:`profiles` rows."""
    return profiles.select(
        "profile",
        pl.col("day").alias("baseline_day"),
        pl.col("sessions").alias("n"),
        *[
            pl.col(f"{name}_log_{stat}").alias(f"{short}_{name}")
            for name in FEATURES
            for stat, short in (("median", "m"), ("sigma", "s"))
        ],
    )


def z_scores(
    facts: pl.DataFrame, baselines: pl.DataFrame, stats: pl.DataFrame, min_group: int = MIN_GROUP
) -> pl.DataFrame:
    """``facts``' features with ``z_<feature>`` columns against their baseline (0 when it is smaller than MIN_GROUP)."""
    frame = (
        facts.select("session_id", pl.col("profile").fill_null("unknown"), "day", *FEATURES)
        .join(baselines, on=GROUP, how="left", nulls_equal=True)
        .join(stats, on=["profile", "baseline_day"], how="left", nulls_equal=True)
    )
    exprs = []
    for name in FEATURES:
        scale = pl.max_horizontal(pl.col(f"s_{name}"), pl.lit(MIN_SCALE))
        exprs.append(
            pl.when(pl.col("n").fill_null(0) >= min_group)
            # rounded: vectorized log1p can differ in the last bit with an element's place in its
            # array, and an incremental run holds other rows than a full one (z to 1e-9 is plenty)
            .then(((pl.col(name).log1p() - pl.col(f"m_{name}")) / scale).round(9))
            .otherwise(0.0)
            .alias(f"z_{name}")
        )
    return frame.with_columns(exprs).select("session_id", "profile", "day", *FEATURES, *[f"z_{n}" for n in FEATURES])


def combine(
    facts: pl.DataFrame,
    context: pl.DataFrame,
    config: QualityConfig,
    baselines: pl.DataFrame,
    stats: pl.DataFrame,
) -> Combined:
    """Scores (before clusters) and anomaly flags of ``facts``.

    Args:
        facts: :data:`quality.facts.FACTS_SCHEMA` rows of the sessions to score.
        context: what :func:`novelty` needs for these sessions.
        config: weights, thresholds and governance.
        baselines: :func:`baseline_days` of (at least) the groups of ``facts``.
        stats: :func:`baseline_of` the profiles of (at least) those baseline days.
    """
    features = z_scores(facts, baselines, stats, config.min_profile_sessions)
    anomalies = anomaly_flags(features, config.outlier_z)
    anomaly_weight = config.policies().get("behaviour_anomaly")
    weight_of_anomaly = anomaly_weight.weight if anomaly_weight and anomaly_weight.weight is not None else 1.0
    novel = novelty(facts, context, config)
    base = (
        facts.join(features.select("session_id", pl.col("z_n_steps").alias("steps_z")), on="session_id", how="left")
        .join(novel, on="session_id", how="left")
        .with_columns(
            pl.when(pl.col("session_id").is_in(anomalies["session_id"].implode()))
            .then(pl.min_horizontal(pl.col("cheat_weight"), pl.lit(weight_of_anomaly)))
            .otherwise(pl.col("cheat_weight"))
            .alias("flag_weight")
        )
    )
    evaluator = pl.coalesce(pl.col("reward").cast(pl.Float64), pl.col("eval_passed").cast(pl.Float64), pl.lit(0.0))
    completion = pl.when(pl.col("cheat_confirmed")).then(0.0).otherwise(evaluator.clip(0.0, 1.0))
    bad_end = pl.col("failure_cause").is_in(
        ["infrastructure_error", "configuration_error", "reaper_timeout", "still_running"]
    )
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
    raw = (
        config.w_completion * pl.col("completion")
        + config.w_validity * pl.col("validity")
        + config.w_novelty * pl.col("novelty").fill_null(1.0)
    )
    scored = (
        base.join(_weight_flags(facts, anomalies, config), on="session_id", how="left")
        .with_columns(completion.alias("completion"), validity.alias("validity"))
        .with_columns(
            pl.col("novelty").fill_null(1.0),
            (raw * pl.col("flag_weight")).round(6).alias("quality"),
            raw.round(6).alias("raw_quality"),
            pl.col("flag_weight").alias("governance_weight"),
        )
    )
    scores = (
        scored.with_columns(outcome().alias("outcome"))
        .with_columns(
            # a training example is a verified success: a failure is never exportable, whatever its
            # validity and novelty make its quality (rl exports choose failures by outcome instead)
            (
                (pl.col("quality") >= config.min_quality)
                & ~pl.col("security_flagged")
                & (pl.col("outcome") == "success")
            ).alias("exportable_base"),
            pl.col("flag_names").alias("flags"),
        )
        .select(list(COMBINED_SCHEMA))
        .cast(COMBINED_SCHEMA)
        .sort("session_id")
    )
    return Combined(scores, anomalies.cast(FLAGS_SCHEMA).sort("session_id", "flag"))


def _weight_flags(facts: pl.DataFrame, anomalies: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """``session_id``, ``weight_flag``: the flag whose governance weight (below 1) multiplies each session's
    quality — its detector flag of the smallest weight, or ``behaviour_anomaly`` when that weighs less
    (ties: the detector flag, then by name); no row for a session no flag lowered."""
    weights = {name: 1.0 if p.weight is None else float(p.weight) for name, p in config.policies().items()}
    named = facts.select("session_id", pl.col("flag_names").str.split(",").alias("flag")).explode("flag")
    anomalous = anomalies.select("session_id").unique().with_columns(pl.lit("behaviour_anomaly").alias("flag"))
    return (
        pl.concat([named.with_columns(pl.lit(0).alias("kind")), anomalous.with_columns(pl.lit(1).alias("kind"))])
        .filter(pl.col("flag").is_not_null() & (pl.col("flag") != ""))
        .with_columns(pl.col("flag").replace_strict(weights, default=1.0, return_dtype=pl.Float64).alias("weight"))
        .filter(pl.col("weight") < 1.0)
        .sort("session_id", "weight", "kind", "flag")
        .group_by("session_id", maintain_order=True)
        .first()
        .select("session_id", pl.col("flag").alias("weight_flag"))
    )


def profiles(members: pl.DataFrame) -> pl.DataFrame:
    """Per (profile, day) of ``members`` (complete groups of facts): sessions, p50 and p90 of each feature,
    the baseline's median and robust σ of each on the log1p scale (the z-scores of the next day's
    sessions are against them: :func:`baseline_of`), tool mix and step exit codes (JSON shares)."""
    members = members.with_columns(pl.col("profile").fill_null("unknown"))
    stats = members.group_by(PROFILE_GROUP).agg(
        pl.len().cast(pl.Int64).alias("sessions"),
        *[pl.col(c).median().alias(f"{c}_p50") for c in FEATURES],
        *[pl.col(c).quantile(0.9).alias(f"{c}_p90") for c in FEATURES],
        *_log_scale_aggs(),
    )
    mix = None
    for column, name in (("tool_counts", "tool_mix"), ("exit_code_counts", "exit_codes")):
        shares = _shares(members, column, name)
        mix = shares if mix is None else mix.join(shares, on=PROFILE_GROUP, how="full", coalesce=True, nulls_equal=True)
    assert mix is not None
    return stats.join(mix, on=PROFILE_GROUP, how="left", nulls_equal=True).sort(PROFILE_GROUP)


def _shares(members: pl.DataFrame, column: str, name: str) -> pl.DataFrame:
    """Per group: the JSON share of each key of the per-session JSON counts in ``column`` (keys sorted)."""
    # sessions repeat the same few count objects: parse each distinct one once
    distinct = members.group_by(*PROFILE_GROUP, column).len("sessions")
    totals: dict[tuple[object, object], dict[str, int]] = {}
    for profile, day, raw, sessions in distinct.iter_rows():
        group = totals.setdefault((profile, day), {})
        for key, n in json.loads(raw or "{}").items():
            group[key] = group.get(key, 0) + n * sessions
    rows = []
    for (profile, day), counts in totals.items():
        total = sum(counts.values())
        text = json.dumps({k: round(v / total, 4) for k, v in sorted(counts.items())}) if total else None
        rows.append({"profile": profile, "day": day, name: text})
    return pl.DataFrame(rows, schema={"profile": pl.Utf8, "day": pl.Date, name: pl.Utf8})


def clusters(members: pl.DataFrame, ranking: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """Duplicate clusters of a closed set of sessions (no duplicate link leaves it).

    Documents are taken in arrival order — by start, then session id (no start: last) — so an LSH
    bucket's first row, which every other member of the bucket is compared with, is its earliest
    session: a later session joining a bucket adds a link and changes none (what lets
    :mod:`pipelines.score` update clusters from new sessions alone).

    Args:
        members: session_id, exact_key, signature, started_at, and task_id (near-duplicates only
            within a task; without the column, across tasks).
        ranking: session_id, quality, started_at (the representative: best quality, then earliest,
            then smallest id; a session without a quality yet ranks last).
        config: LSH parameters and threshold.

    Returns:
        :data:`quality.dedup.DUPLICATES_SCHEMA` rows for sessions in clusters of two or more.
    """
    if members.height < 2:
        return pl.DataFrame(schema=DUPLICATES_SCHEMA)
    ordered = members.unique("session_id").sort("started_at", "session_id", nulls_last=True)
    firsts = ordered.unique("exact_key", keep="first", maintain_order=True).with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("exact_group")
    )
    sessions = ordered.join(
        firsts.select("exact_key", "exact_group"), on="exact_key", how="left", maintain_order="left"
    ).select("session_id", "exact_key", "exact_group")
    scopes = task_keys(firsts["task_id"]) if "task_id" in firsts.columns else None
    docs = Documents(sessions, signatures_of(firsts["signature"], config.num_perm), scopes)
    return find_duplicates(docs, ranking, config)


def exportable(scores: pl.DataFrame, duplicates: pl.DataFrame) -> pl.Series:
    """``exportable_base`` and not a non-representative duplicate, per row of ``scores``."""
    shadowed = duplicates.filter(~pl.col("is_representative"))["session_id"]
    return scores.select(pl.col("exportable_base") & ~pl.col("session_id").is_in(shadowed.implode()))["exportable_base"]
