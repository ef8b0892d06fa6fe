"""Cost and health views: their numbers agree with the rows they summarise, and prices are settings."""

from __future__ import annotations

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.score import score_all
from tests.helpers import AS_OF, one_row, sample_events, write_raw
from warehouse.sql import open_views, run_query


@pytest.fixture
def lake(settings: Settings) -> Settings:
    events = sample_events(12)
    for i, event in enumerate(e for e in events if e["event_type"] == "session_end"):
        event["extra"] = {**(event.get("extra") or {}), "first_command_ms": str(10.0 * (i + 1))}
    write_raw(settings, events)
    assemble(settings, as_of=AS_OF)
    score_all(settings)
    return settings


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


def test_environment_prices_are_settings(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    query = "SELECT sum(environment_cost_usd) FROM costs"
    base = run_query(lake, query)[1][0][0]
    monkeypatch.setenv("TRAJLAKE_PRICE_CPU_SECOND_USD", str(2 * lake.price_cpu_second_usd))
    monkeypatch.setenv("TRAJLAKE_PRICE_MEMORY_GB_SECOND_USD", str(2 * lake.price_memory_gb_second_usd))
    assert run_query(load_settings(), query)[1][0][0] == pytest.approx(2 * base)


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


def test_pipeline_health_counts_every_event(lake: Settings) -> None:
    con = open_views(lake)
    events, lag = one_row(con, "SELECT sum(events), max(ingest_lag_p95_s) FROM pipeline_health")
    assert events == one_row(con, "SELECT count(*) FROM events")[0]
    assert lag > 0  # the sample traffic's event time is in the past


def test_health_views_are_readable_through_locked_sql(lake: Settings) -> None:
    for view in ("costs", "fleet_health", "pipeline_health"):
        columns, rows = run_query(lake, f"SELECT * FROM {view}")
        assert columns and rows, view
