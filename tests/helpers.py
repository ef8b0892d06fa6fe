"""Helpers shared by tests: emitting sessions and writing raw events without Kafka."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from pipelines.ingest import event_row
from pipelines.settings import Settings
from producers.sdk import EventProducer
from producers.synthetic import synthetic_sessions
from schemas.registry import decode_event, encode_event
from warehouse.catalog import open_catalog
from warehouse.tables import RAW_EVENTS, ensure_table

BASE_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


def sample_events(sessions: int, seed: int = 7) -> list[dict[str, Any]]:
    """Synthetic events of ``sessions`` sessions, flattened in emission order."""
    return [event for session in synthetic_sessions(sessions, seed=seed, start_us=BASE_US) for event in session]


def produce(settings: Settings, events: list[dict[str, Any]], extra_values: list[bytes] = ()) -> None:
    """Send events (and raw ``extra_values``) to the settings' topic and wait for acks."""
    producer = EventProducer(settings.kafka_bootstrap, settings.topic, "test-host")
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
