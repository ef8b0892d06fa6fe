"""Lakehouse benchmarks: assembly of a large backlog and DuckDB queries over raw events."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.harness import (
    Figure,
    bench_home,
    child_peak_rss,
    cli_env,
    encoded_events,
    print_figures,
    timed,
)
from pipelines.decode import BatchDecoder, with_coordinates
from warehouse.lakehouse import Lakehouse
from warehouse.tables import RAW_EVENTS


def load_raw_events(lake: Lakehouse, events: int, batch_rows: int = 250_000) -> int:
    """Append ``events`` synthetic events to raw_events in large batches (data for query benchmarks)."""
    table = lake.table(RAW_EVENTS.name)
    schema = RAW_EVENTS.arrow_schema()
    now = datetime.now(UTC)
    written = 0
    with BatchDecoder(schema, isolate=False) as decoder:  # our own well-formed bytes
        while written < events:
            values = [v for _, _, v in encoded_events(min(batch_rows, events - written), seed=written + 1)]
            decoded = decoder.decode(values)
            n = len(values)
            arrow = with_coordinates(
                decoded.events,
                schema,
                "bench",
                pa.array([0] * n, pa.int32()),
                pa.array(range(written, written + n)),
                now,
            )
            table.append(arrow.sort_by([("session_id", "ascending"), ("seq", "ascending")]))
            written += n
    return written


def bench_query(events: int = 1_000_000, home: Path | None = None) -> dict[str, Any]:
    """DuckDB over raw events: typical aggregates and one session's events.

    Measured on the files as ingested (one per load batch) and after ``trajlake maintain``
    compacted them (the steady-state layout; the headline figures). Baseline: the same query
    over the ingested Parquet files with pruning defeated (every file read into Arrow, then
    filtered), i.e. what a full scan costs.
    """
    import duckdb
    import pyarrow.parquet as pq

    from warehouse.maintenance import maintain
    from warehouse.snapshots import current_files

    with bench_home(home, kafka=False) as settings:
        lake = Lakehouse.open(settings)
        load_raw_events(lake, events)
        con = lake.views()
        sampled = con.execute("SELECT session_id FROM events USING SAMPLE 1 ROWS").fetchone()
        if sampled is None:
            raise RuntimeError("the events view is empty after loading raw events")
        session_id = sampled[0]
        aggregate = "SELECT event_type, count(*), count(DISTINCT session_id) FROM events GROUP BY event_type"
        lookup = f"SELECT * FROM events WHERE session_id = '{session_id}' ORDER BY seq"

        def paths() -> list[str]:
            table = lake.table(RAW_EVENTS.name)
            return [path.removeprefix("file://") for path in current_files(table).paths]

        files = paths()

        def full_scan(query: str) -> None:
            scan = duckdb.connect()
            scan.register("events", pq.read_table(files))
            scan.execute(query).fetchall()

        ingested_agg_s = timed(lambda: con.execute(aggregate).fetchall())
        ingested_lookup_s = timed(lambda: con.execute(lookup).fetchall())
        # The layout queries meet in steady state: after `trajlake maintain` has compacted the
        # ingest batches' files into sorted, disjoint session ranges.
        started = time.perf_counter()
        maintain(lake)
        maintain_s = time.perf_counter() - started
        compacted = paths()
        con = lake.views()
        agg_s = timed(lambda: con.execute(aggregate).fetchall())
        lookup_s = timed(lambda: con.execute(lookup).fetchall())
        # Last: at 10M events a full scan holds ~12 GB of Arrow (the ingested files are still on
        # disk; orphans are only removed after a day).
        agg_base = timed(lambda: full_scan(aggregate), repeat=1)
        lookup_base = timed(lambda: full_scan(lookup), repeat=1)
    figures = [
        Figure("aggregate (count by event_type) vs full scan", agg_s, agg_base, "s", higher_is_better=False),
        Figure("one session's events vs full scan", lookup_s, lookup_base, "s", higher_is_better=False),
        Figure(
            "one session's events, as ingested vs full scan",
            ingested_lookup_s,
            lookup_base,
            "s",
            higher_is_better=False,
        ),
    ]
    result = {
        "events": events,
        "aggregate_s": agg_s,
        "session_lookup_s": lookup_s,
        "files": len(compacted),
        "files_as_ingested": len(files),
        "aggregate_as_ingested_s": ingested_agg_s,
        "session_lookup_as_ingested_s": ingested_lookup_s,
        "maintain_s": maintain_s,
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("query", figures, result)
    return result


def bench_assemble(events: int = 10_000_000, home: Path | None = None) -> dict[str, Any]:
    """Assembly of ``events`` raw events from scratch: peak RSS (process tree) vs ten times fewer events.

    Each size is loaded into its own namespace, then ``trajlake assemble`` runs as a
    child process under the default ``TRAJLAKE_ASSEMBLE_MEMORY_LIMIT`` (DuckDB spills
    beyond it). A ratio near 1 means assembly memory does not grow with the backlog.
    """
    from warehouse.query import run_query

    small = max(events // 10, 1)
    measured: dict[int, tuple[int, float, int]] = {}
    with bench_home(home, kafka=False) as settings:
        for size in (small, events):
            namespace = f"assemble_{size}"
            lake = Lakehouse.open(settings.model_copy(update={"namespace": namespace}))
            load_raw_events(lake, size)
            env = cli_env(settings, TRAJLAKE_NAMESPACE=namespace)
            peak, seconds = child_peak_rss(["assemble"], env)
            trajectories = run_query(lake.settings, "SELECT count(*) FROM trajectories")[1][0][0]
            measured[size] = (peak, seconds, trajectories)
    (small_rss, small_s, _), (big_rss, big_s, sessions) = measured[small], measured[events]
    figures = [
        Figure(
            f"assemble peak RSS, {events:,} events vs {small:,}",
            big_rss / 2**20,
            small_rss / 2**20,
            "MiB",
            higher_is_better=False,
        )
    ]
    result = {
        "events": events,
        "sessions": sessions,
        "peak_rss_mib": big_rss / 2**20,
        "assemble_s": big_s,
        "baseline_peak_rss_mib": small_rss / 2**20,
        "baseline_assemble_s": small_s,
        "memory_limit": settings.assemble_memory_limit,
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("assemble", figures, result)
    return result
