"""DuckDB over the lakehouse: one view per table under its stable name, read-only.

Views: ``events``, ``dead_letters``, ``trajectories``, ``steps`` and every other
registered table (``scores``, ``flags``, ``duplicates``, ``exports``, …). Each
view reads the Parquet files of the table's current Iceberg snapshot, planned
by pyiceberg; a view over a table with no rows still has the full schema.
``events``, ``trajectories`` and ``steps`` span the hot and cold tiers; ``hot_*``
and ``cold_*`` views query one tier.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from common.settings import Settings
from warehouse.catalog import open_catalog
from warehouse.errors import QueryError
from warehouse.snapshots import current_files
from warehouse.tables import TABLES, TableSpec, ensure_table

#: Statement types a ``trajlake sql`` query may contain.
_READ_ONLY = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


def connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with UTC session time."""
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    # Iceberg data files are immutable, so their Parquet footers can be kept for the connection's
    # life: binding a view (``union_by_name``) and pruning row groups then stop re-reading one
    # footer per file on every query — what a session lookup over many files is mostly made of.
    con.execute("SET parquet_metadata_cache = true")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    return con


def local_path(uri: str) -> str:
    """DuckDB-readable path for a file URI (``file:///x`` → ``/x``); other schemes unchanged."""
    return uri[len("file://") :] if uri.startswith("file://") else uri


def parquet_source(paths: Iterable[str], same_schema: bool = False, row_ids: bool = False) -> str:
    """SQL table expression reading ``paths`` (which must be non-empty).

    Files are matched by column name (``union_by_name``) unless ``same_schema`` says they
    were all written under one schema: then DuckDB binds the first file's schema and
    skips the per-file name matching, which was about half of a point lookup over 19 files.
    ``row_ids`` adds the columns ``filename`` and ``file_row_number``, which name one
    physical row even when two rows are identical.
    """
    listed = ", ".join("'" + local_path(p).replace("'", "''") + "'" for p in paths)
    # Iceberg keeps partition values in its metadata, not in paths: the ``ts_day=…`` directories
    # must not become an extra column.
    options = "hive_partitioning = false" + ("" if same_schema else ", union_by_name = true")
    if row_ids:
        options += ", filename = true, file_row_number = true"
    return f"read_parquet([{listed}], {options})"


def _source(con: duckdb.DuckDBPyConnection, name: str, table: Table, spec: TableSpec,
            exclude: frozenset[str] | set[str] = frozenset()) -> str:  # fmt: skip
    """SQL table expression over ``table``'s current rows, skipping the data files in ``exclude``.

    Local Parquet files without deletes are read by DuckDB directly; anything else
    (delete files, ``s3://`` files DuckDB has no credentials for) through pyiceberg.
    """
    empty_name = f"__empty_{name}"
    con.register(empty_name, pa.Table.from_pylist([], schema=spec.arrow_schema()))
    files = current_files(table)
    paths = [p for p in files.paths if p not in exclude]
    if not paths:
        return f'(SELECT * FROM "{empty_name}")'
    if files.has_deletes or not all(p.startswith(("file://", "/")) for p in paths):
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        tasks = [t for t in table.scan().plan_files() if t.file.file_path not in exclude]
        con.register(
            f"__scan_{name}", ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)
        )
        return f'(SELECT * FROM "{empty_name}" UNION ALL BY NAME SELECT * FROM "__scan_{name}")'
    if len(table.metadata.schemas) == 1:
        # One schema for the table's whole life: every file has exactly the view's columns.
        return f"(SELECT * FROM {parquet_source(paths, same_schema=True)})"
    return f'(SELECT * FROM "{empty_name}" UNION ALL BY NAME SELECT * FROM {parquet_source(paths)})'


def register_table(con: duckdb.DuckDBPyConnection, name: str, table: Table, spec: TableSpec) -> None:
    """Create view ``name`` over ``table``'s current snapshot."""
    con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM {_source(con, name, table, spec)}')


