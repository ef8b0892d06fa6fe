"""Batch decoding of Kafka record values into raw-events Arrow columns.

Per-record decoding (``schemas.registry.decode_event`` → dict → ``pa.Table.from_pylist``)
costs tens of microseconds per event in Python. Here a whole message batch is decoded
at once: records are grouped by writer-schema fingerprint, each group's Avro bodies
are concatenated into one block of an in-memory Avro object container (header = the
writer schema), and a Rust Avro reader (``polars-avro``) turns that block into Arrow
arrays. The payload union arrives as a dense union and becomes the per-kind struct
columns of ``raw_events``; older writer versions are resolved to the latest reader
schema column by column (missing fields take the reader's default, types are cast).

Isolated (the default), the whole batch is decoded in a child process (see below): the
calling process only ships the values' bytes and takes back sorted Arrow columns, so a
consumer's Python thread and the decoding work on different cores. Given a ``FileTarget``,
the child also writes the rows as Iceberg data files and sends back only the files and the
rows' keys, so the wide rows never cross the pipe and Parquet encoding leaves the
consumer's process too.

Results are the same as ``decode_event`` record by record, dead-letter reasons
included, because anything the batch path cannot vouch for goes through
``decode_event``:

* header checks (size limit, magic, fingerprint) run per record before batching;
* a block that fails to decode is bisected until the failing records are alone, and
  those are decoded one by one (giving ``decode_event``'s exact error);
* the Rust reader runs in a child process with a deadline, because a block whose
  records consume fewer bytes than the block holds (a record with trailing bytes)
  makes it spin instead of failing; on a timeout the child is killed (SIGKILL) and
  the records are decoded record by record;
* envelope validations (kind matches ``event_type``, non-empty ids, ``seq`` ≥ 0)
  run vectorized on the decoded columns with ``decode_event``'s messages.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import multiprocessing
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table.metadata import TableMetadata

from pipelines.memory import release_free_memory, reusing_allocator
from schemas.errors import DecodeError, InvalidEvent, OversizedEvent
from schemas.registry import (
    HEADER_LEN,
    MAGIC,
    SchemaVersion,
    decode_event,
    latest,
    snake_case,
    versions,
    writer_version,
)

log = logging.getLogger("trajlake.decode")

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
# The decoder keeps freed pages for the next batch (its working set is one batch), and gives
# them back once it holds more than this, so a heap fragmented by odd batches cannot grow on.
DECODER_RETAINED_BYTES = 512 << 20


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
    """

    metadata: TableMetadata
    io_properties: dict[str, str]
    topic: str
    partitions: np.ndarray
    offsets: np.ndarray
    ingested_at: datetime


# -- Avro container framing ----------------------------------------------------------


def _zigzag_varint(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded & ~0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def _avro_bytes(data: bytes) -> bytes:
    return _zigzag_varint(len(data)) + data


def object_container(schema_json: str, block: bytes | pa.Buffer, count: int) -> bytes:
    """An Avro object container file (null codec) holding one data block.

    Args:
        schema_json: the writer schema, as JSON text.
        block: ``count`` concatenated Avro binary records of ``schema_json``.
        count: records in ``block``.
    """
    sync = os.urandom(16)
    header = b"Obj\x01" + _zigzag_varint(2)
    header += _avro_bytes(b"avro.schema") + _avro_bytes(schema_json.encode())
    header += _avro_bytes(b"avro.codec") + _avro_bytes(b"null") + _zigzag_varint(0) + sync
    return b"".join((header, _zigzag_varint(count), _zigzag_varint(len(block)), block, sync))  # one copy of block


def binary_array(values: Sequence[bytes]) -> pa.BinaryArray:
    """An Arrow binary array over ``values`` built from one join (cheaper than ``pa.array`` per value)."""
    ends = np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)))
    return binary_array_over(b"".join(values), ends)


def binary_array_over(data: bytes | bytearray, ends: np.ndarray) -> pa.BinaryArray:
    """An Arrow binary array whose ``i``-th value is ``data[ends[i-1]:ends[i]]`` (no copy of ``data``)."""
    offsets = np.zeros(len(ends) + 1, dtype=np.int64)
    offsets[1:] = ends
    buffer = pa.py_buffer(data)
    if offsets[-1] >= 2**31:
        return pa.Array.from_buffers(pa.large_binary(), len(ends), [None, pa.py_buffer(offsets), buffer])
    return pa.Array.from_buffers(pa.binary(), len(ends), [None, pa.py_buffer(offsets.astype(np.int32)), buffer])


