"""Cost and health views: their numbers agree with the rows they summarise, and prices are settings."""

from __future__ import annotations

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.ingest import IngestWorker
from pipelines.score import score_all
from tests.helpers import AS_OF, one_row, produce, sample_events, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.sql import open_views


@pytest.fixture
def lake(settings: Settings) -> Settings:
    events = sample_events(12)
    for i, event in enumerate(e for e in events if e["event_type"] == "session_end"):
        event["extra"] = {**(event.get("extra") or {}), "first_command_ms": str(10.0 * (i + 1))}
    write_raw(settings, events)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    return settings


@pytest.mark.slow
def test_costs_add_up_to_the_trajectories(lake: Settings) -> None:
    con = open_views(lake)
    totals = one_row(
        con, "SELECT sum(cost_usd), sum(cpu_seconds), sum(input_tokens), sum(cached_tokens), count(*) FROM trajectories"
    )
    costs = one_row(
        con,
        "SELECT sum(inference_cost_usd), sum(cpu_seconds), sum(input_tokens), sum(cached_tokens), sum(sessions) "
        "FROM costs",
    )
    assert totals is not None and costs is not None
    assert costs == pytest.approx(totals)
    rows = con.execute(
        "SELECT inference_cost_usd, environment_cost_usd, total_cost_usd, inference_share, prompt_cache_hit_rate, "
        "cached_tokens, input_tokens, exportable_sessions, cost_per_exportable_usd FROM costs"
    ).fetchall()
    for inference, environment, total, share, hit, cached, inputs, exportable, per_exportable in rows:
        assert total == pytest.approx(inference + environment)
        assert 0 <= share <= 1 and share == pytest.approx(inference / total)
        assert hit == pytest.approx(cached / inputs)
        assert per_exportable is None if exportable == 0 else per_exportable == pytest.approx(total / exportable)
    exportable = one_row(con, "SELECT count(*) FROM scores WHERE exportable")
    assert one_row(con, "SELECT sum(exportable_sessions) FROM costs") == exportable


@pytest.mark.slow
def test_environment_prices_are_settings(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    query = "SELECT sum(environment_cost_usd) FROM costs"
    base = run_query(lake, query)[1][0][0]
    monkeypatch.setenv("TRAJLAKE_PRICE_CPU_SECOND_USD", str(2 * lake.price_cpu_second_usd))
    monkeypatch.setenv("TRAJLAKE_PRICE_MEMORY_GB_SECOND_USD", str(2 * lake.price_memory_gb_second_usd))
    assert run_query(load_settings(), query)[1][0][0] == pytest.approx(2 * base)


@pytest.mark.slow
def test_fleet_health_reads_start_latency_and_failure_causes(lake: Settings) -> None:
    con = open_views(lake)
    sessions, p50, p95, causes = one_row(
        con,
        "SELECT sum(sessions), min(start_latency_p50_ms), max(start_latency_p95_ms), "
        "list(failure_causes) FROM fleet_health",
    )
    ended = one_row(con, "SELECT count(*) FROM events WHERE event_type = 'session_end'")[0]
    assert sessions == 12
    latencies = sorted(10.0 * (i + 1) for i in range(ended))
    assert p50 == pytest.approx(latencies[len(latencies) // 2] if len(latencies) % 2 else
                                (latencies[len(latencies) // 2 - 1] + latencies[len(latencies) // 2]) / 2)  # fmt: skip
    assert latencies[0] < p95 <= latencies[-1]
    by_cause: dict[str, int] = {}
    for hour in causes:
        for cause, n in hour.items():
            by_cause[cause] = by_cause.get(cause, 0) + n
    expected = dict(con.execute("SELECT failure_cause, count(*) FROM scores GROUP BY 1").fetchall())
    assert by_cause == expected


@pytest.mark.slow
def test_pipeline_health_counts_every_event(lake: Settings) -> None:
    con = open_views(lake)
    events, lag = one_row(con, "SELECT sum(events), max(ingest_lag_p95_s) FROM pipeline_health")
    assert events == one_row(con, "SELECT count(*) FROM events")[0]
    assert lag is None  # written straight to raw_events: no Kafka timestamp, so no lag to claim


@pytest.mark.slow
@pytest.mark.integration
def test_ingest_lag_is_measured_from_kafka_not_from_back_dated_event_time(kafka_settings: Settings) -> None:
    events = sample_events(6)  # event time: 2026-01-01, long before now
    produce(kafka_settings, events)
    IngestWorker(kafka_settings).run(until_idle=2)
    con = open_views(kafka_settings)
    p50, p95 = one_row(con, "SELECT min(ingest_lag_p50_s), max(ingest_lag_p95_s) FROM pipeline_health")
    event_age = one_row(con, "SELECT min(epoch(ingested_at) - epoch(ts)) FROM events")[0]
    assert event_age > 3600  # measured from event time the lag would be this
    assert 0 <= p50 <= p95 < 300  # sent moments ago: the lag is the pipeline's, not the events' age
    assert one_row(con, "SELECT count(*) FROM events WHERE kafka_timestamp IS NULL")[0] == 0


@pytest.mark.slow
def test_health_figures_are_rounded_for_people(lake: Settings) -> None:
    con = open_views(lake)
    ms = con.execute("SELECT start_latency_p50_ms, start_latency_p95_ms FROM fleet_health").fetchall()
    seconds = con.execute("SELECT assembly_latency_p95_s, scoring_latency_p95_s FROM pipeline_health").fetchall()
    ms_values = [v for row in ms for v in row if v is not None]
    second_values = [v for row in seconds for v in row if v is not None]
    assert ms_values and second_values
    assert all(round(v, 1) == v for v in ms_values), ms_values
    assert all(round(v, 3) == v for v in second_values), second_values
