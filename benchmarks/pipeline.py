"""Benchmarks: each measures a figure and its baseline in the same run and prints the ratio.

The machine is shared and noisy, so a single absolute time misleads; every
benchmark reports ``figure``, ``baseline`` and ``ratio`` side by side. Each runs
on its own ``TRAJLAKE_HOME`` (a temporary directory by default) with its own
embedded broker when it needs Kafka, and returns a plain dict.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer

from common.broker import ensure_topic, resolve_bootstrap, start_broker, stop_broker, wait_for_kafka
from common.settings import Settings, load_settings
from pipelines.decode import BatchDecoder, with_coordinates
from pipelines.ingest import IngestWorker, consumer_config, event_row
from producers.sdk import EventProducer
from schemas.errors import DecodeError
from schemas.registry import decode_event
from warehouse.catalog import open_catalog
from warehouse.tables import RAW_EVENTS, ensure_table

BASE_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


@dataclass
class Figure:
    """A measured figure, its same-run baseline, and what "better" means."""

    name: str
    value: float
    baseline: float
    unit: str
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        """value / baseline (speed-up when higher is better), or baseline / value for times."""
        if self.higher_is_better:
            return self.value / self.baseline if self.baseline else float("inf")
        return self.baseline / self.value if self.value else float("inf")

    def line(self) -> str:
        """One printable line: figure, baseline, ratio."""
        unit = self.unit
        return f"{self.name}: {self.value:,.3g} {unit}  baseline {self.baseline:,.3g} {unit}  ratio {self.ratio:.2f}×"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output."""
        return {
            "name": self.name,
            "value": self.value,
            "baseline": self.baseline,
            "unit": self.unit,
            "ratio": self.ratio,
        }


