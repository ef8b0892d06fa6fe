"""The Iceberg (and Arrow) schema of raw events, derived from the Avro event schema.

Envelope fields become top-level columns; each payload kind becomes one optional
struct column named by its ``event_type`` (``agent_action``, ``env_feedback``, …),
so every payload field is a typed column rather than a JSON blob. Ingest adds the
Kafka coordinates and the writer schema version.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from schemas.registry import SchemaVersion, latest, snake_case

_PRIMITIVES: dict[str, type[IcebergType]] = {
    "string": StringType,
    "long": LongType,
    "int": IntegerType,
    "double": DoubleType,
    "float": FloatType,
    "boolean": BooleanType,
    "bytes": BinaryType,
}

#: Columns ingest adds to every raw event, after the Avro-derived ones.
INGEST_COLUMNS: list[tuple[str, IcebergType]] = [
    ("schema_version", IntegerType()),
    ("kafka_topic", StringType()),
    ("kafka_partition", IntegerType()),
    ("kafka_offset", LongType()),
    ("ingested_at", TimestamptzType()),
    # when Kafka took the record (the producer's send time, or the broker's append time): ingest lag is
    # measured from here, since event time may be back-dated (replayed or imported runs)
    ("kafka_timestamp", TimestamptzType()),
    # the event time as sent (µs since the epoch) when it lay outside what ``ts`` holds
    # (0001-01-01 … 9999-12-31 UTC) and ``ts`` was clamped to the nearer end; NULL otherwise
    ("ts_raw_us", LongType()),
]


class _Ids:
    def __init__(self) -> None:
        self.last = 0

    def next(self) -> int:
        self.last += 1
        return self.last


def _avro_type(avro: Any, ids: _Ids, named: dict[str, Any]) -> IcebergType:
    if isinstance(avro, list):  # optional: ["null", T]
        branches = [b for b in avro if b != "null"]
        if len(branches) != 1:
            raise ValueError(f"only [null, T] unions map to a column, got {avro}")
        return _avro_type(branches[0], ids, named)
    if isinstance(avro, str):
        if avro in _PRIMITIVES:
            return _PRIMITIVES[avro]()
        return _avro_type(named[avro], ids, named)
    kind = avro["type"]
    if avro.get("logicalType") == "timestamp-micros":
        return TimestamptzType()
    if kind == "enum":
        return StringType()
    if kind == "array":
        element_id = ids.next()
        return ListType(element_id, _avro_type(avro["items"], ids, named), element_required=False)
    if kind == "map":
        key_id, value_id = ids.next(), ids.next()
        return MapType(key_id, StringType(), value_id, _avro_type(avro["values"], ids, named), False)
    if kind == "record":
        named[avro["name"]] = avro
        fields = [(f, ids.next()) for f in avro["fields"]]
        return StructType(
            *[NestedField(fid, f["name"], _avro_type(f["type"], ids, named), required=False) for f, fid in fields]
        )
    if isinstance(kind, str | list | dict):
        return _avro_type(kind, ids, named)
    raise ValueError(f"unsupported Avro type {avro!r}")


def raw_events_schema(version: SchemaVersion | None = None) -> Schema:
    """Iceberg schema of the raw events table for a schema version (latest by default)."""
    version = version or latest()
    ids = _Ids()
    named: dict[str, Any] = {}
    top: list[tuple[str, Any, int]] = []
    for field in version.raw["fields"]:
        if field["name"] == "payload":
            for branch in field["type"]:
                top.append((snake_case(branch["name"]), branch, ids.next()))
        else:
            top.append((field["name"], field["type"], ids.next()))
    columns = [NestedField(fid, name, _avro_type(avro, ids, named), required=False) for name, avro, fid in top]
    columns += [NestedField(ids.next(), name, typ, required=False) for name, typ in INGEST_COLUMNS]
    return Schema(*columns)
