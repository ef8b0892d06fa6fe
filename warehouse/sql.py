"""DuckDB over the lakehouse: one view per table under its stable name, read-only.

Views: ``events``, ``dead_letters``, ``trajectories``, ``steps`` and every other
registered table (``scores``, ``flags``, ``duplicates``, ``exports``, …). Each
view reads the Parquet files of the table's current Iceberg snapshot, planned
by pyiceberg; a view over a table with no rows still has the full schema.
``events``, ``trajectories`` and ``steps`` span the hot and cold tiers; ``hot_*``
and ``cold_*`` views query one tier.

:func:`stream_query` (and :func:`run_query`, which collects its rows) runs text it does not trust
(``trajlake sql``): exactly one read-only statement, parsed by DuckDB itself, on a connection that
is locked before the text runs — it can open only the data files its views read (``allowed_paths``),
cannot install or load extensions or change settings — in a process of its own that is killed at
``TRAJLAKE_SQL_TIMEOUT_S`` (planning included) and whose memory is capped (:mod:`warehouse.isolation`);
the result streams back in record batches.
Cold tables on ``s3://`` are read in place too (``warehouse.object_store``): a query fetches
the footers and row groups it needs, never the whole table.
:func:`open_views` without ``locked`` is for trusted internal callers (scoring, export, Dagster).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import date
from typing import Any

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from common.settings import Settings, byte_size
from warehouse.catalog import open_catalog
from warehouse.cold import TIERED_TABLES, ensure_cold_table, tiered_files
from warehouse.errors import QueryError
from warehouse.files import local_path, object_store, object_stores, parquet_source
from warehouse.health import register_health_views
from warehouse.isolation import BatchSink, IsolatedStream
from warehouse.object_store import ObjectStores, is_object_store_path
from warehouse.prices import register_priced_trajectories
from warehouse.snapshots import current_files, day_partitions, live_files
from warehouse.sql_output import chunked
from warehouse.sql_output import format_rows as format_rows  # for callers that render materialised rows
from warehouse.tables import TABLES, TableSpec, ensure_table

#: Keywords that make an ``EXPLAIN`` run its statement.
_ANALYZE = {"ANALYZE", "ANALYSE"}

#: Query nodes a read-only query may contain. DuckDB also parses ``COPY … TO``, ``INSERT``,
#: ``UPDATE`` and ``DELETE`` as the body of a CTE inside a statement typed SELECT.
_READ_NODES = {"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"}
#: Rows per record batch a query streams (the DuckDB vector size times two): small enough that
#: neither process holds much of a wide result at once.
BATCH_ROWS = 4096


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


def _source(
    con: duckdb.DuckDBPyConnection,
    name: str,
    table: Table,
    spec: TableSpec,
    exclude: frozenset[str] | set[str] = frozenset(),
    reads: set[str] | None = None,
    stores: ObjectStores | None = None,
) -> str:
    """SQL table expression over ``table``'s current rows, skipping the data files in ``exclude``.

    Parquet files without deletes are read by DuckDB where they lie (their paths are added
    to ``reads``): local files directly, ``s3://`` files through the connection's
    :class:`~warehouse.object_store_fs.ObjectStoreFS` (``stores``, registered on first use), so
    DuckDB fetches only the footers and row groups a query needs. Anything else (delete
    files, other schemes) is read through pyiceberg, into a registered Arrow table.
    """
    empty_name = f"__empty_{name}"
    con.register(empty_name, pa.Table.from_pylist([], schema=spec.arrow_schema()))
    files = current_files(table)
    paths = [p for p in files.paths if p not in exclude]
    if not paths:
        return f'(SELECT * FROM "{empty_name}")'
    remote = all(is_object_store_path(p) for p in paths)
    if remote and not files.has_deletes:
        wanted = set(paths)
        object_store(con, table, stores).add_files(
            {e.path: e.data_file.file_size_in_bytes for e in live_files(table) if e.path in wanted}
        )
    elif files.has_deletes or not all(p.startswith(("file://", "/")) for p in paths):
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        tasks = [t for t in table.scan().plan_files() if t.file.file_path not in exclude]
        con.register(
            f"__scan_{name}", ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks)
        )
        return f'(SELECT * FROM "{empty_name}" UNION ALL BY NAME SELECT * FROM "__scan_{name}")'
    if reads is not None:
        reads.update(local_path(p) for p in paths)
    if len(table.metadata.schemas) == 1:
        # One schema for the table's whole life: every file has exactly the view's columns.
        return f"(SELECT * FROM {parquet_source(paths, same_schema=True)})"
    return f'(SELECT * FROM "{empty_name}" UNION ALL BY NAME SELECT * FROM {parquet_source(paths)})'


def register_table(
    con: duckdb.DuckDBPyConnection,
    name: str,
    table: Table,
    spec: TableSpec,
    reads: set[str] | None = None,
    stores: ObjectStores | None = None,
) -> None:
    """Create view ``name`` over ``table``'s current snapshot; the files it reads go into ``reads``.

    A table whose spec has a ``derived`` query gets two: ``<name>_stored``, its rows, and ``name``,
    the query over them (and the views it reads, created before). ``stores`` holds the
    connection's object-store filesystem across calls (see :func:`_source`).
    """
    source = _source(con, name, table, spec, reads=reads, stores=stores)
    if spec.derived is None:
        con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM {source}')
        return
    con.execute(f'CREATE OR REPLACE VIEW "{name}_stored" AS SELECT * FROM {source}')
    con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {spec.derived.format(stored=f"{name}_stored")}')


def register_tiered(
    con: duckdb.DuckDBPyConnection,
    settings: Settings,
    catalog: Catalog,
    spec: TableSpec,
    reads: set[str] | None = None,
    stores: ObjectStores | None = None,
    view: str | None = None,
    on_days: Callable[[date | None], bool] | None = None,
) -> None:
    """Views ``hot_<view>``, ``cold_<view>`` and their union ``<view>``, which counts every row once.

    A crash mid-tiering can leave rows in both tiers (see :mod:`warehouse.tiering`):
    raw events are excluded from hot by the cold table's list of copied hot files,
    trajectories and steps by session (the cold copy wins). So ``hot_<view>`` is the
    hot rows not already in cold, and ``hot_<view>`` ∪ ``cold_<view>`` = ``<view>``.
    The data files the views read directly go into ``reads``; ``stores`` as for :func:`register_table`.

    ``view``: the views' name (default: the spec's). ``on_days``: only the files of the day
    partitions (None: NULL) it accepts are read, in both tiers — DuckDB then opens no other file,
    where a filter on the partition column still reads every file's footer to skip it. A
    session's copies in the two tiers are of the same day, so the union still counts it once.
    """
    hot = ensure_table(catalog, settings, spec.name)
    cold = ensure_cold_table(catalog, settings, spec.name)
    view = view or spec.view

    def outside(table: Table) -> set[str]:
        if on_days is None or not spec.partition_by:
            return set()
        return {path for path, day in day_partitions(table, spec.partition_by[0][0]).items() if not on_days(day)}

    cold_src = _source(con, f"cold_{view}", cold, spec, exclude=outside(cold), reads=reads, stores=stores)
    con.execute(f'CREATE OR REPLACE VIEW "cold_{view}" AS SELECT * FROM {cold_src}')
    if spec.name == "raw_events":
        skipped = tiered_files(cold) | outside(hot)
        hot_src = _source(con, f"hot_{view}", hot, spec, exclude=skipped, reads=reads, stores=stores)
        con.execute(f'CREATE OR REPLACE VIEW "hot_{view}" AS SELECT * FROM {hot_src}')
    else:
        hot_src = _source(con, f"hot_{view}", hot, spec, exclude=outside(hot), reads=reads, stores=stores)
        con.execute(
            f'CREATE OR REPLACE VIEW "hot_{view}" AS SELECT * FROM {hot_src} AS h '
            f'ANTI JOIN (SELECT DISTINCT session_id FROM "cold_{view}") AS c USING (session_id)'
        )
    con.execute(
        f'CREATE OR REPLACE VIEW "{view}" AS SELECT * FROM "cold_{view}" UNION ALL BY NAME SELECT * FROM "hot_{view}"'
    )


def open_views(settings: Settings, catalog: Catalog | None = None, locked: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per trajlake table under its stable name.

    Tables with a cold tier (events, trajectories, steps) also get ``hot_*`` and
    ``cold_*`` views; their plain view spans both tiers.

    Args:
        settings: Where the lakehouse is; ``sql_memory_limit`` when ``locked``.
        catalog: An open catalog, or None to open the configured one.
        locked: Lock the connection for untrusted SQL (see :func:`lock_connection`).

    Returns:
        The connection; the caller closes it.
    """
    catalog = catalog or open_catalog(settings)
    con = connect()
    reads: set[str] = set()
    stores = object_stores(settings)
    # derived views read the others: created last
    for spec in sorted(TABLES.values(), key=lambda s: s.derived is not None):
        if spec.name in TIERED_TABLES:
            register_tiered(con, settings, catalog, spec, reads=reads, stores=stores)
        else:
            table = ensure_table(catalog, settings, spec.name)
            register_table(con, spec.view, table, spec, reads=reads, stores=stores)
    register_priced_trajectories(con, settings.prices)
    register_health_views(con, settings)
    if locked:
        lock_connection(con, reads, settings.sql_memory_limit)
    return con


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def lock_connection(con: duckdb.DuckDBPyConnection, readable: Iterable[str], memory_limit: str) -> None:
    """Lock ``con`` for untrusted SQL: it may open only the files in ``readable``.

    No other file, directory, URL or environment variable can be read or written
    (``enable_external_access = false`` with ``allowed_paths``), no extension installed
    or loaded, no Python variable scanned, nothing spilled to disk, and no setting
    changed afterwards (``lock_configuration``). Already registered Arrow tables
    (the pyiceberg-read sources) stay readable, and so do the listed ``s3://`` files
    through the object-store filesystem registered before locking (every other object is refused).

    Args:
        con: A connection whose views are all created.
        readable: The data files the views read.
        memory_limit: DuckDB ``memory_limit`` for the connection.
    """
    allowed = "[" + ", ".join(_sql_text(p) for p in sorted(readable)) + "]"
    # Order matters: once external access is off, temp_directory can no longer be set.
    for statement in (
        "SET temp_directory = ''",
        f"SET memory_limit = {_sql_text(memory_limit)}",
        f"SET allowed_paths = {allowed}",
        "SET allowed_directories = []",
        "SET autoinstall_known_extensions = false",
        "SET autoload_known_extensions = false",
        "SET allow_community_extensions = false",
        "SET python_enable_replacements = false",
        "SET enable_external_access = false",
        "SET lock_configuration = true",
    ):
        con.execute(statement)


