"""Parquet data files with Bloom filters: the Iceberg table properties pyiceberg's writer leaves out.

Iceberg defines ``write.parquet.bloom-filter-enabled.column.<column>`` (and
``write.parquet.bloom-filter-fpp.column.<column>``, ``write.parquet.bloom-filter-max-bytes``);
Java Iceberg and Spark honour them, pyiceberg 0.12 warns and writes no filter. Without one, a
lookup of one session in a cold tier sorted by session still reads a row group of every file
whose session range covers the id — every file of every day, since each day holds sessions from
the whole id space. With one, DuckDB skips a row group whose filter excludes the id (its
``parquet_bloom_probe`` shows it), and the filters sit in the file's tail, which
:class:`~warehouse.object_store.FooterCache` keeps on local disk.

:func:`install` puts a Parquet format model into pyiceberg's registry that honours those
properties and otherwise writes exactly what pyiceberg's writer does (it is that writer, given
pyarrow's ``bloom_filter_options``), except that a leaf column holding no value in the file, or
mostly distinct values, is written without a dictionary (:func:`valueless_columns`,
:func:`distinct_columns`). A filter is sized for the row groups being written: the
most distinct values of the column in one row group (the writer knows its rows before it writes
them), at the configured false-positive rate, capped at the maximum size.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import OutputFile
from pyiceberg.io.fileformat import FileFormatFactory
from pyiceberg.io.pyarrow import ParquetFormatModel, ParquetFormatWriter
from pyiceberg.manifest import FileFormat
from pyiceberg.schema import Schema
from pyiceberg.typedef import Properties

BLOOM_ENABLED = "write.parquet.bloom-filter-enabled.column"
BLOOM_FPP = "write.parquet.bloom-filter-fpp.column"
BLOOM_MAX_BYTES = "write.parquet.bloom-filter-max-bytes"
ROW_GROUP_LIMIT = "write.parquet.row-group-limit"
_DEFAULT_FPP = 0.01
_DEFAULT_MAX_BYTES = 1 << 20
#: A Bloom filter at false-positive rate p needs about -ln p / ln² 2 bits per distinct value.
_LN2_SQUARED = math.log(2) ** 2
_BLOOM_KEYS = (BLOOM_ENABLED, BLOOM_FPP, BLOOM_MAX_BYTES)
_installed = threading.Lock()


def bloom_columns(properties: Properties) -> dict[str, float]:
    """Columns with a Bloom filter enabled in ``properties``, each with its false-positive rate."""
    columns: dict[str, float] = {}
    for key, value in properties.items():
        if key.startswith(BLOOM_ENABLED + ".") and str(value).strip().lower() == "true":
            name = key[len(BLOOM_ENABLED) + 1 :]
            columns[name] = float(properties.get(f"{BLOOM_FPP}.{name}", _DEFAULT_FPP))
    return columns


def _most_values(max_bytes: int, fpp: float) -> int:
    """Distinct values a filter of ``max_bytes`` holds at false-positive rate ``fpp``."""
    bits_per_value = -math.log(fpp) / _LN2_SQUARED
    return max(1, int(max_bytes * 8 / bits_per_value))


def _leaves(path: str, array: pa.Array, empty: bool = False) -> Iterator[tuple[str, pa.Array, bool]]:
    """(Parquet column path, values, holds a value) of every leaf column of ``array`` (a column named ``path``).

    A leaf holds no value when it, or a level above it, is null in every row.
    """
    empty = empty or array.null_count == len(array)
    kind = array.type
    if pa.types.is_struct(kind):
        for index in range(kind.num_fields):
            yield from _leaves(f"{path}.{kind.field(index).name}", array.field(index), empty)
    elif pa.types.is_map(kind):
        yield from _leaves(f"{path}.key_value.key", array.keys, empty)
        yield from _leaves(f"{path}.key_value.value", array.items, empty)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        yield from _leaves(f"{path}.list.element", array.values, empty)
    else:
        yield path, array, not empty


#: Rows of a file's first chunk whose values decide which leaf columns get a dictionary (see ``distinct_columns``).
DICTIONARY_SAMPLE_ROWS = 4096
#: Values a sample must hold to decide; a sparser column keeps the dictionary (pyarrow's default).
_DICTIONARY_SAMPLE_VALUES = 64


def distinct_columns(table: pa.Table) -> set[str]:
    """Parquet paths of the leaf columns whose values are mostly distinct, judged on the table's first rows.

    A leaf whose first ``DICTIONARY_SAMPLE_ROWS`` rows hold at least 64 values, more than half of
    them distinct (ids, timestamps, free text, measurements), gains nothing from a dictionary: its
    page would hold nearly every value once more and every row an index besides, and encoding it is
    a hash lookup per value. Sorted by session, raw_events' event ids, offsets and outputs are such
    columns; event types, tool names, session ids and statuses are not.
    """
    distinct: set[str] = set()
    for name in table.column_names:
        column = table.column(name)
        if not column.num_chunks:
            continue
        head = column.chunk(0).slice(0, DICTIONARY_SAMPLE_ROWS)
        for path, leaf, _ in _leaves(name, head):
            values = leaf.slice(0, DICTIONARY_SAMPLE_ROWS)
            present = len(values) - values.null_count
            if present < _DICTIONARY_SAMPLE_VALUES or pa.types.is_boolean(values.type):
                continue
            if pc.count_distinct(values).as_py() * 2 > present:
                distinct.add(path)
    return distinct


def valueless_columns(table: pa.Table) -> set[str]:
    """Parquet paths of the leaf columns of ``table`` that hold no value at all (every row null at some level)."""
    holding: dict[str, bool] = {}
    for name in table.column_names:
        for chunk in table.column(name).chunks:
            for path, _, has_value in _leaves(name, chunk):
                holding[path] = holding.get(path, False) or has_value
    return {path for path, has_value in holding.items() if not has_value}


def _all_leaves(table: pa.Table) -> list[str]:
    """Parquet paths of every leaf column of ``table``, in order."""
    return [path for field in table.schema for path, _, _ in _leaves(field.name, pa.nulls(0, field.type))]


def _distinct_per_group(column: pa.ChunkedArray, group_rows: int) -> int:
    """The most distinct non-null values of ``column`` in one row group of ``group_rows`` rows."""
    most = 0
    for start in range(0, len(column), group_rows):
        most = max(most, pc.count_distinct(column.slice(start, group_rows)).as_py())
    return most


class _BloomParquetWriter(ParquetFormatWriter):
    """pyiceberg's Parquet writer, plus the Bloom filters the table properties ask for."""

    def __init__(self, output_file: OutputFile, file_schema: Schema, properties: Properties) -> None:
        self._blooms = bloom_columns(properties)
        self._bloom_max_bytes = int(properties.get(BLOOM_MAX_BYTES, _DEFAULT_MAX_BYTES))
        # The parent warns about every bloom property it does not implement; they are handled here.
        rest = {k: v for k, v in properties.items() if not k.startswith(_BLOOM_KEYS)}
        super().__init__(output_file, file_schema, rest)

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            # A column with no value in the file gets no dictionary: its chunks hold only definition levels,
            # and an empty dictionary page per chunk and row group is pure cost (49 of the 136 leaf columns
            # of raw_events in a batch of v1 events: the per-kind payloads of later schema versions).
            # A column of mostly distinct values gets none either (see distinct_columns): smaller and cheaper.
            plain = valueless_columns(table) | distinct_columns(table)
            if plain:
                used = [path for path in _all_leaves(table) if path not in plain]
                self._parquet_writer_kwargs = {**self._parquet_writer_kwargs, "use_dictionary": used}
        if self._writer is None and self._blooms:
            options: dict[str, dict[str, Any]] = {}
            group_rows = max(1, self._row_group_size or len(table))
            for name, fpp in self._blooms.items():
                if name not in table.column_names:
                    continue
                ndv = _distinct_per_group(table.column(name), group_rows)
                # pyarrow rounds a filter up to a power of two: sized for half the cap, it stays under it.
                ndv = min(max(ndv, 1), _most_values(self._bloom_max_bytes // 2, fpp))
                options[name] = {"ndv": ndv, "fpp": fpp}
            if options:
                self._parquet_writer_kwargs = {**self._parquet_writer_kwargs, "bloom_filter_options": options}
        super().write(table)


class _BloomParquetModel(ParquetFormatModel):
    def create_writer(
        self, output_file: OutputFile, file_schema: Schema, properties: Properties
    ) -> ParquetFormatWriter:
        return _BloomParquetWriter(output_file, file_schema, properties)


def install() -> None:
    """Make pyiceberg write Parquet through :class:`_BloomParquetWriter` in this process (idempotent)."""
    with _installed:
        registry = FileFormatFactory._registry  # no public replace: register() refuses a second model
        if not isinstance(registry.get(FileFormat.PARQUET), _BloomParquetModel):
            registry[FileFormat.PARQUET] = _BloomParquetModel()
