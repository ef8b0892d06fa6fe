"""The locked DuckDB connection untrusted SQL runs on: the statement check, the lock, the last views.

:func:`check_read_only` accepts exactly one read-only statement, parsed by DuckDB itself;
:func:`lock_connection` locks a connection before the text runs — it can open only the data files
its views read (``allowed_paths``), cannot install or load extensions or change settings.
:func:`finish_views` adds the views over the table views (priced ``trajectories``, ``costs``,
health), however the table views were made: through the catalog (:mod:`warehouse.sql`) or from
the view plan (:mod:`warehouse.view_plan`). The bottom of the SQL layer: it imports neither
pyiceberg nor the other SQL modules.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import duckdb

from common.settings import Settings
from warehouse.errors import QueryError
from warehouse.health import register_health_views
from warehouse.prices import register_priced_trajectories

#: Keywords that make an ``EXPLAIN`` run its statement.
_ANALYZE = {"ANALYZE", "ANALYSE"}

#: Query nodes a read-only query may contain. DuckDB also parses ``COPY … TO``, ``INSERT``,
#: ``UPDATE`` and ``DELETE`` as the body of a CTE inside a statement typed SELECT.
_READ_NODES = {"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"}


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


def finish_views(
    con: duckdb.DuckDBPyConnection, settings: Settings, readable: Iterable[str], locked: bool
) -> duckdb.DuckDBPyConnection:
    """Add the views over the table views (priced ``trajectories``, ``costs``, health) and lock ``con`` if asked.

    The last steps of opening the views, whichever way the table views were made: the price
    table and the health views depend on settings read at run time, never on the cached plan.
    """
    register_priced_trajectories(con, settings.prices)
    register_health_views(con, settings)
    if locked:
        lock_connection(con, readable, settings.sql_memory_limit)
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