def check_read_only(query: str, con: duckdb.DuckDBPyConnection | None = None) -> duckdb.Statement:
    """The one read-only statement in ``query``, as parsed by DuckDB.

    Allowed: one ``SELECT`` (DuckDB parses ``WITH``, ``VALUES``, ``FROM …``, ``DESCRIBE``,
    ``SHOW`` and ``SUMMARIZE`` as one), or a plain ``EXPLAIN`` of one — never
    ``EXPLAIN ANALYZE``, which runs its statement.

    Args:
        query: The user's SQL text.
        con: A connection to parse with (nothing runs on it); a new in-memory one by default.

    Returns:
        The statement to execute (so what runs is exactly what was checked).

    Raises:
        QueryError: not exactly one statement, or not a read-only one.
    """
    parser = con or duckdb.connect(":memory:")
    try:
        try:
            statements = parser.extract_statements(query)
        except duckdb.Error as exc:
            raise QueryError(f"cannot parse query: {str(exc).splitlines()[0]}") from exc
        if not statements:
            raise QueryError("empty query")
        if len(statements) > 1:
            raise QueryError(f"only one statement per query is allowed, got {len(statements)}")
        statement = statements[0]
        if statement.type == duckdb.StatementType.EXPLAIN:
            _check_explain(parser, statement.query)
        elif statement.type != duckdb.StatementType.SELECT:
            raise QueryError(f"only read-only queries are allowed, got a {statement.type.name} statement")
        else:
            _check_nodes(parser, statement.query)
        return statement
    finally:
        if con is None:
            parser.close()