def encoded_events(n_events: int, seed: int = 11) -> list[tuple[str, str, bytes]]:
    """``(session_id, event_id, value)`` of ``n_events`` events of synthetic fleet traffic, pre-encoded.

    Encoding happens before any timing: benchmarks measure what happens after a
    sandbox host has produced bytes. The traffic is the synthetic fleet's (Poisson
    arrivals, the reference tool mix and output sizes), in event-time order.
    """
    from producers.fleet.synthetic import SyntheticFleet

    out: list[tuple[str, str, bytes]] = []
    fleet = SyntheticFleet(start_us=BASE_US)
    while len(out) < n_events:
        sessions = max(10, (n_events - len(out)) // 40)
        stream = fleet.stream(sessions, seed, 0.05)
        out.extend((session_id, event_id, value) for _, session_id, event_id, value in stream)
        seed += 1
    return out[:n_events]


@contextlib.contextmanager
def bench_home(home: Path | None = None, kafka: bool = True) -> Iterator[Settings]:
    """Settings on a fresh TRAJLAKE_HOME, with a running embedded broker and topic when ``kafka``."""
    with contextlib.ExitStack() as stack:
        if home is None:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trajlake-bench-")))
        settings = load_settings(home=home, topic=f"bench-{uuid.uuid4().hex[:8]}")
        if kafka and settings.kafka_bootstrap is None:
            state = start_broker(settings)
            stack.callback(stop_broker, settings)
            settings = load_settings(home=home, topic=settings.topic, kafka_bootstrap=state.bootstrap)
        if kafka:
            wait_for_kafka(resolve_bootstrap(settings))
            ensure_topic(resolve_bootstrap(settings), settings.topic, settings.topic_partitions)
        yield settings


def produce_encoded(settings: Settings, records: list[tuple[str, str, bytes]]) -> float:
    """Send pre-encoded records and wait for acks; returns seconds taken."""
    producer = EventProducer(resolve_bootstrap(settings), settings.topic, "bench-host")
    started = time.perf_counter()
    for session_id, event_id, value in records:
        producer.send(session_id, event_id, value)
    producer.flush(600)
    return time.perf_counter() - started


def _consume_all(
    settings: Settings, expected: int, on_batch: Callable[[list[Any]], None], group: str
) -> tuple[float, int]:
    """Consume ``expected`` records in a new group, handing each poll's messages to ``on_batch``.

    Returns seconds from the first record received to the last batch handled, and bytes.
    """
    config = consumer_config(settings.model_copy(update={"consumer_group": group}), resolve_bootstrap(settings))
    consumer = Consumer(config)
    consumer.subscribe([settings.topic])
    seen = n_bytes = 0
    first: float | None = None
    deadline = time.monotonic() + 120 + expected / 1000
    try:
        while seen < expected and time.monotonic() < deadline:
            messages = [m for m in consumer.consume(num_messages=10_000, timeout=0.5) if _ok(m)]
            if not messages:
                continue
            first = first or time.perf_counter()
            on_batch(messages)
            seen += len(messages)
            n_bytes += sum(len(m.value() or b"") for m in messages)
    finally:
        consumer.close()
    if seen < expected:
        raise RuntimeError(f"consumed {seen} of {expected} records from {settings.topic} before the deadline")
    return time.perf_counter() - (first or time.perf_counter()), n_bytes


def _ok(message: Any) -> bool:
    # Partition EOF and transient errors carry no record; librdkafka retries on its own.
    return message.error() is None


def bench_ingest(events: int = 200_000, home: Path | None = None, naive: bool = True) -> dict[str, Any]:
    """Kafka → Iceberg raw events: ingest vs the consume+decode floor and a naive pyiceberg baseline.

    Args:
        events: records in the backlog.
        home: TRAJLAKE_HOME to use (a temporary directory by default).
        naive: also run the naive baseline (per-record dicts appended with pyiceberg).
    """
    records = encoded_events(events)
    with bench_home(home) as settings:
        produce_seconds = produce_encoded(settings, records)
        max_bytes = settings.max_event_bytes

        def floor_batch(messages: list[Any]) -> None:
            for message in messages:
                with contextlib.suppress(DecodeError):
                    decode_event(message.value() or b"", max_bytes=max_bytes)

        floor_seconds, n_bytes = _consume_all(settings, events, floor_batch, f"floor-{uuid.uuid4().hex[:6]}")

        result: dict[str, Any] = {
            "events": events,
            "mb": n_bytes / 1e6,
            "produce_events_per_s": events / produce_seconds,
        }
        if naive:
            naive_settings = settings.model_copy(update={"namespace": "naive"})
            catalog = open_catalog(naive_settings)
            table = ensure_table(catalog, naive_settings, RAW_EVENTS.name)
            schema = RAW_EVENTS.arrow_schema()

            def naive_batch(messages: list[Any]) -> None:
                now = datetime.now(UTC)
                rows = []
                for m in messages:
                    with contextlib.suppress(DecodeError):
                        event = decode_event(m.value() or b"", max_bytes=max_bytes)
                        rows.append(event_row(event, m.topic(), m.partition(), m.offset(), now))
                table.append(pa.Table.from_pylist(rows, schema=schema))

            naive_seconds, _ = _consume_all(settings, events, naive_batch, f"naive-{uuid.uuid4().hex[:6]}")
            result["naive_events_per_s"] = events / naive_seconds

        stats = IngestWorker(settings).run(until_idle=2.0)
        if stats.events != events:
            raise RuntimeError(f"ingest landed {stats.events} of {events} events ({stats.as_dict()})")
        # The worker's own timings: from its first received record to the end of its last batch commit.
        ingest_seconds = stats.timings.first_record_to_last_commit_s
        rate = events / ingest_seconds
        figures = [
            Figure("ingest vs floor (consume+per-record decode, no sink)", rate, events / floor_seconds, "events/s")
        ]
        if naive:
            figures.append(
                Figure("ingest vs naive (dicts + pyiceberg append)", rate, result["naive_events_per_s"], "events/s")
            )
        result.update(
            events_per_s=rate,
            mb_per_s=n_bytes / 1e6 / ingest_seconds,
            floor_events_per_s=events / floor_seconds,
            batches=stats.batches,
            consume_s=stats.timings.consume_s,
            decode_s=stats.timings.decode_s,
            commit_s=stats.timings.commit_s,
            figures=[f.as_dict() for f in figures],
        )
    _print("ingest", figures, result)
    return result


def bench_decode(events: int = 50_000) -> dict[str, Any]:
    """Batch decoding vs per-record ``decode_event`` + ``from_pylist`` on the same bytes (no Kafka)."""
    values = [value for _, _, value in encoded_events(events)]
    schema = RAW_EVENTS.arrow_schema()
    now = datetime.now(UTC)
    started = time.perf_counter()
    rows = [event_row(decode_event(v), "t", 0, i, now) for i, v in enumerate(values)]
    pa.Table.from_pylist(rows, schema=schema)
    baseline = events / (time.perf_counter() - started)
    with BatchDecoder(schema, isolate=True) as decoder:
        decoder.decode(values[:10])  # start the decoder process outside the timing
        started = time.perf_counter()
        decoded = decoder.decode(values)
        n = len(values)
        with_coordinates(decoded.events, schema, "t", pa.array([0] * n, pa.int32()), pa.array(range(n)), now)
        rate = events / (time.perf_counter() - started)
    figures = [Figure("batch decode vs per-record decode_event", rate, baseline, "events/s")]
    result = {
        "events": events,
        "events_per_s": rate,
        "baseline_events_per_s": baseline,
        "figures": [f.as_dict() for f in figures],
    }
    _print("decode", figures, result)
    return result


def load_raw_events(settings: Settings, events: int, batch_rows: int = 250_000) -> int:
    """Append ``events`` synthetic events to raw_events in large batches (data for query benchmarks)."""
    catalog = open_catalog(settings)
    table = ensure_table(catalog, settings, RAW_EVENTS.name)
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


def _timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


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
    from warehouse.sql import open_views

    with bench_home(home, kafka=False) as settings:
        load_raw_events(settings, events)
        con = open_views(settings)
        sampled = con.execute("SELECT session_id FROM events USING SAMPLE 1 ROWS").fetchone()
        if sampled is None:
            raise RuntimeError("the events view is empty after loading raw events")
        session_id = sampled[0]
        aggregate = "SELECT event_type, count(*), count(DISTINCT session_id) FROM events GROUP BY event_type"
        lookup = f"SELECT * FROM events WHERE session_id = '{session_id}' ORDER BY seq"

        def paths() -> list[str]:
            table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
            return [path.removeprefix("file://") for path in current_files(table).paths]

        files = paths()

        def full_scan(query: str) -> None:
            scan = duckdb.connect()
            scan.register("events", pq.read_table(files))
            scan.execute(query).fetchall()

        ingested_agg_s = _timed(lambda: con.execute(aggregate).fetchall())
        ingested_lookup_s = _timed(lambda: con.execute(lookup).fetchall())
        # The layout queries meet in steady state: after `trajlake maintain` has compacted the
        # ingest batches' files into sorted, disjoint session ranges.
        started = time.perf_counter()
        maintain(settings)
        maintain_s = time.perf_counter() - started
        compacted = paths()
        con = open_views(settings)
        agg_s = _timed(lambda: con.execute(aggregate).fetchall())
        lookup_s = _timed(lambda: con.execute(lookup).fetchall())
        # Last: at 10M events a full scan holds ~12 GB of Arrow (the ingested files are still on
        # disk; orphans are only removed after a day).
        agg_base = _timed(lambda: full_scan(aggregate), repeat=1)
        lookup_base = _timed(lambda: full_scan(lookup), repeat=1)
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
    _print("query", figures, result)
    return result


def _print(name: str, figures: list[Figure], result: dict[str, Any]) -> None:
    print(f"== bench {name} ==")
    for figure in figures:
        print("  " + figure.line())
    for key, value in result.items():
        if key != "figures":
            print(f"  {key}: {value:,.4g}" if isinstance(value, float) else f"  {key}: {value}")


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "ingest": bench_ingest,
    "decode": bench_decode,
    "query": bench_query,
}


