"""Assets of the lakehouse spine: raw events (ingest) → trajectories and steps (assembly).

``trajectories`` and ``steps`` are eager: declarative automation assembles as soon as
``raw_events`` has a new snapshot (reported by ``streaming.ingest_observer`` when a streaming
worker wrote it). Freshness policies say how stale each may get before the UI shows it.
"""

from collections.abc import Iterator
from datetime import timedelta

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetSpec,
    AutomationCondition,
    Definitions,
    FreshnessPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
    multi_asset,
)

from common.settings import Settings
from dagster_project.resources import LakehouseResource, transient_retries
from pipelines.assemble import assemble
from pipelines.ingest import run_ingest
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.tables import RAW_EVENTS

#: Seconds past the idle deadline before an open session counts as stuck (assembly runs at least this often).
STUCK_GRACE_S = 600
_ASSEMBLED_FRESHNESS = FreshnessPolicy.time_window(fail_window=timedelta(minutes=20), warn_window=timedelta(minutes=6))


def _count(settings: Settings, view: str) -> int:
    return int(run_query(settings, f"SELECT count(*) FROM {view}")[1][0][0])


def _snapshot_metadata(lake: Lakehouse) -> dict[str, int]:
    """The ``raw_events`` snapshot this run left, so the observer does not report it again."""
    snapshot = lake.table(RAW_EVENTS.name).current_snapshot()
    return {"snapshot_id": snapshot.snapshot_id} if snapshot is not None else {}


@asset(
    group_name="lakehouse",
    description="Every event from Kafka exactly once (Iceberg raw_events; undecodable ones in dead_letters).",
    kinds={"iceberg", "kafka"},
    deps=["event_topic"],
    freshness_policy=FreshnessPolicy.time_window(fail_window=timedelta(minutes=15), warn_window=timedelta(minutes=5)),
)
def raw_events(context: AssetExecutionContext, lakehouse: LakehouseResource) -> MaterializeResult:
    """Drain the event topic into Iceberg until idle."""
    settings = lakehouse.settings()
    with transient_retries():
        stats = run_ingest(settings, until_idle=3.0)
    context.log.info("ingest: %s", stats.as_dict())
    return MaterializeResult(
        metadata={
            "events_ingested": stats.events,
            "dead_letters_ingested": stats.dead_letters,
            "batches": stats.batches,
            "dead_letter_reasons": MetadataValue.json(stats.reasons),
            "row_count": _count(settings, "events"),
            "dead_letters_total": _count(settings, "dead_letters"),
            **_snapshot_metadata(Lakehouse.open(settings)),
        }
    )


@multi_asset(
    specs=[
        AssetSpec(
            "trajectories",
            deps=["raw_events"],
            group_name="lakehouse",
            kinds={"iceberg"},
            automation_condition=AutomationCondition.eager(),
            freshness_policy=_ASSEMBLED_FRESHNESS,
            description="One wide row per session (hot).",
        ),
        AssetSpec(
            "steps",
            deps=["raw_events"],
            group_name="lakehouse",
            kinds={"iceberg"},
            automation_condition=AutomationCondition.eager(),
            freshness_policy=_ASSEMBLED_FRESHNESS,
            description="One wide row per agent action joined with its feedback (hot).",
        ),
    ]
)
def assembled_trajectories(context: AssetExecutionContext, lakehouse: LakehouseResource) -> Iterator[MaterializeResult]:
    """Incrementally assemble new raw events into trajectories and steps."""
    settings = lakehouse.settings()
    with transient_retries():
        stats = assemble(lakehouse.open())
    context.log.info("assemble: %s", stats.as_dict())
    _, rows = run_query(settings, "SELECT status, count(*) FROM trajectories GROUP BY status ORDER BY 1")
    yield MaterializeResult(
        asset_key="trajectories",
        metadata={
            "sessions_updated": stats.sessions,
            "row_count": _count(settings, "trajectories"),
            "sessions_by_status": MetadataValue.json({status: n for status, n in rows}),
        },
    )
    yield MaterializeResult(
        asset_key="steps",
        metadata={"steps_written": stats.steps_written, "row_count": _count(settings, "steps")},
    )


@asset_check(
    asset="raw_events",
    description="Dead letters per record received stay under TRAJLAKE_MAX_DEAD_LETTER_RATE; counts by reason.",
)
def dead_letter_rate(lakehouse: LakehouseResource) -> AssetCheckResult:
    """A rise in dead letters means a producer or schema regression upstream."""
    settings = lakehouse.settings()
    _, reasons = run_query(settings, "SELECT reason, count(*) FROM dead_letters GROUP BY 1 ORDER BY 2 DESC")
    by_reason = {str(reason): int(n) for reason, n in reasons}
    dead, events = sum(by_reason.values()), _count(settings, "events")
    rate = dead / (dead + events) if dead + events else 0.0
    return AssetCheckResult(
        passed=rate <= settings.max_dead_letter_rate,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "dead_letter_rate": round(rate, 5),
            "limit": settings.max_dead_letter_rate,
            "dead_letters": dead,
            "events": events,
            "by_reason": MetadataValue.json(by_reason),
        },
    )


@asset_check(
    asset="trajectories",
    description="Closed sessions with sequence gaps (n_missing_seq > 0) stay under TRAJLAKE_MAX_MISSING_SEQ_RATE.",
)
def sequence_gaps(lakehouse: LakehouseResource) -> AssetCheckResult:
    """A gap in a closed session's ``seq`` means events were lost between the sandbox host and Kafka."""
    settings = lakehouse.settings()
    _, rows = run_query(
        settings,
        "SELECT count(*) FILTER (WHERE n_missing_seq > 0), count(*), coalesce(sum(n_missing_seq), 0) "
        "FROM trajectories WHERE status <> 'running'",
    )
    gapped, closed, missing = (int(v) for v in rows[0])
    rate = gapped / closed if closed else 0.0
    return AssetCheckResult(
        passed=rate <= settings.max_missing_seq_rate,
        severity=AssetCheckSeverity.WARN,
        metadata={
            "sessions_with_gaps": gapped,
            "closed_sessions": closed,
            "missing_events": missing,
            "rate": round(rate, 5),
            "limit": settings.max_missing_seq_rate,
        },
    )


@asset_check(
    asset="trajectories",
    description="No session stays 'running' past the idle deadline (assembly closes them as timed out).",
)
def stuck_sessions(lakehouse: LakehouseResource) -> AssetCheckResult:
    """Open sessions whose last event is older than the idle deadline: assembly is not keeping up or is stuck."""
    settings = lakehouse.settings()
    deadline_s = settings.session_idle_timeout_s + STUCK_GRACE_S
    _, rows = run_query(
        settings,
        "SELECT count(*), min(last_event_at) FROM trajectories WHERE status = 'running' "
        f"AND last_event_at < now() - to_seconds({float(deadline_s)!r})",
    )
    stuck, oldest = int(rows[0][0]), rows[0][1]
    return AssetCheckResult(
        passed=stuck == 0,
        severity=AssetCheckSeverity.ERROR,
        metadata={"stuck_sessions": stuck, "oldest_last_event": str(oldest), "deadline_s": deadline_s},
    )


lakehouse_assets = [raw_events, assembled_trajectories]
defs = Definitions(assets=lakehouse_assets, asset_checks=[dead_letter_rate, sequence_gaps, stuck_sessions])
