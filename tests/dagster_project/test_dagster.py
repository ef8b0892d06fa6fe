"""Dagster definitions load, are stable, and materialize in-process."""

from __future__ import annotations

import pytest
from dagster import materialize

from common.settings import Settings
from dagster_project.definitions import defs
from dagster_project.defs.lakehouse import lakehouse_assets
from dagster_project.resources import KafkaConfig, LakehouseResource
from tests.helpers import materialized, produce, sample_events
from warehouse.query import run_query

#: The whole definitions graph: renaming, dropping or rewiring an asset, check, job or schedule
#: must be a deliberate change to this snapshot.
GRAPH_SNAPSHOT = {
    "session_index": ["raw_events", "steps", "trajectories"],
    "sandbox_runs": [],
    "event_topic": ["sandbox_runs"],
    "raw_events": ["event_topic"],
    "trajectories": ["raw_events"],
    "steps": ["raw_events"],
    "scores": ["steps", "trajectories"],
    "flags": ["raw_events", "steps", "trajectories"],
    "duplicates": ["steps", "trajectories"],
    "training_set": ["duplicates", "flags", "scores"],
    "cold_tier": ["steps", "trajectories"],
    "table_maintenance": ["cold_tier"],
}


def test_definitions_graph_snapshot() -> None:
    graph = defs.resolve_asset_graph()
    deps = {
        key.to_user_string(): sorted(parent.to_user_string() for parent in graph.get(key).parent_keys)
        for key in graph.get_all_asset_keys()
    }
    assert deps == GRAPH_SNAPSHOT
    checks = sorted(f"{key.asset_key.to_user_string()}:{key.name}" for key in graph.asset_check_keys)
    assert checks == [
        "duplicates:duplicate_rate",
        "flags:flag_rate",
        "raw_events:dead_letter_rate",
        "scores:score_drift",
        "scores:scores_in_range",
        "training_set:export_count",
        "trajectories:sequence_gaps",
        "trajectories:stuck_sessions",
    ]
    assert sorted(job.name for job in defs.jobs or []) == [
        "fleet_campaign",
        "lakehouse_lifecycle",
        "nightly_training_set",
        "rescore_index",
    ]
    assert sorted(schedule.name for schedule in defs.schedules or []) == [
        "fleet_campaign_schedule",
        "lakehouse_lifecycle_schedule",
        "nightly_training_set_schedule",
    ]
    assert sorted(sensor.name for sensor in defs.sensors or []) == [
        "ingest_observer",
        "lakehouse_automation",
        "record_run_failures",
    ]
    assert set(defs.resources or {}) == {"lakehouse", "fleet"}


@pytest.mark.slow
@pytest.mark.integration
def test_assets_materialize_in_process(kafka_settings: Settings) -> None:
    events = sample_events(8)
    produce(kafka_settings, events)
    result = materialize(
        lakehouse_assets,
        resources={
            "lakehouse": LakehouseResource(
                home=str(kafka_settings.home),
                kafka=KafkaConfig(
                    bootstrap=kafka_settings.kafka_bootstrap,
                    topic=kafka_settings.topic,
                    consumer_group=kafka_settings.consumer_group,
                ),
            )
        },
    )
    assert result.success
    materializations = materialized(result)
    assert materializations["raw_events"]["row_count"] == len(events)
    assert materializations["trajectories"]["row_count"] == 8
    assert run_query(kafka_settings, "SELECT count(*) FROM steps")[1][0][0] == materializations["steps"]["row_count"]
