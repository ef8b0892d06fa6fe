"""Running untrusted SQL over the lakehouse's views: the statement check, the lock, the query process.

:func:`stream_query` (and :func:`run_query`, which collects its rows) runs text it does not trust
(``trajlake sql``): exactly one read-only statement, parsed by DuckDB itself, on a connection that
is locked before the text runs — it can open only the data files its views read (``allowed_paths``),
cannot install or load extensions or change settings — in a process of its own that is killed at
``TRAJLAKE_SQL_TIMEOUT_S`` (planning included) and whose memory is capped (:mod:`warehouse.isolation`);
the result streams back in record batches.

The query process opens the views from the cached view plan when the catalog still points where
the plan was made (:mod:`warehouse.view_plan`), else through the catalog (:func:`warehouse.sql.open_views`,
which refreshes the plan). This module imports neither pyiceberg nor the catalog stack: a command
that runs a query loads them only when the plan is missing or out of date, and then only in the
query's process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa

from common.settings import Settings, byte_size
from warehouse.isolation import BatchSink, IsolatedStream
from warehouse.sql_lock import check_read_only
from warehouse.sql_output import chunked
from warehouse.view_plan import open_planned_views

#: Rows per record batch a query streams (the DuckDB vector size times two): small enough that
#: neither process holds much of a wide result at once.
BATCH_ROWS = 4096


def _open_locked_views(settings: Settings) -> duckdb.DuckDBPyConnection:
    """The locked views: from the cached plan when it is current, else through the catalog (refreshing it)."""
    con = open_planned_views(settings)
    if con is not None:
        return con
    from warehouse.sql import open_views  # the catalog stack: only when the plan cannot be used

    return open_views(settings, locked=True, save_plan=True)


def _serve_query(sink: BatchSink, settings: Settings, query: str) -> None:
    """In the query's own process: open the locked views, check ``query``, stream its result to ``sink``."""
    con = _open_locked_views(settings)
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

    The process opens the locked views (:func:`warehouse.sql.open_views`, or their cached plan), checks the statement
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
