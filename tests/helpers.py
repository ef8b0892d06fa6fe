"""Helpers shared by tests: emitting sessions and writing raw events without Kafka."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
from confluent_kafka import TopicPartition
from pyiceberg.table.snapshots import Snapshot, Summary

from common.broker import resolve_bootstrap
from common.settings import Settings
from pipelines.ingest import IngestWorker, event_row
from producers.sdk import EventProducer
from producers.session_generator import synthetic_sessions
from schemas.registry import decode_event, encode_event
from warehouse.catalog import open_catalog
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.sql import open_views
from warehouse.tables import RAW_EVENTS, ensure_table

if TYPE_CHECKING:
    from dagster import AssetCheckResult, AssetChecksDefinition, ExecuteInProcessResult, MetadataValue

BASE_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


def real_runs_dir() -> Path:
    """The shared corpus of recorded real agent runs: ``shared/data/real-trajectories`` beside the checkout,
    looked up from here upwards (a worktree sits deeper than the main checkout); a missing path when absent."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "data" / "real-trajectories"
        if (candidate / "manifest.json").is_file():
            return candidate
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "real-trajectories"


def sample_events(sessions: int, seed: int = 7) -> list[dict[str, Any]]:
    """Synthetic events of ``sessions`` sessions, flattened in emission order."""
    return [event for session in synthetic_sessions(sessions, seed=seed, start_us=BASE_US) for event in session]


def produce(settings: Settings, events: list[dict[str, Any]], extra_values: Sequence[bytes] = ()) -> None:
    """Send events (and raw ``extra_values``) to the settings' topic and wait for acks."""
    producer = EventProducer(resolve_bootstrap(settings), settings.topic, "test-host")
    for event in events:
        producer.emit(event)
    for i, value in enumerate(extra_values):
        producer.send(f"poison-{i}", f"poison-{i}", value)
    producer.flush(60)


def write_raw(settings: Settings, events: list[dict[str, Any]], batch_size: int = 500) -> None:
    """Append events straight to raw_events (through encode/decode), in the given order and batches."""
    catalog = open_catalog(settings)
    table = ensure_table(catalog, settings, RAW_EVENTS.name)
    schema = RAW_EVENTS.arrow_schema()
    now = datetime.now(UTC)
    for start in range(0, len(events), batch_size):
        rows = [
            event_row(decode_event(encode_event(e)), "direct", 0, start + i, now)
            for i, e in enumerate(events[start : start + batch_size])
        ]
        table.append(pa.Table.from_pylist(rows, schema=schema))


def raw_rows(n: int, start: int = 0) -> pa.Table:
    """``n`` raw-events rows (ids, sessions s0-s2, seq and offsets from ``start``; other columns null)."""
    schema = RAW_EVENTS.arrow_schema()
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns["event_id"] = pa.array([f"e{i}" for i in range(start, start + n)])
    columns["session_id"] = pa.array([f"s{i % 3}" for i in range(start, start + n)])
    columns["seq"] = pa.array(range(start, start + n), schema.field("seq").type)
    columns["kafka_offset"] = pa.array(range(start, start + n), schema.field("kafka_offset").type)
    return pa.table({f.name: columns[f.name].cast(f.type) for f in schema}, schema=schema)


DAY_US = 86_400_000_000


BASE = datetime.fromtimestamp(BASE_US / 1e6, UTC)


def day_events(days: int, per_day: int) -> list[dict]:
    """``per_day`` synthetic sessions starting on each of ``days`` consecutive days from BASE."""
    return [
        event
        for day in range(days)
        for session in synthetic_sessions(per_day, seed=day, start_us=BASE_US + day * DAY_US + 3_600_000_000)
        for event in session
    ]


