"""Quality assets: scores, flags and duplicates, their checks, and the nightly training-set export.

The quality tables are eager: they follow every new assembly. The nightly job selects the
export *and* the quality tables it reads, so a run refreshes scores first; the blocking
``scores_in_range`` check then gates the export inside that run, and ``export_count`` checks
what was written against what the lakehouse says is exportable.
"""

import json
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetSelection,
    AssetSpec,
    AutomationCondition,
    DailyPartitionsDefinition,
    Definitions,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
    build_schedule_from_partitioned_job,
    define_asset_job,
    multi_asset,
    multiprocess_executor,
)

from dagster_project.resources import LakehouseResource, transient_retries
from pipelines.export import ExportOptions, export_training_set
from pipelines.export.select import origin_condition
from pipelines.report import write_report
from pipelines.score import index_days, score_all
from warehouse.lakehouse import Lakehouse

QUALITY_GROUP = "quality"
daily_partitions = DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC")


def _frame(lake: Lakehouse, query: str) -> pl.DataFrame:
    con = lake.views()
    try:
        return pl.DataFrame(con.sql(query).to_arrow_table())
    finally:
        con.close()


def _distribution(scores: pl.DataFrame, column: str) -> dict[str, float]:
    if scores.is_empty():
        return {}
    row = scores.select(
        pl.col(column).min().alias("min"),
        pl.col(column).quantile(0.1).alias("p10"),
        pl.col(column).median().alias("p50"),
        pl.col(column).quantile(0.9).alias("p90"),
        pl.col(column).max().alias("max"),
        pl.col(column).mean().alias("mean"),
    ).row(0, named=True)
    return {name: round(float(value), 4) for name, value in row.items()}


def _cost_metadata(lake: Lakehouse) -> dict[str, float]:
    """Whole-lakehouse cost figures from the ``costs`` view, as numbers the asset page plots per run."""
    row = _frame(
        lake,
        "SELECT sum(inference_cost_usd)::DOUBLE AS inference, sum(total_cost_usd)::DOUBLE AS total, "
        "sum(cached_tokens)::BIGINT AS cached, sum(input_tokens)::BIGINT AS inputs, "
        "sum(exportable_sessions)::BIGINT AS exportable FROM costs",
    ).row(0, named=True)
    total, exportable, inputs = row["total"] or 0.0, row["exportable"] or 0, row["inputs"] or 0
    return {
        "total_cost_usd": round(float(total), 6),
        "inference_share": round(float(row["inference"] or 0.0) / total, 4) if total else 0.0,
        "prompt_cache_hit_rate": round(float(row["cached"] or 0) / inputs, 4) if inputs else 0.0,
        "cost_per_exportable_usd": round(float(total) / exportable, 6) if exportable else 0.0,
    }


@multi_asset(
    specs=[
        AssetSpec(
            "scores",
            deps=["trajectories", "steps"],
            group_name=QUALITY_GROUP,
            kinds={"iceberg", "polars"},
            description="Completion, validity, novelty and quality per session; failure cause, retry advice.",
            automation_condition=AutomationCondition.eager(),
            freshness_policy=FreshnessPolicy.time_window(
                fail_window=timedelta(minutes=30), warn_window=timedelta(minutes=10)
            ),
        ),
        AssetSpec(
            "flags",
            deps=["trajectories", "steps", "raw_events"],
            group_name=QUALITY_GROUP,
            kinds={"iceberg"},
            description="Graded cheat flags (security, behavioural) and behaviour anomalies, with evidence.",
            automation_condition=AutomationCondition.eager(),
        ),
        AssetSpec(
            "duplicates",
            deps=["trajectories", "steps"],
            group_name=QUALITY_GROUP,
            kinds={"iceberg"},
            description="Exact and MinHash-LSH near-duplicate clusters with their representative.",
            automation_condition=AutomationCondition.eager(),
        ),
    ]
)
def quality_tables(context: AssetExecutionContext, lakehouse: LakehouseResource) -> Iterator[MaterializeResult]:
    """Score every trajectory (skipped when nothing changed since the last run)."""
    with transient_retries():
        lake = lakehouse.open()
        stats = score_all(lake)
    context.log.info("score: %s", stats.as_dict())
    scores = _frame(lake, "SELECT completion, validity, novelty, quality, exportable, failure_cause FROM scores")
    causes = dict(scores.group_by("failure_cause").len().sort("failure_cause").iter_rows()) if scores.height else {}
    yield MaterializeResult(
        asset_key="scores",
        metadata={
            "row_count": scores.height,
            "skipped": stats.skipped,
            "exportable": int(scores["exportable"].sum()) if scores.height else 0,
            "scorer_version": stats.scorer_version,
            "quality_distribution": MetadataValue.json(_distribution(scores, "quality")),
            "completion_distribution": MetadataValue.json(_distribution(scores, "completion")),
            "validity_distribution": MetadataValue.json(_distribution(scores, "validity")),
            "novelty_distribution": MetadataValue.json(_distribution(scores, "novelty")),
            "failure_causes": MetadataValue.json(causes),
            **_cost_metadata(lake),
        },
    )
    flags = _frame(lake, "SELECT flag, flag_class, count(*) AS n FROM flags GROUP BY ALL ORDER BY ALL")
    yield MaterializeResult(
        asset_key="flags",
        metadata={
            "row_count": int(flags["n"].sum()) if flags.height else 0,
            "flags_by_type": MetadataValue.json({f: int(n) for f, _, n in flags.iter_rows()}),
        },
    )
    dups = _frame(lake, "SELECT count(*) AS n, count(DISTINCT cluster_id) AS clusters FROM duplicates")
    yield MaterializeResult(
        asset_key="duplicates", metadata={"row_count": int(dups["n"][0]), "clusters": int(dups["clusters"][0])}
    )


