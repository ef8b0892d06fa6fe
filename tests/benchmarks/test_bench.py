"""Tiny runs of every benchmark so they cannot rot (figures are printed, never asserted as timings)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.harness import Figure, encoded_events
from benchmarks.ingest import bench_decode, bench_ingest, bench_memory, bench_scaleout
from benchmarks.lakehouse import bench_query
from schemas.registry import decode_event


def test_figure_ratio_direction() -> None:
    assert Figure("rate", 200.0, 100.0, "events/s").ratio == 2.0
    assert Figure("time", 0.5, 2.0, "s", higher_is_better=False).ratio == 4.0
    assert "ratio 2.00×" in Figure("rate", 200.0, 100.0, "events/s").line()


def test_encoded_events_are_decodable_and_sized() -> None:
    records = encoded_events(100)
    assert len(records) == 100
    assert len({event_id for _, event_id, _ in records}) == 100
    session_id, event_id, value = records[0]
    event = decode_event(value)
    assert (event["session_id"], event["event_id"]) == (session_id, event_id)


@pytest.mark.slow
def test_bench_decode_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    result = bench_decode(events=300)
    assert result["events"] == 300 and result["figures"][0]["ratio"] > 0
    assert "baseline" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_query_smoke(tmp_path: Path) -> None:
    result = bench_query(events=2_000, home=tmp_path)
    assert 1 <= result["files"] <= result["files_as_ingested"]
    assert {f["name"] for f in result["figures"]} == {
        "aggregate (count by event_type) vs full scan",
        "one session's events vs full scan",
        "one session's events, as ingested vs full scan",
    }


@pytest.mark.slow
@pytest.mark.integration
def test_bench_ingest_smoke_lands_every_event(tmp_path: Path) -> None:
    result = bench_ingest(events=1_500, home=tmp_path, naive=True)
    assert result["events"] == 1_500 and result["batches"] >= 1
    assert len(result["figures"]) == 2


@pytest.mark.integration
@pytest.mark.slow
def test_bench_ingest_ab_measures_each_checkout_and_the_consume_loop() -> None:
    from benchmarks.ingest_ab import HERE, bench_ingest_ab

    result = bench_ingest_ab({"A": HERE, "B": HERE}, events=1_500, rounds=1)
    summaries = result["summaries"]
    assert set(summaries) == {"A", "B", "consume-only"}
    assert all(s["runs"] == 1 and s["cpu_us_per_event"] > 0 for s in summaries.values())
    assert result["b_over_a_cpu_us_per_event"] > 0
    assert summaries["A"]["worker_gc_us_per_event"] >= 0 and summaries["consume-only"]["worker_gc_us_per_event"] is None


def test_the_ingest_child_times_the_collector() -> None:
    import gc

    from benchmarks.ingest_child import _CollectorTimer

    timer = _CollectorTimer()
    gc.callbacks.append(timer)
    try:
        held = [[i] for i in range(300_000)]  # enough tracked objects for a full collection to take CPU
        gc.collect()
        del held
    finally:
        gc.callbacks.remove(timer)
    assert timer.collections >= 1 and timer.seconds > 0


@pytest.mark.integration
@pytest.mark.slow
def test_bench_ingest_guard_fails_below_its_floor() -> None:
    from benchmarks.ingest_ab import bench_ingest_guard

    # Ingest always costs more CPU per event than consuming alone: a floor of 1 cannot be met.
    result = bench_ingest_guard(events=1_500, rounds=1, floor=1.0)
    assert 0 < result["ratio"] < 1 and not result["passed"]


@pytest.mark.integration
@pytest.mark.stress
def test_bench_memory_smoke_measures_both_backlogs(tmp_path: Path) -> None:
    result = bench_memory(events=2_000, home=tmp_path)
    assert result["peak_rss_mib"] > 0 and result["baseline_peak_rss_mib"] > 0


@pytest.mark.integration
@pytest.mark.stress
def test_bench_scaleout_two_workers_split_partitions_without_duplicates(tmp_path: Path) -> None:
    result = bench_scaleout(events=2_000, home=tmp_path)
    assert result["two_workers_rows"] == result["one_worker_rows"] == 2_000
    assert (result["two_workers_duplicates"], result["two_workers_lost"]) == (0, 0)
    assert result["partitions_covered"] == 8
    # Each child reports what separates ingest's coordination from the scheduler's costs.
    for runs in result["children"].values():
        for child in (c for run in runs for c in run):
            assert isinstance(child["commit_retries"], int) and isinstance(child["skipped"], int)
            assert child["batches"] >= 1 and child["assignments"] >= 1
            assert all(isinstance(n, int) and n >= 0 for n in child["worker_switches"] + child["decoder_switches"])
    # Pinned, each child and the decoder it spawned are on one CPU, the pair's on different ones.
    if len(os.sched_getaffinity(0)) >= 2:
        assert result["scale_out_factor_pinned"] > 0
        for config, width in (("one pinned", 1), ("two pinned", 2)):
            for run in result["children"][config]:
                assert [c["cpus"] for c in run] == [c["decoder_cpus"] for c in run]
                assert all(len(c["cpus"]) == 1 for c in run) and len({c["cpus"][0] for c in run}) == width


def test_every_benchmark_module_is_reachable_from_a_command() -> None:
    import re

    import benchmarks.cli

    root = Path(benchmarks.cli.__file__).parent
    modules = {p.stem for p in root.glob("*.py")} - {
        "__init__",
        "cli",
        "harness",
        "ingest_child",  # the measured child of ingest-ab and the guard, run as a script
        "secret_corpus",
        "secret_corpus_public",
        "carrier_corpus",  # the shared corpus laid into carriers, used by bench redaction and its tests
        "detectors",  # run as `python -m benchmarks.detectors` in a venv of its own (the detector libraries)
    }
    commanded = set(re.findall(r"from benchmarks\.(\w+) import", Path(benchmarks.cli.__file__).read_text()))
    assert modules <= commanded, f"benchmark modules without a command: {sorted(modules - commanded)}"


@pytest.mark.integration
@pytest.mark.stress
def test_bench_automation_measures_every_closed_session(tmp_path: Path) -> None:
    from benchmarks.automation import bench_automation

    result = bench_automation(seconds=20, rate=5, time_compression=10, home=tmp_path, max_wait_s=240)
    assert {f["name"] for f in result["figures"]} == {
        f"closed session → {table} p95, automation vs {other}"
        for table in ("trajectories", "scores")
        for other in ("target", "assemble && score loop")
    }
    for side in ("dagster", "loop"):
        run = result[side]
        assert run["closed_sessions"] > 0
        assert run["measured_trajectories"] == run["measured_scores"] == run["closed_sessions"]
        # A session is visible only after its end was sent, scored only after it was assembled, and
        # the row's stamp (taken before the commit) never comes after the poll that saw the row.
        assert 0 < run["trajectories_p50_s"] <= run["scores_p50_s"]
        assert run["trajectories_assembled_at_max_s"] <= run["trajectories_max_s"]
        assert run["scores_scored_at_max_s"] <= run["scores_max_s"]
    assert result["loop"]["loop_runs"]["score"] >= 1


@pytest.mark.slow
@pytest.mark.integration
def test_bench_cold_smoke_finds_its_sessions_at_both_sizes() -> None:
    pytest.importorskip("moto.server", reason="moto[server] is a dev extra: pip install -e '.[dev]'")
    from benchmarks.cold import bench_cold

    result = bench_cold(events=20_000, larger=40_000, per_day=10_000, baseline=False)
    for size in ("20000", "40000"):
        measured = result["sizes"][size]
        assert measured["lookup_rows"] > 0  # the looked-up sessions exist: an empty answer is fast and wrong
        assert measured["aggregate_rows"] == 10_000  # one day's events, counted once
        assert measured["lookup_first_s"] > 0 and measured["peak_rss_bytes"] > 0
        assert measured["lookup_gets"] > 0  # the data comes from the store (footers from the cache)


@pytest.mark.slow
def test_bench_sql_start_measures_the_query_process_against_in_process() -> None:
    from benchmarks.sql_start import bench_sql_start

    result = bench_sql_start(repeat=1)
    figures = {f["name"]: f for f in result["figures"]}
    assert len(figures) == 3 and all(f["value"] > 0 and f["baseline"] > 0 for f in figures.values())
