"""Assets of the lakehouse spine: raw events (ingest) → trajectories and steps (assembly)."""

from collections.abc import Iterator

from dagster import AssetExecutionContext, AssetSpec, Definitions, MaterializeResult, MetadataValue, asset, multi_asset

from common.settings import Settings
from dagster_project.resources import LakehouseResource, transient_retries
from pipelines.assemble import assemble
from pipelines.ingest import run_ingest
from warehouse.sql import run_query


def _count(settings: Settings, view: str) -> int:
    return int(run_query(settings, f"SELECT count(*) FROM {view}")[1][0][0])


@asset(
    group_name="lakehouse",
    description="Every event from Kafka exactly once (Iceberg raw_events; undecodable ones in dead_letters).",
    kinds={"iceberg", "kafka"},
    deps=["sandbox_runs"],
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
        }
    )


@multi_asset(
    specs=[
        AssetSpec(
            "trajectories",
            deps=["raw_events"],
            group_name="lakehouse",
            kinds={"iceberg"},
            description="One wide row per session (hot).",
        ),
        AssetSpec(
            "steps",
            deps=["raw_events"],
            group_name="lakehouse",
            kinds={"iceberg"},
            description="One wide row per agent action joined with its feedback (hot).",
        ),
    ]
)
def assembled_trajectories(context: AssetExecutionContext, lakehouse: LakehouseResource) -> Iterator[MaterializeResult]:
    """Incrementally assemble new raw events into trajectories and steps."""
    settings = lakehouse.settings()
    with transient_retries():
        stats = assemble(settings)
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


lakehouse_assets = [raw_events, assembled_trajectories]
defs = Definitions(assets=lakehouse_assets)