def _check_explain(parser: duckdb.DuckDBPyConnection, text: str) -> None:
    """Accept ``EXPLAIN <one SELECT>``; refuse ``EXPLAIN ANALYZE``, options and anything else explained."""
    data = text.encode()  # the tokenizer's offsets are byte offsets
    spans = duckdb.tokenize(text)
    words = [
        (offset, data[offset : spans[i + 1][0] if i + 1 < len(spans) else len(data)].decode().strip().upper())
        for i, (offset, kind) in enumerate(spans)
        if kind != duckdb.token_type.comment
    ]
    if len(words) < 2 or words[0][1] != "EXPLAIN":
        raise QueryError("cannot parse the EXPLAIN statement")
    if words[1][1] in _ANALYZE:
        raise QueryError("EXPLAIN ANALYZE runs its statement and is not allowed; use EXPLAIN")
    try:
        inner = parser.extract_statements(data[words[1][0] :].decode())
    except duckdb.Error as exc:
        raise QueryError(f"only EXPLAIN of one SELECT is allowed ({str(exc).splitlines()[0]})") from exc
    if len(inner) != 1 or inner[0].type != duckdb.StatementType.SELECT:
        raise QueryError("only EXPLAIN of one SELECT is allowed")
    _check_nodes(parser, inner[0].query)


