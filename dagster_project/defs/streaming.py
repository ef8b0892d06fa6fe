"""Streaming ingest as Dagster sees it: the topic as an external asset, observed; automation downstream.

``trajlake ingest --follow`` is the long-running consumer (one process or many in one consumer
group); Dagster does not run it, it watches it. The ``ingest_observer`` sensor, every
``OBSERVE_INTERVAL_S``, records an observation of ``event_topic`` (consumer lag per partition,
events/s, dead-letter rate, the newest recorded offsets — numbers the asset page plots over
time) and, when ``raw_events`` has a new Iceberg snapshot that no Dagster run produced, reports
it as a runless materialization. That event is what declarative automation reacts to:
``trajectories`` and ``steps`` are eager on ``raw_events``, and the quality tables eager on them,
so a closed session reaches ``scores`` without anyone pressing a button. Materializing
``raw_events`` from the UI still drains the topic once, for one-machine use.

Why a sensor on snapshots rather than a schedule: assembly is incremental and cheap when
nothing is new, but a schedule would run it every minute whether or not anything landed; the
snapshot id says exactly when something did.
"""

from __future__ import annotations

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSelection,
    AssetSpec,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    Definitions,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from common.errors import TrajlakeError
from dagster_project.resources import LakehouseResource
from pipelines.ingest.observe import IngestObservation, observation_metadata, observe_ingest, rates

#: Seconds between observations (and the longest a new snapshot waits to be noticed).
OBSERVE_INTERVAL_S = 15
#: Seconds between evaluations of the automation conditions.
AUTOMATION_INTERVAL_S = 15

event_topic = AssetSpec(
    "event_topic",
    deps=["sandbox_runs"],
    group_name="lakehouse",
    kinds={"kafka"},
    description="The Kafka event topic (key = session id), produced by sandbox hosts; observed, not materialized.",
)


def _latest_materialized_snapshot(context: SensorEvaluationContext) -> int | None:
    """The ``raw_events`` snapshot id the newest materialization event (a run's or ours) reported."""
    record = context.instance.get_latest_materialization_event(AssetKey("raw_events"))
    if record is None or record.asset_materialization is None:
        return None
    value = record.asset_materialization.metadata.get("snapshot_id")
    return int(value.value) if value is not None and isinstance(value.value, int) else None


@sensor(
    minimum_interval_seconds=OBSERVE_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Observes the event topic (lag, rates) and reports raw_events snapshots written by ingest --follow.",
)
def ingest_observer(context: SensorEvaluationContext, lakehouse: LakehouseResource) -> SensorResult | SkipReason:
    """One observation of the topic and the lakehouse's position in it."""
    previous = IngestObservation.from_json(context.cursor)
    try:
        current = observe_ingest(lakehouse.settings())
    except TrajlakeError as exc:
        return SkipReason(f"not observed: {exc}")
    metadata = observation_metadata(current, rates(previous, current))
    events: list[AssetObservation | AssetMaterialization] = [
        AssetObservation(asset_key="event_topic", metadata=metadata)
    ]
    snapshot = current.raw_events_snapshot
    if snapshot is not None and snapshot != _latest_materialized_snapshot(context):
        events.append(
            AssetMaterialization(
                asset_key="raw_events",
                description="new raw_events snapshot committed by a streaming ingest worker",
                metadata={
                    "snapshot_id": snapshot,
                    "row_count": current.events,
                    "dead_letters_total": current.dead_letters,
                    "consumer_lag": current.total_lag,
                },
            )
        )
    return SensorResult(asset_events=events, cursor=current.to_json())


lakehouse_automation = AutomationConditionSensorDefinition(
    "lakehouse_automation",
    target=AssetSelection.all(),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=AUTOMATION_INTERVAL_S,
    description="Runs what declarative automation asks for: assembly after new raw_events, scoring after assembly.",
)

defs = Definitions(assets=[event_topic], sensors=[ingest_observer, lakehouse_automation])
