"""What a decoded batch is: the decoded events, the dead records, and how they become raw-events rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.table.metadata import TableMetadata

from schemas.errors import DecodeError

#: Index of each record within the batch, carried through decoding to re-attach Kafka coordinates.
ROW_INDEX = "__row_index"


@dataclass
class DecodeResult:
    """Decoded events of a batch, and the records that could not be decoded.

    Attributes:
        events: one row per good record, the raw-events columns that come from the record
            (envelope, per-kind payload structs, ``schema_version``) plus ``ROW_INDEX``.
        dead: ``(index, error)`` of each record that goes to dead letters.
        fallback_records: records decoded one by one (poison isolation, timeouts).
        files: set when the decoder process wrote the events as Iceberg data files (see
            :class:`FileTarget`): those files, and ``events`` then holds only ``KEY_COLUMNS``
            of their rows.
    """

    events: pa.Table
    dead: list[tuple[int, DecodeError]] = field(default_factory=list)
    fallback_records: int = 0
    files: list[DataFile] | None = None


#: What the caller keeps of events written by the decoder process: enough to decide which
#: rows are new (Kafka coordinates, the re-send windows) without the rows themselves.
KEY_COLUMNS = ("event_id", "session_id", "kafka_partition", "kafka_offset")


@dataclass(frozen=True)
class FileTarget:
    """Where the decoder process writes a batch's events: Parquet data files of an Iceberg table.

    The decoder process completes the rows with their Kafka coordinates and writes them
    (``warehouse.transactions.data_files``), so the caller never takes back the wide rows;
    committing the files, or not, stays with the caller.

    Attributes:
        metadata: the table's metadata (its snapshots may be left out: only the schema,
            partition spec, properties and location are used).
        io_properties: FileIO properties of the table.
        topic: Kafka topic of the batch.
        partitions: partition of every record of the batch.
        offsets: offset of every record of the batch.
        ingested_at: ingest time stamped on every row.
        timestamps: Kafka timestamp (ms; 0 when the record has none) of every record of the batch.
    """

    metadata: TableMetadata
    io_properties: dict[str, str]
    topic: str
    partitions: np.ndarray
    offsets: np.ndarray
    ingested_at: datetime
    timestamps: np.ndarray | None = None


INGEST_ONLY = ("kafka_topic", "kafka_partition", "kafka_offset", "ingested_at", "kafka_timestamp", "ts_raw_us")

#: The event times ``ts`` holds: 0001-01-01T00:00:00Z … 9999-12-31T23:59:59.999999Z in µs, what a
#: Python ``datetime`` holds, so pyiceberg can name the day partition and every reader can convert it.
#: An Avro ``timestamp-micros`` holds any int64; one outside this range is clamped to the nearer end
#: and the value as sent is kept in ``ts_raw_us`` (see :func:`clamp_event_times`).
TS_MIN_US = -62_135_596_800_000_000
TS_MAX_US = 253_402_300_799_999_999


class UnwritableEvent(DecodeError):
    """A decoded event that could not be written as a data file (the message names the exception)."""

    reason = "unwritable"


def clamp_event_times(ts: pa.Array | pa.ChunkedArray) -> tuple[pa.Array | pa.ChunkedArray, pa.Array]:
    """``ts`` with values outside [``TS_MIN_US``, ``TS_MAX_US``] clamped, and those values as sent.

    One vectorized min/max over the column when every value is in range (the usual case).

    Returns:
        The clamped column (same type) and an int64 column holding the original µs where a value
        was clamped, NULL elsewhere.
    """
    n = len(ts)
    micros = ts.cast(pa.int64())
    bounds = pc.min_max(micros).as_py() if n else {}
    low, high = bounds.get("min"), bounds.get("max")
    if low is None or high is None or (low >= TS_MIN_US and high <= TS_MAX_US):
        return ts, pa.nulls(n, pa.int64())
    outside = pc.or_(pc.less(micros, TS_MIN_US), pc.greater(micros, TS_MAX_US))
    raw = pc.if_else(outside, micros, pa.scalar(None, pa.int64()))
    low_clamped = pc.max_element_wise(micros, TS_MIN_US, skip_nulls=False)
    clamped = pc.min_element_wise(low_clamped, TS_MAX_US, skip_nulls=False)
    raw_array = raw.combine_chunks() if isinstance(raw, pa.ChunkedArray) else raw
    return clamped.cast(ts.type), raw_array


def with_coordinates(
    events: pa.Table,
    target: pa.Schema,
    topic: str,
    partitions: pa.Array,
    offsets: pa.Array,
    ingested_at: datetime,
    timestamps: pa.Array | None = None,
) -> pa.Table:
    """Complete decoded events with Kafka coordinates into a ``target``-shaped table.

    Args:
        events: ``DecodeResult.events``.
        target: the raw-events Arrow schema.
        topic: Kafka topic of the batch.
        partitions: partition of every record of the batch (indexed by ``ROW_INDEX``).
        offsets: offset of every record of the batch (indexed by ``ROW_INDEX``).
        ingested_at: ingest time stamped on every row.
        timestamps: Kafka timestamp in ms of every record (indexed by ``ROW_INDEX``; 0 or less: none);
            ``None``: unknown for the whole batch.
    """
    index = events.column(ROW_INDEX)
    n = events.num_rows
    kafka_type = target.field("kafka_timestamp").type
    if timestamps is None:
        kafka_ts = pa.nulls(n, kafka_type)
    else:
        ms = pc.take(timestamps, index).cast(pa.int64())
        # a producer sets the Kafka timestamp: one past year 9999 is not a time ingest can keep
        known = pc.and_(pc.greater(ms, 0), pc.less_equal(ms, TS_MAX_US // 1000))
        kafka_ts = pc.if_else(known, pc.multiply(ms, 1000), None).cast(pa.timestamp("us")).cast(kafka_type)
    ts, ts_raw = clamp_event_times(events.column("ts"))
    extra = {
        "ts": ts,
        "ts_raw_us": ts_raw,
        "kafka_topic": pa.repeat(pa.scalar(topic, target.field("kafka_topic").type), n),
        "kafka_partition": pc.take(partitions, index).cast(target.field("kafka_partition").type),
        "kafka_offset": pc.take(offsets, index).cast(target.field("kafka_offset").type),
        "ingested_at": pa.repeat(pa.scalar(ingested_at, target.field("ingested_at").type), n),
        "kafka_timestamp": kafka_ts,
    }
    arrays = [extra[f.name] if f.name in extra else events.column(f.name) for f in target]
    return pa.Table.from_arrays(arrays, schema=target)
