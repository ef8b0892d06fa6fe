"""Writing a decoded batch as Iceberg data files, in the decoder process (see ``FileTarget``)."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.manifest import DataFile

from common.errors import TransientError
from pipelines.decode.results import KEY_COLUMNS, ROW_INDEX, FileTarget, UnwritableEvent, with_coordinates
from schemas.errors import DecodeError
from warehouse import parquet_writer
from warehouse.transactions import data_files

log = logging.getLogger("trajlake.decode")

T = TypeVar("T")

#: Errors of the place written to, not of the rows: they stop the batch (and ingest) as before,
#: so an unreachable object store never turns good events into dead letters.
ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (OSError, MemoryError, TransientError)


@functools.cache
def file_io(properties: tuple[tuple[str, str], ...], location: str) -> FileIO:
    """The FileIO of a table's properties and location, one per process (the decoder writes many batches)."""
    return load_file_io(dict(properties), location)


def write_files(events: pa.Table, target: pa.Schema, write: FileTarget) -> tuple[pa.Table, list[DataFile]]:
    """Write decoded events as data files of ``write``'s table; returns their keys and the files."""
    partitions, offsets = pa.array(write.partitions), pa.array(write.offsets)
    timestamps = pa.array(write.timestamps) if write.timestamps is not None else None
    rows = with_coordinates(events, target, write.topic, partitions, offsets, write.ingested_at, timestamps)
    del events
    files: list[DataFile] = []
    parquet_writer.install()  # as in a process that opened the catalog: no dictionary for valueless columns
    if rows.num_rows:
        io = file_io(tuple(sorted(write.io_properties.items())), write.metadata.location)
        files = data_files(write.metadata, rows, io, uuid.uuid4())
    # Keys are in the rows' order, not the files': callers match rows by Kafka coordinates.
    return rows.select(list(KEY_COLUMNS)), files


def write_files_isolating(
    events: pa.Table, target: pa.Schema, write: FileTarget
) -> tuple[pa.Table, list[DataFile], list[tuple[int, DecodeError]]]:
    """:func:`write_files`, isolating the events that cannot be written instead of failing the batch.

    See :func:`isolate_unwritable`; the keys of the rows that were written come back in their order.

    Returns:
        Keys of the written rows, the data files, and the unwritable events by batch index.

    Raises:
        ENVIRONMENT_ERRORS: writing failed for a reason that is not the rows'.
    """
    empty = pa.table({name: pa.array([], target.field(name).type) for name in KEY_COLUMNS})
    written, unwritable = isolate_unwritable(events, lambda part: write_files(part, target, write))
    keys = pa.concat_tables([empty, *(k for k, _ in written)])
    return keys, [f for _, files in written for f in files], unwritable


def isolate_unwritable(rows: pa.Table, write: Callable[[pa.Table], T]) -> tuple[list[T], list[tuple[int, DecodeError]]]:
    """``write(rows)``, or, when it raises, ``write`` of every part of ``rows`` but the rows that fail alone.

    When writing the whole of ``rows`` raises (anything but :data:`ENVIRONMENT_ERRORS`), the rows are
    split in halves and each half written again, until every failing row is alone: ``k`` bad rows
    among ``n`` cost about ``2k·log2(n)`` attempts, the common case one ``try``. Files a failed attempt
    wrote before raising are orphans (never committed; maintenance removes them).

    Args:
        rows: the rows, with ``ROW_INDEX`` (their index in the batch).
        write: writes some rows; deterministic in them (the same rows fail the same way).

    Returns:
        What each successful ``write`` returned, in row order, and ``(ROW_INDEX, UnwritableEvent)``
        of every row that could not be written, the exception named in its message.

    Raises:
        ENVIRONMENT_ERRORS: writing failed for a reason that is not the rows'.
    """
    try:
        return [write(rows)], []
    except ENVIRONMENT_ERRORS:
        raise
    except Exception as exc:
        if rows.num_rows <= 1:
            indices = rows.column(ROW_INDEX).to_pylist()
            detail = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            log.warning("event at batch index %s cannot be written, dead-lettered: %s", indices, detail)
            return [], [(index, UnwritableEvent(detail)) for index in indices]
    half = rows.num_rows // 2
    written: list[T] = []
    unwritable: list[tuple[int, DecodeError]] = []
    for part in (rows.slice(0, half), rows.slice(half)):
        done, failed = isolate_unwritable(part, write)
        written += done
        unwritable += failed
    return written, unwritable
