"""Failed runs are recorded with their cause; fleet campaigns launch batches through FleetResource."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    RunStatusSensorContext,
    asset,
    build_run_status_sensor_context,
    define_asset_job,
)
from dagster import Definitions as DagsterDefinitions

from common.errors import ConfigError, KafkaUnavailable
from common.settings import Settings
from dagster_project.definitions import defs
from dagster_project.defs.fleet import FleetResource
from dagster_project.defs.operations import failures_path, record_run_failures
from dagster_project.resources import KafkaConfig, LakehouseResource, transient_retries
from producers.fleet import bwrap_available
from tests.helpers import plain
from warehouse.query import run_query


def _failed_run(error: Exception, instance: DagsterInstance) -> RunStatusSensorContext:
    @asset
    def breaks() -> None:
        with transient_retries():
            raise error

    job = DagsterDefinitions(assets=[breaks], jobs=[define_asset_job("breaks_job")]).resolve_job_def("breaks_job")
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == DagsterEventType.RUN_FAILURE)
    return build_run_status_sensor_context(
        sensor_name="record_run_failures",
        dagster_event=failure,
        dagster_instance=instance,
        dagster_run=result.dagster_run,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("error", "transient"),
    [(ConfigError("TRAJLAKE_HOME=/x is not a directory"), False), (KafkaUnavailable("no answer"), True)],
)
def test_a_failed_run_is_recorded_with_its_cause(tmp_path: Path, error: Exception, transient: bool) -> None:
    instance = DagsterInstance.ephemeral()
    context = _failed_run(error, instance)
    lakehouse = LakehouseResource(home=str(tmp_path / "home"))
    record_run_failures(context.for_run_failure(), lakehouse=lakehouse)
    (line,) = Path(failures_path(lakehouse.settings())).read_text().splitlines()
    record = json.loads(line)
    assert record["job"] == "breaks_job" and record["run_id"] == context.dagster_run.run_id
    (step,) = record["steps"]
    assert step["step"] == "breaks"
    if transient:  # retried by Dagster until the retries ran out, then failed with the retry request
        assert step["error"] in {"KafkaUnavailable", "RetryRequested"}
    else:
        assert step["error"] == "ConfigError" and "not a directory" in step["message"]
    assert record["transient"] is (step["error"] == "KafkaUnavailable")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("backend", ["synthetic", "local"])
def test_fleet_campaign_job_materializes_sandbox_runs(kafka_settings: Settings, backend: str) -> None:
    if backend == "local" and not bwrap_available():
        pytest.skip("bubblewrap is not available")
    job = defs.resolve_job_def("fleet_campaign")
    lakehouse = LakehouseResource(
        home=str(kafka_settings.home),
        kafka=KafkaConfig(bootstrap=kafka_settings.kafka_bootstrap, topic=kafka_settings.topic),
    )
    sessions = 2 if backend == "local" else 30
    result = job.execute_in_process(
        run_config={"ops": {"sandbox_runs": {"config": {"sessions": sessions, "backend": backend, "seed": 3}}}},
        resources={"lakehouse": lakehouse, "fleet": FleetResource(backend="synthetic", concurrency=2)},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    (materialization,) = result.asset_materializations_for_node("sandbox_runs")
    metadata = plain(materialization.metadata)
    assert sum(metadata["sessions_by_status"].values()) == sessions
    labels = Path(metadata["labels_path"]).read_text().splitlines()
    assert len(labels) == sessions and all(json.loads(line)["backend"] == backend for line in labels)
    from pipelines.ingest import run_ingest

    run_ingest(kafka_settings, until_idle=2.0)
    started = run_query(kafka_settings, "SELECT count(DISTINCT session_id) FROM events")[1][0][0]
    assert started == sessions