def concatenated(array: pa.Array, indices: Sequence[int] | np.ndarray) -> bytes:
    """The values of ``array`` at ``indices``, concatenated (one copy)."""
    return concatenated_buffer(array, indices).to_pybytes()


def concatenated_buffer(array: pa.Array, indices: Sequence[int] | np.ndarray) -> pa.Buffer:
    """:func:`concatenated` as an Arrow buffer: no copy when ``indices`` are all of ``array`` in order."""
    if len(indices) != len(array):
        array = array.take(pa.array(indices, pa.int64()))
    offset_type = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(array.buffers()[1], dtype=offset_type)[array.offset : array.offset + len(array) + 1]
    return array.buffers()[2][int(offsets[0]) : int(offsets[-1])]


def _read_container(container: bytes, expected_rows: int) -> pa.Table:
    """Decode an object container with the Rust reader."""
    from polars_avro._avro_rs import AvroSource  # imported lazily: only the decoding process needs it
    from polars_avro._source import seekable_factory

    source = AvroSource([seekable_factory(io.BytesIO(container))], False, False)
    batches = [pa.record_batch(batch) for batch in source.batch_iter(max(expected_rows, 1), None)]
    rows = sum(batch.num_rows for batch in batches)
    if rows != expected_rows:
        raise ValueError(f"block of {expected_rows} records decoded to {rows} rows")
    return pa.Table.from_batches(batches)


def _warm_up() -> None:
    import polars_avro._avro_rs  # noqa: F401

    import warehouse.transactions  # noqa: F401 - the data-file writer, before requests' deadlines start


def _read_container_safely(container: bytes, expected_rows: int) -> tuple[bool, pa.Table | str]:
    """(True, decoded table) or (False, error text); never raises."""
    try:
        return True, _read_container(container, expected_rows)
    except BaseException as exc:  # noqa: BLE001 - Rust panics surface as BaseException subclasses
        return False, f"{type(exc).__name__}: {exc}"


def ipc_bytes(table: pa.Table) -> pa.Buffer:
    """``table`` as one Arrow IPC stream buffer (what the decoder process sends back)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def read_ipc(data: bytes | pa.Buffer) -> pa.Table:
    """The table in an Arrow IPC stream buffer (zero-copy: it refers to ``data``)."""
    with pa.ipc.open_stream(data) as reader:
        return reader.read_all()


# -- writer → reader resolution on Arrow arrays --------------------------------------------


def _named_types(node: Any, named: dict[str, Any], namespace: str = "") -> None:
    if isinstance(node, list):
        for branch in node:
            _named_types(branch, named, namespace)
    elif isinstance(node, dict):
        if node.get("type") in ("record", "enum", "fixed"):
            space = node.get("namespace", namespace)
            full = node["name"] if "." in node["name"] else f"{space}.{node['name']}".strip(".")
            named[full] = node
            named[node["name"]] = node
            namespace = space
        for child in node.get("fields", []):
            _named_types(child["type"], named, namespace)
        for key in ("items", "values"):
            if key in node:
                _named_types(node[key], named, namespace)


def _resolve(node: Any, named: dict[str, Any]) -> Any:
    """Strip ``["null", T]`` and named references down to the type definition."""
    while True:
        if isinstance(node, list):
            branches = [b for b in node if b != "null"]
            node = branches[0] if len(branches) == 1 else node
            if len(branches) != 1:
                return node
        elif isinstance(node, str) and node in named:
            node = named[node]
        elif isinstance(node, dict) and isinstance(node.get("type"), (dict, list)):
            node = node["type"]
        else:
            return node


def _fill(default: Any, length: int, target: pa.DataType) -> pa.Array:
    return pa.array([default] * length, type=target)


def conform(array: pa.Array, reader: Any, target: pa.DataType, named: dict[str, Any]) -> pa.Array:
    """Resolve a writer-decoded Arrow array to the reader's Arrow type.

    Record fields are matched by name; fields the writer lacks take the reader's
    default; everything else is cast (Avro promotions int→long, float→double, enum→string).

    Raises:
        ValueError: a reader field without a default is missing from the writer.
        pyarrow.ArrowInvalid: a value that does not cast.
    """
    reader = _resolve(reader, named)
    if pa.types.is_struct(target) and isinstance(reader, dict) and reader.get("type") == "record":
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        fields_by_name = {f["name"]: f for f in reader["fields"]}
        children: list[pa.Array] = []
        for index in range(target.num_fields):
            target_field = target.field(index)
            spec = fields_by_name[target_field.name]
            if array.type.get_field_index(target_field.name) >= 0:
                child = array.field(target_field.name)
                children.append(conform(child, spec["type"], target_field.type, named))
            elif "default" in spec:
                children.append(_fill(spec["default"], len(array), target_field.type))
            else:
                raise ValueError(f"reader field {target_field.name!r} has no default and the writer lacks it")
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    return array if array.type == target else pc.cast(array, target)


@dataclass(frozen=True)
class _Plan:
    """How to turn one writer version's decoded batch into raw-events columns."""

    writer: SchemaVersion
    schema_json: str
    reader_fields: dict[str, Any]  # envelope field name -> reader Avro field
    reader_kinds: dict[str, Any]  # event_type -> reader Avro record of the payload
    reader_names: dict[str, str]  # event_type -> full reader record name (decode_event's message)
    named: dict[str, Any]