def _tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def _cli_env(settings: Settings, **overrides: str) -> dict[str, str]:
    """``TRAJLAKE_*`` variables that point a child ``trajlake`` at ``settings``' home, broker, topic, namespace."""
    env = {
        "TRAJLAKE_HOME": str(settings.home_dir),
        "TRAJLAKE_TOPIC": settings.topic,
        "TRAJLAKE_NAMESPACE": settings.namespace,
    }
    if settings.kafka_bootstrap:
        env["TRAJLAKE_KAFKA_BOOTSTRAP"] = settings.kafka_bootstrap
    return {**env, **overrides}


def _cli_child(args: list[str], env: dict[str, str]) -> Any:
    """``python -m trajlake.cli *args`` as a child process with ``env`` added (stderr kept for errors)."""
    import os
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", *args],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _child_peak_rss(args: list[str], env: dict[str, str]) -> tuple[int, float]:
    """Run ``python -m trajlake.cli *args`` as a child; returns its peak tree RSS (bytes) and seconds."""
    started = time.perf_counter()
    child = _cli_child(args, env)
    peak = 0
    while child.poll() is None:
        peak = max(peak, _tree_rss_bytes(child.pid))
        time.sleep(0.1)
    if child.returncode != 0:
        raise RuntimeError(
            f"trajlake {' '.join(args)} exited {child.returncode}: {child.stderr.read().decode()[-2000:]}"
        )
    return peak, time.perf_counter() - started