def register_tiered(con: duckdb.DuckDBPyConnection, settings: Settings, catalog: Catalog, spec: TableSpec) -> None:
    """Views ``hot_<view>``, ``cold_<view>`` and their union ``<view>``, which counts every row once.

    A crash mid-tiering can leave rows in both tiers (see :mod:`warehouse.tiering`):
    raw events are excluded from hot by the cold table's list of copied hot files,
    trajectories and steps by session (the cold copy wins). So ``hot_<view>`` is the
    hot rows not already in cold, and ``hot_<view>`` ∪ ``cold_<view>`` = ``<view>``.
    """
    from warehouse.tiering import ensure_cold_table, tiered_files

    hot = ensure_table(catalog, settings, spec.name)
    cold = ensure_cold_table(catalog, settings, spec.name)
    view = spec.view
    cold_src = _source(con, f"cold_{view}", cold, spec)
    con.execute(f'CREATE OR REPLACE VIEW "cold_{view}" AS SELECT * FROM {cold_src}')
    if spec.name == "raw_events":
        hot_src = _source(con, f"hot_{view}", hot, spec, exclude=tiered_files(cold))
        con.execute(f'CREATE OR REPLACE VIEW "hot_{view}" AS SELECT * FROM {hot_src}')
    else:
        hot_src = _source(con, f"hot_{view}", hot, spec)
        con.execute(
            f'CREATE OR REPLACE VIEW "hot_{view}" AS SELECT * FROM {hot_src} AS h '
            f'ANTI JOIN (SELECT DISTINCT session_id FROM "cold_{view}") AS c USING (session_id)'
        )
    con.execute(
        f'CREATE OR REPLACE VIEW "{view}" AS SELECT * FROM "cold_{view}" UNION ALL BY NAME SELECT * FROM "hot_{view}"'
    )


def open_views(settings: Settings, catalog: Catalog | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per trajlake table under its stable name.

    Tables with a cold tier (events, trajectories, steps) also get ``hot_*`` and
    ``cold_*`` views; their plain view spans both tiers.
    """
    from warehouse.tiering import TIERED_TABLES

    catalog = catalog or open_catalog(settings)
    con = connect()
    for spec in TABLES.values():
        if spec.name in TIERED_TABLES:
            register_tiered(con, settings, catalog, spec)
        else:
            register_table(con, spec.view, ensure_table(catalog, settings, spec.name), spec)
    return con


def check_read_only(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Reject anything but SELECT/EXPLAIN statements.

    Raises:
        QueryError: a statement would write, attach, install or change settings.
    """
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse query: {exc}") from exc
    if not statements:
        raise QueryError("empty query")
    for statement in statements:
        if statement.type not in _READ_ONLY:
            raise QueryError(f"only read-only queries are allowed, got a {statement.type.name} statement")


def run_query(settings: Settings, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run a read-only query over the views; returns column names and rows.

    Raises:
        QueryError: not read-only, or DuckDB failed (message names the cause).
    """
    con = open_views(settings)
    check_read_only(con, query)
    try:
        relation = con.sql(query)
        if relation is None:
            return [], []
        return list(relation.columns), relation.fetchall()
    except duckdb.Error as exc:
        raise QueryError(str(exc).splitlines()[0]) from exc


def format_rows(columns: list[str], rows: list[tuple[Any, ...]], fmt: str) -> str:
    """Render rows as ``table`` (aligned text), ``csv`` or ``json`` (one array of objects)."""
    if fmt == "json":
        return json.dumps([dict(zip(columns, row, strict=True)) for row in rows], default=str, indent=None)
    if fmt == "csv":
        import csv
        import io

        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        return buffer.getvalue().rstrip("\n")
    if fmt != "table":
        raise QueryError(f"unknown format {fmt!r}; use table, csv or json")
    cells = [[str(c) for c in columns]] + [["NULL" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))] if columns else []
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if lines:
        lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)