def _check_nodes(parser: duckdb.DuckDBPyConnection, text: str) -> None:
    """Refuse a SELECT whose syntax tree holds anything but reads (a ``COPY``/``DELETE``/… CTE)."""
    row = next(iter(parser.execute("SELECT json_serialize_sql(?)", [text]).fetchall()), None)
    tree: dict[str, Any] = json.loads(row[0]) if row else {"error": True}
    if tree.get("error") or len(tree.get("statements") or []) != 1:
        raise QueryError(f"cannot check the query: {tree.get('error_message', 'not one SELECT')}")
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, str) and kind.endswith("_NODE") and kind not in _READ_NODES:
                what = kind.removesuffix("_NODE").removesuffix("_QUERY")
                raise QueryError(f"only read-only queries are allowed, got a {what} inside")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _serve_query(sink: BatchSink, settings: Settings, query: str) -> None:
    """In the query's own process: open the locked views, check ``query``, stream its result to ``sink``."""
    con = open_views(settings, locked=True)
    sink.cap_memory()  # what the query text makes the process allocate is capped from here on
    statement = check_read_only(query, con)  # parsing on this connection saves opening another
    # A relation streams its result (``execute`` would materialise it first); it runs exactly
    # the statement that was checked. A DuckDB error ends the process and reaches the caller
    # as one line (out-of-memory as QueryMemoryExceeded).
    reader = con.sql(statement).to_arrow_reader(BATCH_ROWS)
    sink.schema(reader.schema)
    for batch in reader:
        sink.write(batch)


class QueryResult:
    """One query's result as it streams in: ``columns``, then :meth:`batches` or :meth:`rows`.

    A context manager (see :func:`stream_query`); leaving it stops the query if it still runs.
    """

    def __init__(self, stream: IsolatedStream) -> None:
        self._stream = stream
        self.columns: list[str] = []

    def __enter__(self) -> QueryResult:
        self._stream.start()
        self.columns = list(self._stream.schema.names) if self._stream.schema is not None else []
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The result's record batches as they arrive (raises as :func:`stream_query` says)."""
        return self._stream.batches()

    def rows(self) -> Iterator[list[tuple[Any, ...]]]:
        """The result's rows as Python values, one list per batch."""
        return chunked(self.batches())


def stream_query(settings: Settings, query: str) -> QueryResult:
    """Run one read-only query in its own process, under a deadline and a memory cap; stream its result.

    The process opens the locked views (:func:`open_views`), checks the statement
    (:func:`check_read_only`) and streams record batches back (:mod:`warehouse.isolation`).
    ``TRAJLAKE_SQL_TIMEOUT_S`` counts from before the process starts — opening the views,
    parsing and planning included — and covers reading the result too: when it passes, the
    process is killed. Its address space may grow by ``TRAJLAKE_SQL_MEMORY_LIMIT`` (DuckDB's
    own limit) plus ``TRAJLAKE_SQL_MEMORY_HEADROOM`` and no more.

    Use as ``with stream_query(settings, query) as result:`` then ``result.columns`` and
    ``result.batches()`` (or ``result.rows()``).

    Raises:
        QueryError: not read-only, refused by the lock, or DuckDB failed (one line naming the cause);
            its subclasses :class:`~warehouse.errors.QueryTimeout` (the deadline passed),
            :class:`~warehouse.errors.QueryMemoryExceeded` (over the memory limit or cap) and
            :class:`~warehouse.errors.QueryKilled` (the process died, most often at its memory cap).
    """
    limit = settings.sql_memory_limit.strip()
    stream = IsolatedStream(
        _serve_query,
        (settings, query),
        timeout_s=settings.sql_timeout_s,
        memory_bytes=byte_size(settings.sql_memory_limit) + byte_size(settings.sql_memory_headroom),
        timeout_hint=" (TRAJLAKE_SQL_TIMEOUT_S)",
        memory_hint=f" (TRAJLAKE_SQL_MEMORY_LIMIT={limit})",
        preload=["warehouse.sql"],
    )
    return QueryResult(stream)


def run_query(settings: Settings, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only query (as :func:`stream_query` does) and return its column names and all rows.

    The rows are held in this process: for a result of unknown size use :func:`stream_query`.

    Raises:
        QueryError: as :func:`stream_query`.
    """
    with stream_query(settings, query) as result:
        return result.columns, [row for rows in result.rows() for row in rows]