@asset_check(asset="scores", description="Every score lies in [0, 1] and every session has one row.", blocking=True)
def scores_in_range(lakehouse: LakehouseResource) -> AssetCheckResult:
    """Scores are probabilities-like values in [0, 1]; no session scored twice."""
    row = _frame(
        lakehouse.open(),
        "SELECT count(*) AS n, count(DISTINCT session_id) AS sessions, "
        "count(*) FILTER (WHERE NOT (completion BETWEEN 0 AND 1 AND validity BETWEEN 0 AND 1 "
        "AND novelty BETWEEN 0 AND 1 AND quality BETWEEN 0 AND 1)) AS out_of_range FROM scores",
    ).row(0, named=True)
    passed = row["out_of_range"] == 0 and row["n"] == row["sessions"]
    return AssetCheckResult(passed=passed, severity=AssetCheckSeverity.ERROR, metadata=row)


def _rate_check(lake: Lakehouse, query: str, limit: float, what: str) -> AssetCheckResult:
    row = _frame(lake, query).row(0, named=True)
    rate = row["hits"] / row["total"] if row["total"] else 0.0
    return AssetCheckResult(
        passed=rate <= limit,
        severity=AssetCheckSeverity.WARN,
        metadata={f"{what}_rate": round(rate, 4), "limit": limit, **row},
    )


@asset_check(
    asset="flags", description="Share of sessions with a cheat flag stays under TRAJLAKE_QUALITY_MAX_FLAG_RATE."
)
def flag_rate(lakehouse: LakehouseResource) -> AssetCheckResult:
    """A sudden jump in cheat flags means a broken task pack or a detector regression."""
    settings = lakehouse.settings()
    return _rate_check(
        Lakehouse.open(settings),
        "SELECT (SELECT count(DISTINCT session_id) FROM flags WHERE flag_class <> 'anomaly') AS hits, "
        "(SELECT count(*) FROM scores) AS total",
        settings.quality_max_flag_rate,
        "flag",
    )


@asset_check(
    asset="duplicates", description="Share of shadowed duplicates stays under TRAJLAKE_QUALITY_MAX_DUPLICATE_RATE."
)
def duplicate_rate(lakehouse: LakehouseResource) -> AssetCheckResult:
    """Many duplicates mean wasted sandbox time (a policy collapsed, or a task is trivial)."""
    settings = lakehouse.settings()
    return _rate_check(
        Lakehouse.open(settings),
        "SELECT (SELECT count(*) FROM duplicates WHERE NOT is_representative) AS hits, "
        "(SELECT count(*) FROM scores) AS total",
        settings.quality_max_duplicate_rate,
        "duplicate",
    )


def export_count_result(lake: Lakehouse, day: date, records: int, min_quality: float) -> AssetCheckResult:
    """Records an export wrote for ``day`` against the sessions the lakehouse holds exportable for it.

    A difference means sessions were lost or quarantined on the way out (or the selection and
    the scores disagree), so the check fails with both numbers.
    """
    row = _frame(
        lake,
        "SELECT count(*) AS exportable FROM scores s JOIN trajectories t USING (session_id) "
        f"WHERE s.exportable AND s.quality >= {float(min_quality)!r} "
        f"AND CAST(t.started_at AS DATE) = DATE '{day.isoformat()}' "
        f"AND ({origin_condition(None)})",  # the origins a default export takes (never the synthetic fleet's)
    ).row(0, named=True)
    return AssetCheckResult(
        check_name="export_count",
        passed=records == row["exportable"],
        severity=AssetCheckSeverity.ERROR,
        metadata={"records": records, "exportable": row["exportable"], "day": day.isoformat()},
    )


@asset_check(
    asset="scores",
    description="Mean quality of the latest day with sessions moves less than TRAJLAKE_MAX_SCORE_DRIFT from the day "
    "before (a detector, task pack or policy regression).",
)
def score_drift(lakehouse: LakehouseResource) -> AssetCheckResult:
    """Compare the mean quality of the two latest days that have scored sessions."""
    settings = lakehouse.settings()
    days = _frame(
        Lakehouse.open(settings),
        "SELECT CAST(t.started_at AS DATE) AS day, avg(s.quality) AS mean_quality, count(*) AS sessions "
        "FROM scores s JOIN trajectories t USING (session_id) GROUP BY 1 ORDER BY 1 DESC LIMIT 2",
    )
    if days.height < 2:
        return AssetCheckResult(passed=True, metadata={"days_compared": days.height})
    latest, previous = days.row(0, named=True), days.row(1, named=True)
    drift = float(latest["mean_quality"]) - float(previous["mean_quality"])
    return AssetCheckResult(
        passed=abs(drift) <= settings.max_score_drift,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "drift": round(drift, 4),
            "limit": settings.max_score_drift,
            "latest_day": str(latest["day"]),
            "latest_mean_quality": round(float(latest["mean_quality"]), 4),
            "previous_day": str(previous["day"]),
            "previous_mean_quality": round(float(previous["mean_quality"]), 4),
        },
    )