def _ingest_peak_rss(settings: Settings, topic: str, group: str) -> tuple[int, float]:
    """Run ``trajlake ingest --until-idle`` as a child on ``topic``; returns its peak tree RSS and seconds."""
    env = _cli_env(settings, TRAJLAKE_TOPIC=topic, TRAJLAKE_CONSUMER_GROUP=group)
    return _child_peak_rss(["ingest", "--until-idle", "2"], env)


def bench_assemble(events: int = 10_000_000, home: Path | None = None) -> dict[str, Any]:
    """Assembly of ``events`` raw events from scratch: peak RSS (process tree) vs ten times fewer events.

    Each size is loaded into its own namespace, then ``trajlake assemble`` runs as a
    child process under the default ``TRAJLAKE_ASSEMBLE_MEMORY_LIMIT`` (DuckDB spills
    beyond it). A ratio near 1 means assembly memory does not grow with the backlog.
    """
    from warehouse.sql import run_query

    small = max(events // 10, 1)
    measured: dict[int, tuple[int, float, int]] = {}
    with bench_home(home, kafka=False) as settings:
        for size in (small, events):
            namespace = f"assemble_{size}"
            load_raw_events(settings.model_copy(update={"namespace": namespace}), size)
            env = _cli_env(settings, TRAJLAKE_NAMESPACE=namespace)
            peak, seconds = _child_peak_rss(["assemble"], env)
            trajectories = run_query(
                settings.model_copy(update={"namespace": namespace}), "SELECT count(*) FROM trajectories"
            )[1][0][0]
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
    _print("assemble", figures, result)
    return result


def bench_memory(events: int = 1_000_000, home: Path | None = None) -> dict[str, Any]:
    """Ingest peak RSS (process tree) with a backlog of ``events`` vs a backlog ten times smaller.

    A ratio near 1 means memory does not grow with the backlog (batches are bounded).
    """
    small = max(events // 10, 1)
    with bench_home(home) as settings:
        topics = {}
        for size in (small, events):
            topic = f"{settings.topic}-{size}"
            ensure_topic(resolve_bootstrap(settings), topic, settings.topic_partitions)
            produce_encoded(settings.model_copy(update={"topic": topic}), encoded_events(size))
            topics[size] = topic
        small_rss, _ = _ingest_peak_rss(settings, topics[small], f"mem-{small}")
        big_rss, big_s = _ingest_peak_rss(settings, topics[events], f"mem-{events}")
    figures = [
        Figure(
            f"ingest peak RSS, backlog {events:,} vs {small:,}",
            big_rss / 2**20,
            small_rss / 2**20,
            "MiB",
            higher_is_better=False,
        )
    ]
    result = {
        "events": events,
        "peak_rss_mib": big_rss / 2**20,
        "baseline_peak_rss_mib": small_rss / 2**20,
        "ingest_s": big_s,
        "figures": [f.as_dict() for f in figures],
    }
    _print("memory", figures, result)
    return result


BENCHMARKS["memory"] = bench_memory
BENCHMARKS["assemble"] = bench_assemble


def _ingest_children(settings: Settings, topic: str, group: str, namespace: str, workers: int) -> float:
    """Run ``workers`` ``trajlake ingest --until-idle`` processes in one group; returns wall seconds."""
    env = _cli_env(settings, TRAJLAKE_TOPIC=topic, TRAJLAKE_CONSUMER_GROUP=group, TRAJLAKE_NAMESPACE=namespace)
    started = time.perf_counter()
    children = [_cli_child(["ingest", "--until-idle", "3"], env) for _ in range(workers)]
    for child in children:
        _, stderr = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"ingest worker exited {child.returncode}: {stderr.decode()[-2000:]}")
    return time.perf_counter() - started


def bench_scaleout(events: int = 300_000, home: Path | None = None) -> dict[str, Any]:
    """Two ingest processes in one consumer group vs one, on the same backlog, with a duplicate check.

    Each side drains the same topic into its own namespace; wall time includes process start,
    the group join and the idle window for both, so the ratio compares like with like. On a
    2-core machine the two workers share the cores: the figure is evidence that partitions
    split cleanly and exactly-once holds across workers, not a cluster throughput.
    """
    from warehouse.sql import run_query

    with bench_home(home) as settings:
        produce_encoded(settings, encoded_events(events))
        one_s = _ingest_children(settings, settings.topic, f"one-{uuid.uuid4().hex[:6]}", "scale_one", 1)
        two_s = _ingest_children(settings, settings.topic, f"two-{uuid.uuid4().hex[:6]}", "scale_two", 2)
        counts = {}
        for namespace in ("scale_one", "scale_two"):
            rows = run_query(
                settings.model_copy(update={"namespace": namespace}),
                "SELECT count(*), count(DISTINCT event_id), count(DISTINCT kafka_partition) FROM events",
            )[1]
            counts[namespace] = rows[0]
    figures = [
        Figure("2 ingest processes vs 1 (same backlog, wall incl. join)", events / two_s, events / one_s, "events/s")
    ]
    total, distinct, partitions = counts["scale_two"]
    result = {
        "events": events,
        "one_worker_s": one_s,
        "two_workers_s": two_s,
        "two_workers_rows": total,
        "two_workers_distinct_event_ids": distinct,
        "two_workers_duplicates": total - distinct,
        "two_workers_lost": events - distinct,
        "partitions_covered": partitions,
        "one_worker_rows": counts["scale_one"][0],
        "figures": [f.as_dict() for f in figures],
    }
    _print("scaleout", figures, result)
    return result


BENCHMARKS["scaleout"] = bench_scaleout


def files_per_partition(table: Any) -> list[dict[str, Any]]:
    """Live data files of ``table`` per partition: files, rows, mean file size (MB)."""
    files = table.inspect.files().select(["partition", "record_count", "file_size_in_bytes"]).to_pylist()
    by_partition: dict[str, list[dict[str, Any]]] = {}
    for row in files:
        by_partition.setdefault(str(row["partition"]), []).append(row)
    return [
        {
            "partition": key,
            "files": len(rows),
            "rows": sum(r["record_count"] for r in rows),
            "mean_file_mb": round(sum(r["file_size_in_bytes"] for r in rows) / len(rows) / 1e6, 2),
        }
        for key, rows in sorted(by_partition.items())
    ]


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
    from warehouse.sql import run_query
    from warehouse.tables import STEPS, TRAJECTORIES

    with bench_home(home) as settings:
        started = time.perf_counter()
        ingest = _cli_child(["ingest", "--follow"], _cli_env(settings))
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
        raw = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
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
        assemble(settings, as_of=as_of)
        assemble_s = time.perf_counter() - mark
        mark = time.perf_counter()
        scored = score_all(settings)
        score_s = time.perf_counter() - mark
        mark = time.perf_counter()
        exported = export_training_set(settings, "rl", settings.home_dir / "exports" / "replay")
        export_s = time.perf_counter() - mark
        wall = time.perf_counter() - started
        rows, distinct = run_query(settings, "SELECT count(*), count(DISTINCT event_id) FROM events")[1][0]
        trajectories = run_query(settings, "SELECT count(*) FROM trajectories")[1][0][0]
        catalog = open_catalog(settings)
        layout = {
            spec.name: files_per_partition(ensure_table(catalog, settings, spec.name))
            for spec in (RAW_EVENTS, TRAJECTORIES, STEPS)
        }
        # Hot ingest writes one file per partition per batch; maintenance compacts them to the target size.
        mark = time.perf_counter()
        maintain(settings)
        compact_s = time.perf_counter() - mark
        compacted = files_per_partition(ensure_table(open_catalog(settings), settings, RAW_EVENTS.name))
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
    _print("replay", figures, result)
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


BENCHMARKS["replay"] = bench_replay


def bench_freshness(
    rate: float = 2_000.0, seconds: float = 60.0, home: Path | None = None, poll_s: float = 0.2
) -> dict[str, Any]:
    """``trajlake ingest --follow``: time from an event's send to its visibility in ``raw_events``.

    Events are sent at a steady ``rate`` (2,000/s ≈ the average of 3M sessions/day) for
    ``seconds``; a poller refreshes the Iceberg table every ``poll_s`` and stamps the
    events of each new snapshot. Baseline, in the same run: the broker's own delivery
    latency, send → received by a plain consumer in another group. The ratio says how
    much later than Kafka itself an event becomes queryable.
    """
    import signal
    import threading

    import numpy as np

    from warehouse.snapshots import current_files, files_added_since
    from warehouse.sql import connect, parquet_source

    with bench_home(home) as settings:
        records = encoded_events(int(rate * seconds))
        sent: dict[str, float] = {}
        delivered: dict[str, float] = {}
        visible: dict[str, float] = {}
        done = threading.Event()
        ingest = _cli_child(["ingest", "--follow"], _cli_env(settings))
        table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)

        def consume_plain() -> None:
            group = f"fresh-{uuid.uuid4().hex[:6]}"
            config = consumer_config(
                settings.model_copy(update={"consumer_group": group}), resolve_bootstrap(settings), follow=True
            )
            consumer = Consumer({**config, "fetch.min.bytes": 1, "fetch.wait.max.ms": 10})
            consumer.subscribe([settings.topic])
            while not done.is_set():
                for message in consumer.consume(num_messages=1000, timeout=0.1):
                    if message.error() is None:
                        event_id = dict(message.headers() or []).get("event_id")
                        if isinstance(event_id, bytes):
                            delivered.setdefault(event_id.decode(), time.perf_counter())
            consumer.close()

        def poll_table() -> None:
            nonlocal table
            seen = None
            while not done.is_set():
                time.sleep(poll_s)
                table = table.refresh()
                snapshot = table.current_snapshot()
                if snapshot is None or snapshot.snapshot_id == seen:
                    continue
                paths = files_added_since(table, seen) if seen is not None else current_files(table).paths
                seen = snapshot.snapshot_id
                if not paths:
                    continue
                now = time.perf_counter()
                for (key,) in connect().sql(f"SELECT event_id FROM {parquet_source(paths)}").fetchall():
                    visible.setdefault(key, now)

        threads = [threading.Thread(target=consume_plain), threading.Thread(target=poll_table)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(8)  # the ingest process starts and joins its group before traffic begins
            producer = EventProducer(
                resolve_bootstrap(settings), settings.topic, "fresh-host", extra_config={"linger.ms": "5"}
            )
            start = time.perf_counter()
            for i, (session_id, event_id, value) in enumerate(records):
                due = start + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent[event_id] = time.perf_counter()
                producer.send(session_id, event_id, value)
            producer.flush(60)
            deadline = time.monotonic() + 60
            while len(visible) < len(records) and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            done.set()
            for thread in threads:
                thread.join(30)
            ingest.send_signal(signal.SIGTERM)
            ingest.wait(60)
    lag = np.array([visible[k] - sent[k] for k in sent if k in visible])
    kafka = np.array([delivered[k] - sent[k] for k in sent if k in delivered])
    if len(lag) < len(sent):
        raise RuntimeError(f"only {len(lag)} of {len(sent)} events became visible within 60 s after the last send")
    p95, kafka_p95 = float(np.percentile(lag, 95)), float(np.percentile(kafka, 95))
    figures = [
        Figure(
            "freshness p95: send → visible in raw_events vs send → Kafka consumer",
            p95,
            kafka_p95,
            "s",
            higher_is_better=False,
        )
    ]
    result = {
        "events": len(sent),
        "rate_per_s": rate,
        "visible_p50_s": float(np.percentile(lag, 50)),
        "visible_p95_s": p95,
        "visible_max_s": float(lag.max()),
        "kafka_p50_s": float(np.percentile(kafka, 50)),
        "kafka_p95_s": kafka_p95,
        "figures": [f.as_dict() for f in figures],
    }
    _print("freshness", figures, result)
    return result


BENCHMARKS["freshness"] = bench_freshness