def _plan(writer: SchemaVersion) -> _Plan:
    reader = latest()
    named: dict[str, Any] = {}
    _named_types(reader.raw, named)
    fields = {f["name"]: f for f in reader.raw["fields"] if f["name"] != "payload"}
    payload = next(f for f in reader.raw["fields"] if f["name"] == "payload")
    kinds = {snake_case(branch["name"]): branch for branch in payload["type"]}
    return _Plan(writer, json.dumps(framed_schema(writer.raw)), fields, kinds, dict(reader.payload_kinds), named)


#: Leading field that swallows each record's single-object header (magic + fingerprint).
HEADER_FIELD = "__single_object_header"


def framed_schema(writer: dict[str, Any]) -> dict[str, Any]:
    """The writer schema with a leading ``fixed`` field covering the single-object header.

    A single-object record is ``header + body``; reading it with this schema decodes
    the header as a field, so a batch's record values concatenated as they are form
    a valid Avro data block (no per-record copy to strip the header).
    """
    header = {"name": HEADER_FIELD, "type": {"type": "fixed", "name": "TrajlakeSingleObjectHeader",
                                             "size": HEADER_LEN}}  # fmt: skip
    return {**writer, "fields": [header, *writer["fields"]]}


class BatchDecoder:
    """Decodes batches of single-object Avro records into raw-events Arrow columns.

    Args:
        target: Arrow schema of ``raw_events`` (``RAW_EVENTS.arrow_schema()``).
        max_event_bytes: larger records are dead-lettered as oversized.
        isolate: run the Rust reader in a child process with a deadline (see module doc);
            ``False`` runs it in-process, for trusted input and tests.
        timeout_s: deadline per block, plus ``timeout_per_mb_s`` per MB of block.
    """

    def __init__(
        self,
        target: pa.Schema,
        max_event_bytes: int | None = None,
        isolate: bool = True,
        timeout_s: float = 10.0,
        timeout_per_mb_s: float = 2.0,
    ) -> None:
        self.target = target
        self.max_event_bytes = max_event_bytes
        self.isolate = isolate
        self.timeout_s = timeout_s
        self.timeout_per_mb_s = timeout_per_mb_s
        self._decoder: _DecoderProcess | None = None
        self._plans: dict[int, _Plan] = {}
        self.record_columns = [f.name for f in target if f.name not in _INGEST_ONLY]
        if isolate:
            self._start_decoder()

    def _start_decoder(self) -> None:
        self._decoder = _DecoderProcess()

    def close(self, grace_s: float = 1.0) -> None:
        """Stop the decoder process, if any (killed if still busy after ``grace_s``)."""
        if self._decoder is not None:
            self._decoder.close(grace_s)
            self._decoder = None

    def __del__(self) -> None:
        # A worker that is dropped without close() must not leave its decoder process behind.
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> BatchDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- block decoding -----------------------------------------------------------

    def _decode_block(self, plan: _Plan, block: bytes | pa.Buffer, count: int) -> pa.Table | None:
        """Arrow table of the block, or None when it failed (corrupt record) or timed out."""
        container = object_container(plan.schema_json, block, count)
        if not self.isolate:
            ok, decoded = _read_container_safely(container, count)
            return decoded if ok else None  # type: ignore[return-value]
        if self._decoder is None:
            self._start_decoder()
        assert self._decoder is not None
        deadline = self.timeout_s + self.timeout_per_mb_s * len(container) / 1e6
        try:
            reply, parts = self._decoder.call({"kind": "read", "count": count}, [container], deadline)
        except _BlockTimeout:
            log.warning("Avro block of %d records timed out after %.1f s; decoding record by record",
                        count, deadline)  # fmt: skip
            self.close(grace_s=0.0)
            raise
        return read_ipc(parts[0]) if reply["ok"] else None

    def _to_columns(
        self, plan: _Plan, decoded: pa.Table, order: pa.Array | None = None
    ) -> tuple[pa.Table, list[tuple[int, DecodeError]]]:
        """Raw-events columns of a decoded block, and envelope-validation failures (positions in the result).

        With ``order``, row ``i`` of the result is row ``order[i]`` of the block: the order is
        applied to the envelope columns and the payload's type codes and offsets, so each
        payload struct is gathered once, already in order (not gathered, then sorted).
        """
        n = decoded.num_rows
        columns: dict[str, pa.Array] = {}
        for name in self.record_columns:
            if name in plan.reader_fields:
                target = self.target.field(name).type
                if name in decoded.column_names:
                    column = decoded.column(name) if order is None else decoded.column(name).take(order)
                    columns[name] = conform(column, plan.reader_fields[name]["type"], target, plan.named)
                elif "default" in plan.reader_fields[name]:
                    columns[name] = _fill(plan.reader_fields[name]["default"], n, target)
                else:
                    raise ValueError(f"reader field {name!r} has no default and writer v{plan.writer.version} lacks it")
        payload = decoded.column("payload").combine_chunks()
        type_codes = payload.type_codes
        offsets = payload.offsets
        if order is not None:
            type_codes, offsets = type_codes.take(order), offsets.take(order)
        branch_kinds = [
            snake_case(payload.type.field(i).name.rsplit(".", 1)[-1]) for i in range(payload.type.num_fields)
        ]
        codes = list(payload.type.type_codes)
        for kind, reader_record in plan.reader_kinds.items():
            target = self.target.field(kind).type
            if kind not in branch_kinds:
                columns[kind] = pa.nulls(n, type=target)
                continue
            branch = branch_kinds.index(kind)
            take = pc.if_else(pc.equal(type_codes, codes[branch]), offsets, pa.scalar(None, pa.int32()))
            child = payload.field(branch).take(take)
            columns[kind] = conform(child, reader_record, target, plan.named)
        version = pa.scalar(plan.writer.version, self.target.field("schema_version").type)
        columns["schema_version"] = pa.repeat(version, n)
        table = pa.table(columns)
        return table, self._validate(plan, table, type_codes, codes, branch_kinds)

    def _validate(
        self, plan: _Plan, table: pa.Table, type_codes: pa.Array, codes: list[int], branch_kinds: list[str]
    ) -> list[tuple[int, DecodeError]]:
        kind_of_code = {code: kind for code, kind in zip(codes, branch_kinds, strict=True)}
        row_kind = pc.take(pa.array(branch_kinds), pc.index_in(type_codes, pa.array(codes, pa.int8())))
        event_type = table.column("event_type")
        bad_kind = pc.not_equal(row_kind, event_type)
        bad_ids = pc.or_(pc.equal(pc.utf8_length(table.column("event_id")), 0),
                         pc.equal(pc.utf8_length(table.column("session_id")), 0))  # fmt: skip
        bad_seq = pc.less(table.column("seq"), 0)
        any_bad = pc.or_(pc.or_(bad_kind, bad_ids), bad_seq)
        if not pc.any(any_bad).as_py():
            return []
        failures: list[tuple[int, DecodeError]] = []
        for position in pc.indices_nonzero(any_bad).to_pylist():
            kind = kind_of_code[type_codes[position].as_py()]
            if bad_kind[position].as_py():
                name = plan.reader_names.get(kind) or plan.writer.payload_kinds.get(kind, kind)
                error: DecodeError = InvalidEvent(
                    f"event_type {event_type[position].as_py()!r} does not match payload {name}"
                )
            elif bad_ids[position].as_py():
                error = InvalidEvent("empty event_id or session_id")
            else:
                error = InvalidEvent(f"negative seq {table.column('seq')[position].as_py()}")
            failures.append((position, error))
        return failures

    # -- per-record fallback -----------------------------------------------------------

    def _decode_one_by_one(self, values: Sequence[bytes], indices: list[int]) -> tuple[list[pa.Table], list]:
        rows: list[dict[str, Any]] = []
        kept: list[int] = []
        dead: list[tuple[int, DecodeError]] = []
        for index in indices:
            try:
                event = decode_event(values[index], max_bytes=self.max_event_bytes)
            except DecodeError as exc:
                dead.append((index, exc))
                continue
            row = {name: event[name] for name in self.record_columns if name in event}
            row[event["event_type"]] = event["payload"]
            rows.append(row)
            kept.append(index)
        if not rows:
            return [], dead
        schema = pa.schema([self.target.field(name) for name in self.record_columns])
        table = pa.Table.from_pylist(rows, schema=schema).append_column(ROW_INDEX, pa.array(kept, pa.int64()))
        return [table], dead

    def _decode_group(
        self,
        plan: _Plan,
        values: Sequence[bytes],
        array: pa.Array,
        indices: list[int],
        result: DecodeResult,
        tables: list[pa.Table],
        sort_by: Sequence[tuple[str, str]],
        sorted_tables: set[int],
    ) -> None:
        """Decode records of one writer version, bisecting around blocks that fail.

        Each block's rows come out ordered by ``sort_by`` (ties by batch index) when the block
        has those columns; the ids of tables so ordered are added to ``sorted_tables``.
        """
        try:
            decoded = self._decode_block(plan, concatenated_buffer(array, indices), len(indices))
        except _BlockTimeout:
            decoded_tables, dead = self._decode_one_by_one(values, indices)
            tables.extend(decoded_tables)
            result.dead.extend(dead)
            result.fallback_records += len(indices)
            return
        if decoded is None:
            if len(indices) <= 8:  # small enough: decode_event says exactly what is wrong
                decoded_tables, dead = self._decode_one_by_one(values, indices)
                tables.extend(decoded_tables)
                result.dead.extend(dead)
                result.fallback_records += len(indices)
                return
            middle = len(indices) // 2
            self._decode_group(plan, values, array, indices[:middle], result, tables, sort_by, sorted_tables)
            self._decode_group(plan, values, array, indices[middle:], result, tables, sort_by, sorted_tables)
            return
        row_index = pa.array(indices, pa.int64())
        order = None
        if sort_by and all(name in decoded.column_names for name, _ in sort_by):
            keys = pa.table({**{name: decoded.column(name) for name, _ in sort_by}, ROW_INDEX: row_index})
            order = pc.sort_indices(keys, sort_keys=[*sort_by, (ROW_INDEX, "ascending")])
            row_index = row_index.take(order)
        table, failures = self._to_columns(plan, decoded, order)
        table = table.append_column(ROW_INDEX, row_index)
        if failures:
            bad = {position for position, _ in failures}
            result.dead.extend((row_index[position].as_py(), error) for position, error in failures)
            keep = pa.array([i not in bad for i in range(table.num_rows)])
            table = table.filter(keep)
        if order is not None:
            sorted_tables.add(id(table))
        tables.append(table)

    # -- public --------------------------------------------------------------------------

    def decode(self, values: Sequence[bytes | None], sort_by: Sequence[tuple[str, str]] = ()) -> DecodeResult:
        """Decode a batch of record values (``None`` counts as empty bytes).

        Isolated, the whole batch is decoded in the decoder process (the caller's process
        only ships the bytes and takes the Arrow result). If that misses its deadline, the
        process is killed and the batch is decoded record by record with ``decode_event``;
        if decoding raised there, the batch is decoded again here, each block read by the
        decoder process under its own deadline (``_decode_array``).

        Args:
            values: record values, in batch order.
            sort_by: order of the returned events (column, "ascending"|"descending");
                ties and the default keep batch order.

        Returns:
            The good events (with ``ROW_INDEX`` pointing into ``values``) and the dead
            records with their ``decode_event`` errors (in batch order).
        """
        return self.decode_array(binary_array([value or b"" for value in values]), sort_by)

    def decode_array(
        self, array: pa.BinaryArray, sort_by: Sequence[tuple[str, str]] = (), write: FileTarget | None = None
    ) -> DecodeResult:
        """:meth:`decode` for values already in an Arrow binary array (nulls count as empty).

        With ``write``, the decoder process also writes the events as data files and returns
        their keys (``DecodeResult.files``); when the batch is decoded here instead (a
        timeout, an error in the decoder process, or not isolated), nothing is written and
        the events come back whole.
        """
        values = _LazyValues(array)
        if self.isolate and len(array):
            try:
                result = self._decode_in_child(array, sort_by, write)
            except _BlockTimeout:
                # Some block spins the reader (or kills it): every group's block would be
                # suspect, and each retry costs a deadline, so decode_event takes the batch.
                tables, dead = self._decode_one_by_one(values, list(range(len(values))))
                return self._finish(DecodeResult(events=pa.table({}), dead=dead, fallback_records=len(values)),
                                    tables, sort_by)  # fmt: skip
            if result is not None:
                return result
        return self._decode_array(array, values, sort_by)

    def _decode_in_child(
        self, array: pa.BinaryArray, sort_by: Sequence[tuple[str, str]], write: FileTarget | None = None
    ) -> DecodeResult | None:
        """The whole batch decoded by the decoder process; None when decoding raised there.

        Raises:
            _BlockTimeout: no answer within the deadline (the process is killed).
        """
        if self._decoder is None:
            self._start_decoder()
        assert self._decoder is not None
        offsets, data = array.buffers()[1], array.buffers()[2]
        deadline = self.timeout_s + self.timeout_per_mb_s * data.size / 1e6
        header = {"kind": "batch", "n": len(array), "large": pa.types.is_large_binary(array.type),
                  "offset": array.offset, "target": self.target, "max_event_bytes": self.max_event_bytes,
                  "sort_by": list(sort_by), "write": write}  # fmt: skip
        try:
            reply, parts = self._decoder.call(header, [offsets, data], deadline)
        except _BlockTimeout:
            log.warning("batch of %d records not decoded within %.1f s; decoding it record by record",
                        len(array), deadline)  # fmt: skip
            self.close(grace_s=0.0)
            raise
        if not reply["ok"]:
            log.warning("batch decoding failed in the decoder process (%s); decoding it block by block",
                        reply["error"])  # fmt: skip
            return None
        events = pa.concat_tables([read_ipc(part) for part in parts])
        return DecodeResult(events=events, dead=reply["dead"], fallback_records=reply["fallback"],
                            files=reply.get("files"))  # fmt: skip

    def _decode_array(
        self, array: pa.BinaryArray, values: Sequence[bytes], sort_by: Sequence[tuple[str, str]] = ()
    ) -> DecodeResult:
        """Decode here: group by writer version, read each group's block (bisecting failures)."""
        result = DecodeResult(events=pa.table({}))
        limit = self.max_event_bytes if self.max_event_bytes is not None else float("inf")
        known = {MAGIC + v.fingerprint: v.version for v in versions().values()}
        groups: dict[int, list[int]] = {}
        if len(array):
            # The common case vectorized: header known and size within the limit.
            headers = pc.binary_slice(array, 0, HEADER_LEN)
            header_set = list(known)
            which = pc.index_in(headers, value_set=pa.array(header_set, pa.binary())).fill_null(-1).to_numpy()
            which = np.where(pc.binary_length(array).to_numpy() > limit, -1, which)
            for slot in np.unique(which):
                indices = np.flatnonzero(which == slot)
                if slot >= 0:
                    groups.setdefault(known[header_set[slot]], []).extend(indices.tolist())
                    continue
                for index in indices.tolist():  # anything odd takes the checked path
                    value = values[index]
                    try:
                        if len(value) > limit:
                            raise OversizedEvent(
                                f"{len(value)} bytes exceeds the {self.max_event_bytes}-byte event limit"
                            )
                        version_number = writer_version(value).version
                    except DecodeError as exc:
                        result.dead.append((index, exc))
                        continue
                    groups.setdefault(version_number, []).append(index)
        tables: list[pa.Table] = []
        sorted_tables: set[int] = set()
        for version_number, indices in groups.items():
            plan = self._plans.get(version_number)
            if plan is None:
                plan = self._plans[version_number] = _plan(writer_version(values[indices[0]]))
            self._decode_group(plan, values, array, indices, result, tables, sort_by, sorted_tables)
        return self._finish(result, tables, sort_by, presorted=len(tables) == 1 and id(tables[0]) in sorted_tables)

    def _finish(
        self, result: DecodeResult, tables: list[pa.Table], sort_by: Sequence[tuple[str, str]], presorted: bool = False
    ) -> DecodeResult:
        """``result`` with its events: the decoded tables in one, ordered (``presorted``: one table, in order)."""
        schema = pa.schema(
            [self.target.field(name) for name in self.record_columns] + [pa.field(ROW_INDEX, pa.int64())]
        )
        if tables:
            events = pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])
            if presorted:
                result.events = events
            elif sort_by:
                result.events = events.sort_by([*sort_by, (ROW_INDEX, "ascending")])
            else:
                result.events = events.sort_by(ROW_INDEX) if len(tables) > 1 else events
        else:
            result.events = schema.empty_table()
        result.dead.sort(key=lambda item: item[0])
        return result