@asset(
    deps=["scores", "flags", "duplicates"],
    partitions_def=daily_partitions,
    group_name=QUALITY_GROUP,
    kinds={"json"},
    description="The day's exportable trajectories as an hf chat training set plus manifest "
    "(under $TRAJLAKE_HOME/exports/hf/<day>), and its HTML report (linked as `report`).",
    check_specs=[
        AssetCheckSpec(
            "export_count", asset="training_set", description="Records written equal the day's exportable sessions."
        )
    ],
)
def training_set(context: AssetExecutionContext, lakehouse: LakehouseResource) -> MaterializeResult:
    """Export the partition's day and check the records written against the exportable count."""
    settings = lakehouse.settings()
    day = date.fromisoformat(context.partition_key)
    out_dir = settings.home_dir / "exports" / "hf" / day.isoformat()
    options = ExportOptions.from_settings(settings)
    with transient_retries():
        lake = Lakehouse.open(settings)
        # the partition's own directory: re-materializing replaces the day's export
        stats = export_training_set(lake, "hf", out_dir, day=day, force=True, options=options)
    return MaterializeResult(
        check_results=[export_count_result(lake, day, stats.records, options.min_quality)],
        metadata={
            "records": stats.records,
            "out_dir": MetadataValue.path(stats.out_dir),
            "manifest": MetadataValue.path(stats.manifest),
            "files": MetadataValue.json(json.loads(json.dumps(stats.files))),
            "export_id": stats.export_id,
            **export_report(lake, Path(stats.out_dir), "hf", day.isoformat(), settings.report_max_sessions),
        },
    )


def export_report(
    lake: Lakehouse, export_dir: Path, fmt: str, day: str, max_pages: int | None = None
) -> dict[str, MetadataValue]:
    """Write the HTML report of an export (``$TRAJLAKE_HOME/reports/<fmt>/<day>``); the metadata linking it.

    ``report`` is a ``file://`` link the Dagster UI shows as a link; ``report_path`` the file itself.
    ``max_pages``: session pages at most (``TRAJLAKE_REPORT_MAX_SESSIONS`` when None).
    """
    out_dir = lake.home / "reports" / fmt / day
    stats = write_report(lake, out_dir, export_dir=export_dir, max_pages=max_pages)
    return {"report": MetadataValue.url(stats.index.as_uri()), "report_path": MetadataValue.path(str(stats.index))}


@asset(
    partitions_def=daily_partitions,
    deps=["trajectories", "steps", "raw_events"],
    group_name=QUALITY_GROUP,
    kinds={"iceberg", "polars"},
    description="The MinHash index and the other per-session facts of the sessions started on the partition's "
    "day (level 1 of scoring: detector flags, failure cause, features, signature, LSH band keys). After a "
    "scorer or configuration change, a backfill over the days runs the expensive half of the full rescore in "
    "parallel; `scores` then only combines the stored facts.",
)
def session_index(context: AssetExecutionContext, lakehouse: LakehouseResource) -> MaterializeResult:
    """Index the sessions of one day (their facts replace the previous ones)."""
    day = date.fromisoformat(context.partition_key)
    with transient_retries():
        sessions = index_days(lakehouse.open(), [day])
    context.log.info("session_index %s: %d sessions", day, sessions)
    return MaterializeResult(metadata={"sessions": sessions, "day": day.isoformat()})


# A full rescore fanned out: one run per day partition (a backfill), steps in their own processes.
# The multiprocess executor here; Dagster's Kubernetes or Celery executors when one machine is not enough.
rescore_index_job = define_asset_job(
    "rescore_index",
    selection=AssetSelection.assets("session_index"),  # its daily partitions come from the asset
    executor_def=multiprocess_executor,
)

# Partitioned by the export's daily partitions; the (unpartitioned) quality tables it reads run first.
nightly_training_set_job = define_asset_job(
    "nightly_training_set", selection=AssetSelection.assets("training_set").upstream(depth=1)
)
# 02:30 UTC: the previous day's partition, after late sessions have closed (idle deadline 15 min).
nightly_training_set_schedule = build_schedule_from_partitioned_job(
    nightly_training_set_job, hour_of_day=2, minute_of_hour=30
)

defs = Definitions(
    assets=[quality_tables, training_set, session_index],
    asset_checks=[scores_in_range, flag_rate, duplicate_rate, score_drift],
    jobs=[nightly_training_set_job, rescore_index_job],
    schedules=[nightly_training_set_schedule],
)
