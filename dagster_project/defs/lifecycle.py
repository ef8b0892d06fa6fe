"""Lakehouse lifecycle assets: hot → cold tiering and table maintenance, on a nightly schedule.

Both run in one job so they never overlap (``warehouse.tiering.lifecycle_lock`` also
serialises them on one machine): tiering first, then maintenance compacts what it wrote.
"""

from dagster import (
    AssetExecutionContext,
    AssetSelection,
    Definitions,
    MaterializeResult,
    MetadataValue,
    ScheduleDefinition,
    asset,
    define_asset_job,
)

from dagster_project.resources import LakehouseResource, transient_retries
from warehouse.maintenance import maintain
from warehouse.tiering import tier


@asset(
    group_name="lifecycle",
    deps=["trajectories", "steps"],
    kinds={"iceberg"},
    description="Cold tier: events, trajectories and steps older than the hot retention, compacted (cold storage).",
)
def cold_tier(context: AssetExecutionContext, lakehouse: LakehouseResource) -> MaterializeResult:
    """Move data older than the hot retention to the cold tables."""
    with transient_retries():
        stats = tier(lakehouse.open())
    context.log.info("tier: %s", stats.as_dict())
    return MaterializeResult(
        metadata={
            "boundary": stats.boundary,
            "days_tiered": MetadataValue.json(stats.days_tiered),
            "days_deferred": MetadataValue.json(stats.days_deferred),
            "events_copied": stats.events_copied,
            "sessions_copied": stats.sessions_copied,
            "steps_copied": stats.steps_copied,
            "seconds": round(stats.seconds, 2),
        }
    )


@asset(
    group_name="lifecycle",
    deps=[cold_tier],
    kinds={"iceberg"},
    description="Compaction, snapshot expiry and orphan removal on every hot and cold table.",
)
def table_maintenance(context: AssetExecutionContext, lakehouse: LakehouseResource) -> MaterializeResult:
    """Compact small files, expire old snapshots, remove orphan files; report files/bytes per table."""
    with transient_retries():
        reports = maintain(lakehouse.open())
    rows = [report.as_dict() for report in reports]
    context.log.info("maintain: %s", rows)
    return MaterializeResult(
        metadata={
            "tables": MetadataValue.json(rows),
            "files_before": sum(r.before.files for r in reports),
            "files_after": sum(r.after.files for r in reports),
            "bytes_before": sum(r.before.bytes for r in reports),
            "bytes_after": sum(r.after.bytes for r in reports),
        }
    )


lifecycle_job = define_asset_job("lakehouse_lifecycle", selection=AssetSelection.assets(cold_tier, table_maintenance))
lifecycle_schedule = ScheduleDefinition(job=lifecycle_job, cron_schedule="30 2 * * *", execution_timezone="UTC")

defs = Definitions(assets=[cold_tier, table_maintenance], jobs=[lifecycle_job], schedules=[lifecycle_schedule])
