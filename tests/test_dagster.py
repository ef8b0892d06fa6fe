"""Dagster definitions load, are stable, and materialize in-process."""

from __future__ import annotations

import pytest
from dagster import materialize

from dagster_project.definitions import defs
from dagster_project.defs.lakehouse import lakehouse_assets
from dagster_project.resources import IcebergResource, KafkaResource, TrajlakeResource
from pipelines.settings import Settings
from tests.helpers import produce, sample_events
from warehouse.sql import run_query


def test_definitions_graph_snapshot() -> None:
    graph = defs.resolve_asset_graph()
    keys = sorted(key.to_user_string() for key in graph.get_all_asset_keys())
    assert {"raw_events", "trajectories", "steps"} <= set(keys)
    deps = {
        key.to_user_string(): sorted(p.to_user_string() for p in graph.get(key).parent_keys)
        for key in graph.get_all_asset_keys()
    }
    assert deps["trajectories"] == ["raw_events"] and deps["steps"] == ["raw_events"]


@pytest.mark.integration
def test_assets_materialize_in_process(kafka_settings: Settings) -> None:
    events = sample_events(8)
    produce(kafka_settings, events)
    result = materialize(
        lakehouse_assets,
        resources={
            "trajlake": TrajlakeResource(home=str(kafka_settings.home)),
            "kafka": KafkaResource(
                bootstrap=kafka_settings.kafka_bootstrap,
                topic=kafka_settings.topic,
                consumer_group=kafka_settings.consumer_group,
            ),
            "iceberg": IcebergResource(),
        },  # fmt: skip
    )
    assert result.success
    materializations = {
        event.asset_key.to_user_string(): event.materialization.metadata
        for event in result.get_asset_materialization_events()
    }
    assert materializations["raw_events"]["row_count"].value == len(events)
    assert materializations["trajectories"]["row_count"].value == 8
    assert (
        run_query(kafka_settings, "SELECT count(*) FROM steps")[1][0][0] == materializations["steps"]["row_count"].value
    )
