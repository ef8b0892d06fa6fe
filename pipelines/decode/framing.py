"""Avro object-container framing of record values, and the Arrow buffers they travel in.

A batch's single-object records are decoded as one block of an in-memory Avro object
container whose writer schema has a leading ``fixed`` field covering the single-object
header (:func:`framed_schema`), so the record values concatenated as they are form a
valid data block. Values travel as Arrow binary arrays (one buffer, no copy per value)
and decoded tables as Arrow IPC streams.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa

from schemas.registry import HEADER_LEN


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


#: Leading field that swallows each record's single-object header (magic + fingerprint).
HEADER_FIELD = "__single_object_header"


def framed_schema(writer: dict[str, Any]) -> dict[str, Any]:
    """The writer schema with a leading ``fixed`` field covering the single-object header.

    A single-object record is ``header + body``; reading it with this schema decodes
    the header as a field, so a batch's record values concatenated as they are form
    a valid Avro data block (no per-record copy to strip the header).
    """
    header = {"name": HEADER_FIELD, "type": {"type": "fixed", "name": "TrajlakeSingleObjectHeader", "size": HEADER_LEN}}
    return {**writer, "fields": [header, *writer["fields"]]}


def read_container(container: bytes, expected_rows: int) -> pa.Table:
    """Decode an object container with the Rust reader."""
    from polars_avro._avro_rs import AvroSource  # imported lazily: only the decoding process needs it
    from polars_avro._source import seekable_factory

    source = AvroSource([seekable_factory(io.BytesIO(container))], False, False)
    batches = [pa.record_batch(batch) for batch in source.batch_iter(max(expected_rows, 1), None)]
    rows = sum(batch.num_rows for batch in batches)
    if rows != expected_rows:
        raise ValueError(f"block of {expected_rows} records decoded to {rows} rows")
    return pa.Table.from_batches(batches)


def read_container_safely(container: bytes, expected_rows: int) -> pa.Table | str:
    """The decoded table, or the error text when decoding failed; never raises."""
    try:
        return read_container(container, expected_rows)
    except BaseException as exc:  # Rust panics surface as BaseException subclasses
        return f"{type(exc).__name__}: {exc}"


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


class LazyValues(Sequence[bytes]):
    """Record values read from a binary array on demand (the decoder process's ``values``)."""

    def __init__(self, array: pa.BinaryArray) -> None:
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._array[index].as_py() or b""
