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

from pipelines.broker import ensure_topic, start_broker, stop_broker, wait_for_kafka
from pipelines.decode import BatchDecoder, with_coordinates
from pipelines.ingest import IngestWorker, consumer_config, event_row
from pipelines.settings import Settings, load_settings
from producers.sdk import EventProducer
from producers.synthetic import synthetic_sessions
from schemas.errors import DecodeError
from schemas.registry import decode_event, encode_event
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
        return {"name": self.name, "value": self.value, "baseline": self.baseline, "unit": self.unit,
                "ratio": self.ratio}  # fmt: skip


def encoded_events(n_events: int, seed: int = 11) -> list[tuple[str, str, bytes]]:
    """``(session_id, event_id, value)`` of at least ``n_events`` synthetic events, pre-encoded.

    Encoding happens before any timing: benchmarks measure what happens after a
    sandbox host has produced bytes.
    """
    out: list[tuple[str, str, bytes]] = []
    sessions = max(1, n_events // 30)
    while len(out) < n_events:
        for session in synthetic_sessions(sessions, seed=seed, start_us=BASE_US):
            for event in session:
                out.append((event["session_id"], event["event_id"], encode_event(event)))
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
            wait_for_kafka(settings.kafka_bootstrap)
            ensure_topic(settings.kafka_bootstrap, settings.topic, settings.topic_partitions)
        yield settings


def produce_encoded(settings: Settings, records: list[tuple[str, str, bytes]]) -> float:
    """Send pre-encoded records and wait for acks; returns seconds taken."""
    producer = EventProducer(settings.kafka_bootstrap, settings.topic, "bench-host")
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
    config = consumer_config(settings.model_copy(update={"consumer_group": group}), settings.kafka_bootstrap)
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


class _TimedWorker(IngestWorker):
    """IngestWorker that stamps its first received record and its last commit."""

    first: float | None = None
    last: float = 0.0

    def _add(self, message: Any) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        super()._add(message)

    def flush(self) -> None:
        had = bool(self._batch.records)
        super().flush()
        if had:
            self.last = time.perf_counter()


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

        worker = _TimedWorker(settings)
        stats = worker.run(until_idle=2.0)
        if stats.events != events:
            raise RuntimeError(f"ingest landed {stats.events} of {events} events ({stats.as_dict()})")
        ingest_seconds = worker.last - (worker.first or worker.last)
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
    result = {"events": events, "events_per_s": rate, "baseline_events_per_s": baseline,
              "figures": [f.as_dict() for f in figures]}  # fmt: skip
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

    Baseline: the same query over the same Parquet files with pruning defeated
    (every file read into Arrow, then filtered), i.e. what a full scan costs.
    """
    import duckdb
    import pyarrow.parquet as pq

    from warehouse.snapshots import current_files
    from warehouse.sql import open_views

    with bench_home(home, kafka=False) as settings:
        load_raw_events(settings, events)
        con = open_views(settings)
        session_id = con.execute("SELECT session_id FROM events USING SAMPLE 1 ROWS").fetchone()[0]
        aggregate = "SELECT event_type, count(*), count(DISTINCT session_id) FROM events GROUP BY event_type"
        lookup = f"SELECT * FROM events WHERE session_id = '{session_id}' ORDER BY seq"
        files = [
            path.removeprefix("file://")
            for path in current_files(ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)).paths
        ]

        def full_scan(query: str) -> None:
            scan = duckdb.connect()
            scan.register("events", pq.read_table(files))
            scan.execute(query).fetchall()

        agg_s = _timed(lambda: con.execute(aggregate).fetchall())
        lookup_s = _timed(lambda: con.execute(lookup).fetchall())
        agg_base = _timed(lambda: full_scan(aggregate), repeat=1)
        lookup_base = _timed(lambda: full_scan(lookup), repeat=1)
    figures = [
        Figure("aggregate (count by event_type) vs full scan", agg_s, agg_base, "s", higher_is_better=False),
        Figure("one session's events vs full scan", lookup_s, lookup_base, "s", higher_is_better=False),
    ]
    result = {"events": events, "aggregate_s": agg_s, "session_lookup_s": lookup_s, "files": len(files),
              "figures": [f.as_dict() for f in figures]}  # fmt: skip
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


def _ingest_peak_rss(settings: Settings, topic: str, group: str) -> tuple[int, float]:
    """Run ``trajlake ingest --until-idle`` as a child on ``topic``; returns its peak tree RSS and seconds."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRAJLAKE_HOME": str(settings.home_dir), "TRAJLAKE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "TRAJLAKE_TOPIC": topic, "TRAJLAKE_CONSUMER_GROUP": group}  # fmt: skip
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "ingest", "--until-idle", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    peak = 0
    while child.poll() is None:
        peak = max(peak, _tree_rss_bytes(child.pid))
        time.sleep(0.1)
    if child.returncode != 0:
        raise RuntimeError(f"ingest on {topic} exited {child.returncode}: {child.stderr.read().decode()[-2000:]}")
    return peak, time.perf_counter() - started


def bench_memory(events: int = 1_000_000, home: Path | None = None) -> dict[str, Any]:
    """Ingest peak RSS (process tree) with a backlog of ``events`` vs a backlog ten times smaller.

    A ratio near 1 means memory does not grow with the backlog (batches are bounded).
    """
    small = max(events // 10, 1)
    with bench_home(home) as settings:
        topics = {}
        for size in (small, events):
            topic = f"{settings.topic}-{size}"
            ensure_topic(settings.kafka_bootstrap, topic, settings.topic_partitions)
            produce_encoded(settings.model_copy(update={"topic": topic}), encoded_events(size))
            topics[size] = topic
        small_rss, _ = _ingest_peak_rss(settings, topics[small], f"mem-{small}")
        big_rss, big_s = _ingest_peak_rss(settings, topics[events], f"mem-{events}")
    figures = [Figure(f"ingest peak RSS, backlog {events:,} vs {small:,}", big_rss / 2**20, small_rss / 2**20, "MiB",
                      higher_is_better=False)]  # fmt: skip
    result = {"events": events, "peak_rss_mib": big_rss / 2**20, "baseline_peak_rss_mib": small_rss / 2**20,
              "ingest_s": big_s, "figures": [f.as_dict() for f in figures]}  # fmt: skip
    _print("memory", figures, result)
    return result


BENCHMARKS["memory"] = bench_memory


def _ingest_children(settings: Settings, topic: str, group: str, namespace: str, workers: int) -> float:
    """Run ``workers`` ``trajlake ingest --until-idle`` processes in one group; returns wall seconds."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRAJLAKE_HOME": str(settings.home_dir), "TRAJLAKE_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "TRAJLAKE_TOPIC": topic, "TRAJLAKE_CONSUMER_GROUP": group, "TRAJLAKE_NAMESPACE": namespace}  # fmt: skip
    started = time.perf_counter()
    children = [
        subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ingest", "--until-idle", "3"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        for _ in range(workers)
    ]
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
    figures = [Figure("2 ingest processes vs 1 (same backlog, wall incl. join)", events / two_s, events / one_s,
                      "events/s")]  # fmt: skip
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
