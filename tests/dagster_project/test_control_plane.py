"""The control plane: automation and freshness on the spine, the ingest observer, checks that catch breakage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    SensorResult,
    build_sensor_context,
    materialize,
)

from common.settings import Settings
from dagster_project.definitions import defs
from dagster_project.defs.lakehouse import dead_letter_rate, sequence_gaps, stuck_sessions
from dagster_project.defs.quality import export_count_result, score_drift, training_set
from dagster_project.defs.streaming import ingest_observer
from dagster_project.resources import KafkaConfig, LakehouseResource
from pipelines.assemble import assemble
from pipelines.ingest import run_ingest
from pipelines.score import score_all
from tests.helpers import AS_OF, BASE_US, day_events, plain, produce, run_check, sample_events, write_raw
from warehouse.catalog import open_catalog
from warehouse.lakehouse import Lakehouse
from warehouse.tables import DEAD_LETTERS, ensure_table


def test_spine_is_automated_and_has_freshness_policies() -> None:
    graph = defs.resolve_asset_graph()
    for name in ("trajectories", "steps", "scores", "flags", "duplicates"):
        assert graph.get(AssetKey(name)).automation_condition is not None, name
    for name in ("raw_events", "trajectories", "scores"):
        assert graph.get(AssetKey(name)).freshness_policy is not None, name
    sensors = {sensor.name for sensor in defs.sensors or []}
    assert {"ingest_observer", "lakehouse_automation", "record_run_failures"} <= sensors
    nightly = defs.resolve_job_def("nightly_training_set")
    assert {"scores", "flags", "duplicates", "training_set"} <= {
        k.to_user_string() for k in nightly.asset_layer.selected_asset_keys
    }


def _lakehouse(settings: Settings) -> LakehouseResource:
    return LakehouseResource(home=str(settings.home))


def _broken_lakehouse(settings: Settings) -> None:
    """Two sessions broken the way real breakage looks: one never closed, one with a lost event."""
    events = sample_events(6)
    sessions = sorted({e["session_id"] for e in events})
    never_closed, gapped = sessions[0], sessions[1]
    kept = [e for e in events if not (e["session_id"] == never_closed and e["event_type"] == "session_end")]
    lost = next(e for e in kept if e["session_id"] == gapped and e["seq"] == 2)
    write_raw(settings, [e for e in kept if e is not lost])
    # Assembled as of just after the traffic: the open session is still within its idle deadline then,
    # and nothing assembled it since, although its last event is months old now.
    last = max(e["ts"] for e in events)
    assemble(Lakehouse.open(settings), as_of=datetime.fromtimestamp(last / 1e6, UTC) + timedelta(seconds=1))


def _dead_letters(settings: Settings, n: int) -> None:
    table = ensure_table(open_catalog(settings), settings, DEAD_LETTERS.name)
    schema = DEAD_LETTERS.arrow_schema()
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns["reason"] = pa.array(["corrupt_payload"] * n)
    columns["raw_value"] = pa.array([b"\x00"] * n)
    columns["ingested_at"] = pa.array([datetime.now(UTC)] * n, schema.field("ingested_at").type)
    table.append(pa.table({f.name: columns[f.name].cast(f.type) for f in schema}, schema=schema))


@pytest.mark.slow
def test_lakehouse_checks_pass_on_a_healthy_lakehouse(settings: Settings) -> None:
    write_raw(settings, sample_events(6))
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    lakehouse = _lakehouse(settings)
    for check in (dead_letter_rate, sequence_gaps, stuck_sessions):
        result = run_check(check, lakehouse=lakehouse)
        assert result.passed, (check, result.metadata)


@pytest.mark.slow
def test_lakehouse_checks_fail_on_gaps_stuck_sessions_and_dead_letters(settings: Settings) -> None:
    _broken_lakehouse(settings)
    _dead_letters(settings, 50)
    lakehouse = _lakehouse(settings)
    gaps = run_check(sequence_gaps, lakehouse=lakehouse)
    assert not gaps.passed and plain(gaps.metadata)["sessions_with_gaps"] == 1
    stuck = run_check(stuck_sessions, lakehouse=lakehouse)
    assert not stuck.passed and plain(stuck.metadata)["stuck_sessions"] == 1
    dead = run_check(dead_letter_rate, lakehouse=lakehouse)
    assert not dead.passed and plain(dead.metadata)["by_reason"] == {"corrupt_payload": 50}


@pytest.mark.slow
def test_score_drift_check_fails_past_its_limit(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    write_raw(settings, day_events(2, 8), batch_size=2000)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    monkeypatch.setenv("TRAJLAKE_MAX_SCORE_DRIFT", "1.0")
    relaxed = run_check(score_drift, lakehouse=_lakehouse(settings))
    assert relaxed.passed and plain(relaxed.metadata)["latest_day"] == "2026-01-02"
    drift = abs(plain(relaxed.metadata)["drift"])
    assert drift > 0  # two days of random traffic never score exactly alike
    monkeypatch.setenv("TRAJLAKE_MAX_SCORE_DRIFT", str(drift / 2))
    assert not run_check(score_drift, lakehouse=_lakehouse(settings)).passed


@pytest.mark.slow
def test_export_count_check_compares_the_export_with_the_lakehouse(settings: Settings) -> None:
    write_raw(settings, sample_events(12))
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    day = datetime.fromtimestamp(BASE_US / 1e6, UTC).date().isoformat()
    result = materialize([training_set], resources={"lakehouse": _lakehouse(settings)}, partition_key=day)
    evaluation = next(iter(result.get_asset_check_evaluations()))
    assert evaluation.check_name == "export_count" and evaluation.passed
    records = plain(evaluation.metadata)["records"]
    assert records == plain(evaluation.metadata)["exportable"]
    one_lost = export_count_result(
        Lakehouse.open(settings), datetime.fromisoformat(day).date(), records - 1, settings.quality_min
    )
    assert not one_lost.passed
    # the export's HTML report, linked from the materialization
    metadata = result.asset_materializations_for_node("training_set")[0].metadata
    index = Path(str(metadata["report_path"].value))
    assert index.is_file() and metadata["report"].value == index.as_uri()
    assert f"<b>{records}</b>sessions" in index.read_text()  # the report covers the export's sessions


@pytest.mark.slow
@pytest.mark.integration
def test_ingest_observer_reports_lag_then_the_streaming_commit(
    kafka_settings: Settings, request: pytest.FixtureRequest
) -> None:
    events = sample_events(5)
    produce(kafka_settings, events)
    lakehouse = LakehouseResource(
        home=str(kafka_settings.home),
        kafka=KafkaConfig(
            bootstrap=kafka_settings.kafka_bootstrap,
            topic=kafka_settings.topic,
            consumer_group=kafka_settings.consumer_group,
        ),
    )
    instance = DagsterInstance.ephemeral()

    def tick(cursor: str | None) -> SensorResult:
        context = build_sensor_context(instance=instance, cursor=cursor, resources={"lakehouse": lakehouse})
        result = ingest_observer(context)
        assert isinstance(result, SensorResult)
        for event in result.asset_events:
            if isinstance(event, AssetMaterialization):
                instance.report_runless_asset_event(event)
        return result

    before = tick(None)
    (observation,) = before.asset_events
    assert isinstance(observation, AssetObservation)
    lag = plain(observation.metadata)["consumer_lag"]
    if request.node.callspec.params.get("broker") == "kafka":
        assert lag == len(events)
    else:  # the embedded broker's high watermark lags by up to one record batch per partition
        assert 0 < lag <= len(events)

    run_ingest(kafka_settings, until_idle=2.0)
    after = tick(before.cursor)
    observation, materialization = after.asset_events
    assert observation.metadata["consumer_lag"].value == 0
    assert observation.metadata["events_total"].value == len(events)
    assert plain(observation.metadata)["events_per_s"] > 0
    assert isinstance(materialization, AssetMaterialization) and materialization.asset_key == AssetKey("raw_events")

    again = tick(after.cursor)  # the same snapshot is not reported twice
    assert [type(e) for e in again.asset_events] == [AssetObservation]
