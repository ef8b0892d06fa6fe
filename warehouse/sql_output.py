"""Query results as text — ``table``, ``csv`` or ``json`` — written as the rows arrive.

Values come from the lakehouse, which holds what agents and tools printed: they may contain
terminal control sequences (colour, cursor movement, the title, OSC 8 links, a ``\\r`` that
overwrites what was printed) and text a spreadsheet runs as a formula. So, unless ``raw``:

* ``table`` shows every control character (C0, DEL, C1) and every Unicode bidirectional
  control as a visible escape (``\\x1b``, ``\\r``, ``\\u202e``): the terminal only ever receives
  printable text, and a value cannot fake the lines around it.
* ``csv`` prefixes a text cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
  return with ``'`` (the usual guard against formula injection); numbers are left alone.
* ``json`` is escaped by JSON itself (``\\u001b``).

``table`` needs every shown row to align its columns, so it renders at most ``table_rows``
rows and counts the rest; ``csv`` and ``json`` write every row, one batch at a time, so the
memory they use does not grow with the result.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any, TextIO

import pyarrow as pa

from common.text import UNSAFE, printable
from warehouse.errors import QueryError

FORMATS = ("table", "csv", "json")

#: What :func:`escape_controls` escapes (``common.text.UNSAFE``: controls, bidi, separators, surrogates).
_CONTROL = UNSAFE
#: What a spreadsheet takes as the start of a formula (or strips before looking for one).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def escape_controls(text: str) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ``\\r``, ``\\u202e``), on one line."""
    return printable(text, multiline=False)


def defuse_formula(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula, prefixed with ``'``; anything else unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def python_values(array: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The values of one result column as the DuckDB Python client returns them.

    Arrow carries a few DuckDB types differently: ``HUGEINT`` as ``DECIMAL(38, 0)`` (back to
    ``int``), ``INTERVAL`` as month-day-nano (to ``timedelta``, a month as 30 days like DuckDB),
    ``MAP`` as a list of pairs (to ``dict``).
    """
    kind = array.type
    values = array.to_pylist()
    if pa.types.is_decimal(kind) and kind.scale == 0 and kind.precision == 38:
        return [None if v is None else int(v) for v in values]
    if pa.types.is_interval(kind):
        return [
            None if v is None else timedelta(days=v.months * 30 + v.days, microseconds=v.nanoseconds // 1000)
            for v in values
        ]
    if pa.types.is_map(kind):
        return [None if v is None else dict(v) for v in values]
    return values


def batch_rows(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """The rows of one record batch as tuples of Python values (see :func:`python_values`)."""
    if batch.num_columns == 0:
        return []
    return list(zip(*(python_values(column) for column in batch.columns), strict=True))


def write_rows(
    columns: list[str],
    chunks: Iterable[list[tuple[Any, ...]]],
    fmt: str,
    out: TextIO,
    *,
    raw: bool = False,
    table_rows: int | None = None,
) -> int:
    """Write rows arriving in ``chunks`` to ``out`` in ``fmt``; returns the number of rows.

    Args:
        columns: The column names.
        chunks: The rows, a list at a time (each written before the next is taken).
        fmt: ``table``, ``csv`` or ``json``.
        out: Where the text goes (ends with a newline).
        raw: Write values as they are: no escaping of controls in ``table``, no formula guard in ``csv``.
        table_rows: Most rows ``table`` renders (None: all); the count still covers every row.

    Raises:
        QueryError: an unknown format (or whatever ``chunks`` raises while it is read).
    """
    if fmt == "json":
        return _write_json(columns, chunks, out)
    if fmt == "csv":
        return _write_csv(columns, chunks, out, raw)
    if fmt != "table":
        raise QueryError(f"unknown format {fmt!r}; use {', '.join(FORMATS)}")
    return _write_table(columns, chunks, out, raw, table_rows)


def _write_json(columns: list[str], chunks: Iterable[list[tuple[Any, ...]]], out: TextIO) -> int:
    count = 0
    out.write("[")
    for rows in chunks:
        for row in rows:
            out.write((", " if count else "") + json.dumps(dict(zip(columns, row, strict=True)), default=str))
            count += 1
    out.write("]\n")
    return count


def _write_csv(columns: list[str], chunks: Iterable[list[tuple[Any, ...]]], out: TextIO, raw: bool) -> int:
    writer = csv.writer(out, lineterminator="\n")
    # The csv module quotes a field holding the line terminator but not a lone ``\r``, which
    # readers take for a line break: a row with one has every field quoted.
    quoted = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)

    def write(row: Iterable[Any]) -> None:
        cells = list(row) if raw else [defuse_formula(v) for v in row]
        (quoted if any(isinstance(v, str) and "\r" in v for v in cells) else writer).writerow(cells)

    write(columns)
    count = 0
    for rows in chunks:
        for row in rows:
            write(row)
        count += len(rows)
    return count


def _write_table(
    columns: list[str], chunks: Iterable[list[tuple[Any, ...]]], out: TextIO, raw: bool, limit: int | None
) -> int:
    def cell(value: Any) -> str:
        text = "NULL" if value is None else str(value)
        return text if raw else escape_controls(text)

    shown: list[list[str]] = [[cell(c) for c in columns]]
    count = 0
    for rows in chunks:
        room = (limit - (len(shown) - 1)) if limit is not None else len(rows)
        shown += [[cell(v) for v in row] for row in rows[: max(0, room)]]
        count += len(rows)
    widths = [max(len(r[i]) for r in shown) for i in range(len(columns))] if columns else []
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in shown]
    if columns:
        lines.insert(1, "  ".join("-" * w for w in widths))
    else:
        lines = []
    footer = f"({count} row{'s' if count != 1 else ''}"
    if count > len(shown) - 1:
        footer += f", the first {len(shown) - 1} shown; --format csv or json prints every row"
    lines.append(footer + ")")
    out.write("\n".join(lines) + "\n")
    return count


def format_rows(columns: list[str], rows: list[tuple[Any, ...]], fmt: str, raw: bool = False) -> str:
    """Render rows as ``table`` (aligned text), ``csv`` or ``json`` (one array of objects), without a final newline.

    Controls in ``table`` and formulas in ``csv`` are neutralised unless ``raw`` (see the module).
    """
    import io

    buffer = io.StringIO()
    write_rows(columns, [rows], fmt, buffer, raw=raw)
    return buffer.getvalue().rstrip("\n")


def chunked(batches: Iterable[pa.RecordBatch]) -> Iterator[list[tuple[Any, ...]]]:
    """Rows of each record batch in turn (for :func:`write_rows`)."""
    for batch in batches:
        yield batch_rows(batch)