class _BlockTimeout(Exception):
    """The Rust reader missed its deadline on a block (or its process died)."""


class _LazyValues(Sequence[bytes]):
    """Record values read from a binary array on demand (the decoder process's ``values``)."""

    def __init__(self, array: pa.BinaryArray) -> None:
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, index: int) -> bytes:  # type: ignore[override]
        return self._array[index].as_py() or b""


#: Rows per reply part: the decoder process serializes its answer a slice at a time, so it
#: never holds a second copy of a whole decoded batch.
_REPLY_ROWS = 4096


def _slices(table: pa.Table) -> Iterator[pa.Buffer]:
    """IPC slices of ``table``: ``_reply_parts(table)`` of them, at least one (it carries the schema)."""
    for start in range(0, max(table.num_rows, 1), _REPLY_ROWS):
        yield ipc_bytes(table.slice(start, _REPLY_ROWS))


def _reply_parts(table: pa.Table) -> int:
    return max(-(-table.num_rows // _REPLY_ROWS), 1)


def _handle(
    header: dict[str, Any], parts: list[bytes], decoders: dict[Any, BatchDecoder]
) -> tuple[dict, int, Iterable[bytes | pa.Buffer]]:
    """One decoder-process request: a block read (``read``) or a whole batch (``batch``).

    Returns the reply header, the number of reply parts and the parts (Arrow IPC slices).
    """
    if header["kind"] == "read":
        ok, result = _read_container_safely(parts[0], header["count"])
        if ok:
            return {"ok": True}, 1, [ipc_bytes(result)]  # type: ignore[arg-type]
        return {"ok": False, "error": result}, 0, []
    try:
        key = (header["target"], header["max_event_bytes"])
        decoder = decoders.get(key)
        if decoder is None:
            decoder = decoders[key] = BatchDecoder(header["target"], header["max_event_bytes"], isolate=False)
        kind = pa.large_binary() if header["large"] else pa.binary()
        array = pa.Array.from_buffers(kind, header["n"], [None, pa.py_buffer(parts[0]), pa.py_buffer(parts[1])],
                                      offset=header["offset"])  # fmt: skip
        result = decoder._decode_array(array, _LazyValues(array), header["sort_by"])
        del array, parts[:]
        reply = {"ok": True, "dead": result.dead, "fallback": result.fallback_records}
        events = result.events
        if header.get("write") is not None:
            events, reply["files"] = _write_files(events, header["target"], header["write"])
        return reply, _reply_parts(events), _slices(events)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decodes the batch itself
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 0, []


@functools.cache
def _file_io(properties: tuple[tuple[str, str], ...], location: str) -> FileIO:
    from pyiceberg.io import load_file_io

    return load_file_io(dict(properties), location)


def _write_files(events: pa.Table, target: pa.Schema, write: FileTarget) -> tuple[pa.Table, list[DataFile]]:
    """Write decoded events as data files of ``write``'s table; returns their keys and the files."""
    from warehouse.transactions import data_files

    partitions, offsets = pa.array(write.partitions), pa.array(write.offsets)
    rows = with_coordinates(events, target, write.topic, partitions, offsets, write.ingested_at)
    del events
    files: list[DataFile] = []
    if rows.num_rows:
        io = _file_io(tuple(sorted(write.io_properties.items())), write.metadata.location)
        files = data_files(write.metadata, rows, io, uuid.uuid4())
    # Keys are in the rows' order, not the files': callers match rows by Kafka coordinates.
    return rows.select(list(KEY_COLUMNS)), files


def _serve(conn: Connection) -> None:
    """Decoder process: answer requests (a pickled header, then byte parts) until the pipe closes."""
    reusing_allocator()
    _warm_up()
    conn.send({"ready": True})
    decoders: dict[Any, BatchDecoder] = {}
    while True:
        try:
            header = conn.recv()
            parts = [conn.recv_bytes() for _ in range(header.pop("parts"))]
        except (EOFError, OSError):
            return  # the parent closed its end
        reply, count, out = _handle(header, parts, decoders)
        del parts
        conn.send({**reply, "parts": count})
        for part in out:
            conn.send_bytes(part)
        del reply, out  # the decoded batch is not kept while waiting for the next one
        release_free_memory(above=DECODER_RETAINED_BYTES)


class _DecoderProcess:
    """One child process running the Rust reader, with its own pipe, killable at any moment.

    Not a ``multiprocessing.Pool``: terminating a pool goes through its handler threads and
    queue locks and ends with SIGTERM; a reader spinning in native code under load has left
    that waiting forever. Here a request that misses its deadline gets SIGKILL and the pipe
    is dropped, so nothing of the stuck call survives. Spawned, not forked: the parent runs
    librdkafka threads. The child imports the reader as it starts (≈1-2 s), overlapping the
    consumer-group join; it says when it is ready, and request deadlines count from then.
    """

    #: Longest wait for a new child's imports (a loaded machine can take tens of seconds).
    startup_timeout_s = 120.0

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe(duplex=True)
        self._process = context.Process(target=_serve, args=(child_end,), name="trajlake-decoder", daemon=True)
        self._process.start()
        child_end.close()
        self._sender: threading.Thread | None = None
        self._ready = False

    def call(self, header: dict[str, Any], parts: Sequence[bytes | pa.Buffer], deadline_s: float) -> tuple[dict, list]:
        """Send a request, return the reply header and its byte parts.

        The request is written by a helper thread: a child that stops reading (stopped,
        wedged) would otherwise block the write of a request larger than the pipe buffer
        before the deadline could start; killing the child ends that write.

        Raises:
            _BlockTimeout: no complete reply within ``deadline_s`` of waiting, or the child died.
        """
        self._sender = threading.Thread(target=self._send, args=({**header, "parts": len(parts)}, parts), daemon=True)
        self._sender.start()
        try:
            if not self._ready:  # start-up (imports) does not count against a request's deadline
                if not self._conn.poll(self.startup_timeout_s):
                    raise _BlockTimeout
                self._ready = self._conn.recv().get("ready", False)
            if not self._conn.poll(deadline_s):
                raise _BlockTimeout
            reply = self._conn.recv()
            out = []
            for _ in range(reply.pop("parts")):
                if not self._conn.poll(deadline_s):
                    raise _BlockTimeout
                out.append(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:  # the child died (a native crash, the OOM killer)
            raise _BlockTimeout from exc
        self._sender.join()
        return reply, out

    def _send(self, header: dict[str, Any], parts: Sequence[bytes | pa.Buffer]) -> None:
        with contextlib.suppress(OSError):  # the child was killed, or died: call() reports it
            self._conn.send(header)
            for part in parts:
                self._conn.send_bytes(part)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def close(self, grace_s: float = 1.0) -> None:
        """End the child: EOF on its pipe lets an idle one exit; a busy one is killed."""
        writing = self._sender is not None and self._sender.is_alive()
        if not writing:  # no other thread uses the pipe: closing it is the exit request
            self._conn.close()
            self._process.join(grace_s)
        if self._process.exitcode is None:
            self._process.kill()  # a write still in flight fails with EPIPE
            self._process.join()
        if self._sender is not None:
            self._sender.join()
        with contextlib.suppress(OSError):
            self._conn.close()
        self._process.close()


_INGEST_ONLY = ("kafka_topic", "kafka_partition", "kafka_offset", "ingested_at")


def with_coordinates(
    events: pa.Table, target: pa.Schema, topic: str, partitions: pa.Array, offsets: pa.Array, ingested_at: datetime
) -> pa.Table:
    """Complete decoded events with Kafka coordinates into a ``target``-shaped table.

    Args:
        events: ``DecodeResult.events``.
        target: the raw-events Arrow schema.
        topic: Kafka topic of the batch.
        partitions: partition of every record of the batch (indexed by ``ROW_INDEX``).
        offsets: offset of every record of the batch (indexed by ``ROW_INDEX``).
        ingested_at: ingest time stamped on every row.
    """
    index = events.column(ROW_INDEX)
    n = events.num_rows
    extra = {
        "kafka_topic": pa.repeat(pa.scalar(topic, target.field("kafka_topic").type), n),
        "kafka_partition": pc.take(partitions, index).cast(target.field("kafka_partition").type),
        "kafka_offset": pc.take(offsets, index).cast(target.field("kafka_offset").type),
        "ingested_at": pa.repeat(pa.scalar(ingested_at, target.field("ingested_at").type), n),
    }
    arrays = [extra[f.name] if f.name in extra else events.column(f.name) for f in target]
    return pa.Table.from_arrays(arrays, schema=target)