def lake_state(settings: Settings) -> dict[str, list]:
    """Every row identity in the union views, sorted (a doubled or lost row changes it)."""
    con = open_views(settings)
    return {
        "events": con.sql("SELECT kafka_offset FROM events ORDER BY 1").fetchall(),
        "trajectories": con.sql("SELECT session_id, n_events, status FROM trajectories ORDER BY 1").fetchall(),
        "steps": con.sql("SELECT session_id, step_index, seq FROM steps ORDER BY 1, 2").fetchall(),
    }


def one_row(con: duckdb.DuckDBPyConnection, sql: str, parameters: object = None) -> tuple[Any, ...]:
    """The first row ``sql`` returns (the test fails when it returns none)."""
    row = con.execute(sql, parameters).fetchone()
    assert row is not None, sql
    return row


def summary_of(snapshot: Snapshot | None) -> Summary:
    """A snapshot's summary (the test fails when there is no snapshot or no summary)."""
    assert snapshot is not None and snapshot.summary is not None
    return snapshot.summary


def plain(metadata: Mapping[str, MetadataValue]) -> dict[str, Any]:
    """Dagster metadata as plain values (each entry's ``.value``), to compare with numbers and dicts."""
    return {key: entry.value for key, entry in metadata.items()}


def materialized(result: ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    """The plain metadata of every asset a run materialized, by asset key."""
    events = (event.materialization for event in result.get_asset_materialization_events())
    return {materialization.asset_key.to_user_string(): plain(materialization.metadata) for materialization in events}


def run_check(check: AssetChecksDefinition, **resources: object) -> AssetCheckResult:
    """Evaluate an asset check directly (the test fails unless it returns one result)."""
    from dagster import AssetCheckResult

    result = check(**resources)
    assert isinstance(result, AssetCheckResult)
    return result


def tier_split(settings: Settings) -> dict[str, int]:
    """Rows per tier view."""
    con = open_views(settings)
    return {
        f"{tier}_{view}": one_row(con, f"SELECT count(*) FROM {tier}_{view}")[0]
        for tier in ("hot", "cold")
        for view in ("events", "trajectories", "steps")
    }


AS_OF = datetime.fromtimestamp(BASE_US / 1e6 + 30 * 86400, UTC)  # long after the traffic: idle sessions closed


def snapshot(settings: Settings) -> tuple[list, list]:
    _, trajectories = run_query(
        settings,
        "SELECT * EXCLUDE (assembled_at, tool_counts), map_entries(tool_counts) FROM trajectories ORDER BY session_id",
    )
    _, steps = run_query(settings, "SELECT * FROM steps ORDER BY session_id, step_index")
    return trajectories, steps


def hold_everything(worker: IngestWorker, expected: int, timeout: float = 60) -> None:
    """Let ``worker`` read the whole topic into its batch without committing (a stalled zombie)."""
    partitions = [TopicPartition(worker.topic, p) for p in range(worker.settings.topic_partitions)]
    if not worker.assigned:
        worker._on_assign(worker.consumer, partitions)
    deadline = time.monotonic() + timeout
    while len(worker._batch) < expected:
        assert time.monotonic() < deadline, f"zombie read {len(worker._batch)} of {expected} records"
        for message in worker.consumer.consume(num_messages=1000, timeout=0.5):
            if message.error() is None:
                worker._add(message)


def _open_at(settings: Settings, barrier: Any, errors: Any) -> None:
    barrier.wait(timeout=60)
    try:
        Lakehouse.open(settings)
    except BaseException as exc:  # reported to the parent
        errors.put(f"{type(exc).__name__}: {exc}")
        raise


def open_lakehouse_at_once(settings: Settings, openers: int) -> list[str]:
    """Open the lakehouse of ``settings`` from ``openers`` forked processes released at one moment.

    Returns what each failed opening raised (empty when all opened it).
    """
    context = multiprocessing.get_context("fork")
    barrier, errors = context.Barrier(openers), context.Queue()
    processes = [context.Process(target=_open_at, args=(settings, barrier, errors)) for _ in range(openers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    failures += [f"opener exited {p.exitcode}" for p in processes if p.exitcode != 0 and not failures]
    return failures
