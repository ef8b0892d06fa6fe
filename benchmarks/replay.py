"""The hour replay: one hour of 3M/day traffic produced, ingested, assembled, scored and exported."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    BASE_US,
    Figure,
    bench_home,
    cli_child,
    cli_env,
    files_per_partition,
    print_figures,
)
from pipelines.export import ExportFilters
from warehouse.lakehouse import Lakehouse
from warehouse.tables import RAW_EVENTS

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too


def bench_replay(
    sessions: int = 125_000,
    seed: int = 3,
    home: Path | None = None,
    template_reuse: float | None = None,
    workers: int = 2,
) -> dict[str, Any]:
    """One hour of 3M/day traffic through produce → ingest → assemble → score → export.

    The synthetic fleet generates ``sessions`` arrivals at 35/s (125k ≈ one hour) on
    ``workers`` generator processes (``trajlake fleet run --workers``), each sending its
    shard flat out, while one ``trajlake ingest`` process drains the topic concurrently, as
    in production; then assembly, scoring and a training-set export run.
    The figure is the wall time against the simulated span of the traffic (ratio = times
    faster than real time; the target of 5 minutes for an hour is 12×). Also reports
    each stage's time and the data files per partition of the tables written.
    """
    import signal

    from pipelines.assemble import assemble
    from pipelines.export import export_training_set
    from pipelines.score import score_all
    from producers.fleet import run_synthetic_workers
    from warehouse.maintenance import maintain
    from warehouse.query import run_query
    from warehouse.tables import STEPS, TRAJECTORIES

    with bench_home(home) as settings:
        started = time.perf_counter()
        ingest = cli_child(["ingest", "--follow"], cli_env(settings))
        fleet = run_synthetic_workers(
            settings,
            sessions,
            seed,
            0.05,
            None,
            workers,
            {"start_us": BASE_US + 6 * 3600 * 10**6, "template_reuse": template_reuse or 1.0},
            to_kafka=True,
        )
        produced = fleet.events
        first_ts, last_ts = fleet.figures["first_event_us"], fleet.figures["last_event_us"]
        produce_s = time.perf_counter() - started
        lake = Lakehouse.open(settings)  # opened once; every stage below is handed it
        raw = lake.table(RAW_EVENTS.name)
        deadline = time.monotonic() + 1800
        while ingest.poll() is None and time.monotonic() < deadline:  # until every event is in raw_events
            snapshot = raw.refresh().current_snapshot()
            summary = snapshot.summary if snapshot is not None else None
            if summary is not None and int(summary.get("total-records", 0)) >= produced:
                break
            time.sleep(0.5)
        ingest_s = time.perf_counter() - started
        ingest.send_signal(signal.SIGTERM)
        _, stderr = ingest.communicate(timeout=120)
        if ingest.returncode != 0:
            raise RuntimeError(f"ingest exited {ingest.returncode}: {stderr.decode()[-2000:]}")
        # "Now" is just after the last event plus the idle timeout: sessions that lost their tail close too.
        as_of = datetime.fromtimestamp(last_ts / 1e6 + settings.session_idle_timeout_s + 1, UTC)
        mark = time.perf_counter()
        assemble(lake, as_of=as_of)
        assemble_s = time.perf_counter() - mark
        mark = time.perf_counter()
        scored = score_all(lake)
        score_s = time.perf_counter() - mark
        mark = time.perf_counter()
        exported = export_training_set(lake, "rl", lake.home / "exports" / "replay", filters=ALL_ORIGINS)
        export_s = time.perf_counter() - mark
        wall = time.perf_counter() - started
        rows, distinct = run_query(settings, "SELECT count(*), count(DISTINCT event_id) FROM events")[1][0]
        trajectories = run_query(settings, "SELECT count(*) FROM trajectories")[1][0][0]
        layout = {spec.name: files_per_partition(lake.table(spec.name)) for spec in (RAW_EVENTS, TRAJECTORIES, STEPS)}
        # Hot ingest writes one file per partition per batch; maintenance compacts them to the target size.
        mark = time.perf_counter()
        maintain(lake)
        compact_s = time.perf_counter() - mark
        compacted = files_per_partition(lake.table(RAW_EVENTS.name))
    span = (last_ts - first_ts) / 1e6
    if (rows, distinct) != (produced, produced) or trajectories != sessions:
        raise RuntimeError(
            f"replay lost or duplicated data: produced {produced} events of {sessions} sessions, "
            f"raw_events {rows} ({distinct} distinct), trajectories {trajectories}"
        )
    figures = [Figure("hour replay: wall vs simulated traffic span", wall, span, "s", higher_is_better=False)]
    result = {
        "sessions": sessions,
        "events": produced,
        "span_s": span,
        "wall_s": wall,
        "produce_s": produce_s,
        "ingest_done_s": ingest_s,
        "assemble_s": assemble_s,
        "score_s": score_s,
        "export_s": export_s,
        "events_per_s": produced / ingest_s,
        "trajectories": trajectories,
        "scored": scored.sessions,
        "exported": exported.records,
        "compact_s": compact_s,
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("replay", figures, result)
    for name, partitions in layout.items():
        for part in partitions:
            print(
                f"  files per partition: {name} {part['partition']}: {part['files']} files, {part['rows']:,} rows, "
                f"{part['mean_file_mb']} MB mean"
            )
    for part in compacted:
        print(
            f"  after `trajlake maintain` ({compact_s:.0f} s): raw_events {part['partition']}: "
            f"{part['files']} files, {part['mean_file_mb']} MB mean"
        )
    result["files_per_partition"] = layout
    result["files_per_partition_compacted"] = compacted
    return result
