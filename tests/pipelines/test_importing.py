"""``trajlake import`` end to end on a broker: runs, late verdicts and live OTLP traces into the lakehouse."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from typer.testing import CliRunner

from common.broker import resolve_bootstrap
from common.settings import Settings
from pipelines.assemble import assemble
from pipelines.ingest import IngestWorker
from pipelines.intake.importing import listen
from producers.sdk import EventProducer
from tests.producers.importers.test_otel_sdk import run_agent
from trajlake.cli import app
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

FIXTURES = Path(__file__).resolve().parents[1] / "producers" / "importers" / "fixtures"


def _land(settings: Settings) -> None:
    IngestWorker(settings).run(until_idle=2)
    assemble(Lakehouse.open(settings))


@pytest.mark.slow
@pytest.mark.integration
def test_runs_then_their_verdicts_later_through_the_cli(kafka_settings: Settings, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(FIXTURES / "mini_swe_agent_v1" / "acme__widgets-101.traj.json", runs)
    shutil.copy(FIXTURES / "openhands_v0" / "output.jsonl", runs)
    (runs / "broken.jsonl").write_text('{"instance_id": "x", "history": [\n')
    runner = CliRunner()
    result = runner.invoke(app, ["import", str(runs)])
    assert result.exit_code == 0, result.output
    assert "imported 3 sessions" in result.output and "quarantined" in result.output
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "notes.json").write_text('{"hello": "world"}')
    result = runner.invoke(app, ["import", str(runs), str(nothing)])  # no silent zero: the empty path fails it
    assert result.exit_code == 1 and "imported 3 sessions" in result.output
    assert f"1 of 2 paths gave no session ({nothing}: no recorded run in it" in str(result.exception)
    _land(kafka_settings)
    _, rows = run_query(kafka_settings, "SELECT task_id, eval_passed FROM trajectories ORDER BY task_id")
    assert rows == [("acme__widgets-101", None), ("acme__widgets-104", True), ("acme__widgets-105", False)]

    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    shutil.copy(FIXTURES / "mini_swe_agent_v1" / "acme__widgets-101.report.json", verdicts)
    (verdicts / "final_report.json").write_text(json.dumps({"resolved_ids": ["acme/gadgets:pr-7"]}))
    for _ in range(2):  # attached twice: kept once; the verdict on an instance no session has fails the command
        result = runner.invoke(app, ["import", "--verdicts", str(verdicts)])
        assert result.exit_code == 1, result.output
        assert "attached 1 verdicts (1 passed)" in result.output and "no session for acme/gadgets:pr-7" in result.output
        assert "1 of 2 verdicts match no assembled session" in str(result.exception)
    _land(kafka_settings)
    # a report keyed by a task family (or any prefix of an instance id) matches no session: nothing flips
    _, families = run_query(
        kafka_settings,
        "SELECT DISTINCT task_family FROM trajectories WHERE task_family IS NOT NULL "
        "AND task_family NOT IN (SELECT task_id FROM trajectories)",
    )
    by_family = tmp_path / "by_family.json"
    keys = [f for (f,) in families] + ["acme", "acme__widgets", "acme__widgets-10"]
    by_family.write_text(json.dumps({key: {"resolved": True, "tests_status": {}} for key in keys}))
    result = runner.invoke(app, ["import", "--verdicts", str(by_family)])
    assert result.exit_code == 1, result.output
    assert f"{len(set(keys))} of {len(set(keys))} verdicts match no assembled session" in str(result.exception)
    assert "attached 0 verdicts" in result.output
    _land(kafka_settings)
    _, rows = run_query(kafka_settings, "SELECT task_id, eval_passed FROM trajectories ORDER BY task_id")
    assert rows == [("acme__widgets-101", True), ("acme__widgets-104", True), ("acme__widgets-105", False)]
    _, rows = run_query(
        kafka_settings,
        "SELECT eval_passed, verdict_provenance FROM trajectories WHERE task_id = 'acme__widgets-101'",
    )
    assert rows == [(True, "harness_report")]
    _, evaluations = run_query(
        kafka_settings, "SELECT count(DISTINCT event_id) FROM events WHERE event_type = 'evaluation'"
    )
    assert evaluations == [(3,)]
    _, kept = run_query(kafka_settings, "SELECT reason FROM quarantine WHERE stage = 'import' ORDER BY reason")
    assert ("unknown_instance",) in kept and ("unreadable_record",) in kept


@pytest.mark.slow
@pytest.mark.integration
def test_live_otlp_traces_land_as_sessions(kafka_settings: Settings) -> None:
    producer = EventProducer(resolve_bootstrap(kafka_settings), kafka_settings.topic, "importer", redact=False)
    receiver = listen("127.0.0.1:0", producer)
    try:
        run_agent(OTLPSpanExporter(endpoint=receiver.endpoint), "conv-kafka")
        deadline = time.monotonic() + 30
        while receiver.sessions_sent < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        receiver.stop()
        producer.close()
    assert receiver.sessions_sent == 1
    _land(kafka_settings)
    _, rows = run_query(kafka_settings, "SELECT task_id, n_steps, input_tokens, status FROM trajectories")
    assert rows == [("line-counter", 2, 177, "completed")]
    _, calls = run_query(
        kafka_settings,
        "SELECT agent_input.model_call.completion_tokens FROM events WHERE event_type = 'agent_input' ORDER BY seq",
    )
    assert calls == [(31,), (9,)]  # both model calls with their usage, the final answer's too
