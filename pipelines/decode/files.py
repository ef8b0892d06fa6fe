"""Writing a decoded batch as Iceberg data files, in the decoder process (see ``FileTarget``)."""

from __future__ import annotations

import functools
import uuid

import pyarrow as pa
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.manifest import DataFile

from pipelines.decode.results import KEY_COLUMNS, FileTarget, with_coordinates
from warehouse import parquet_writer
from warehouse.transactions import data_files


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
