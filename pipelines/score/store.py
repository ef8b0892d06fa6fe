"""Reading and writing the quality tables by session, the storage every stage shares.

Reads go through the DuckDB views, bounded by the days (and start times) the rows can be on, so
only those files are opened. Writes replace a set of sessions' rows in one Iceberg commit, retried
on conflicts: a delete restricted to the rows' day partitions and the files holding their keys,
and an append.
"""

from __future__ import annotations

import warnings
from datetime import date, datetime

import duckdb
import polars as pl
import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, In, IsNull, Or, Reference, literal
from pyiceberg.table import Table

from pipelines.score.predicates import day_terms, on_days, on_times
from quality.dedup import flat_band_keys
from warehouse.lakehouse import Lakehouse
from warehouse.sql import register_table
from warehouse.tables import TableSpec
from warehouse.transactions import retry_on_conflict, transaction

#: ``session_index`` positions of no session (:func:`index_positions`' schema).
NO_POSITIONS = pl.DataFrame(
    schema={
        "session_id": pl.Utf8,
        "family": pl.Utf8,
        "started_at": pl.Datetime("us", "UTC"),
        "day": pl.Date,
        "profile": pl.Utf8,
    }
)


# ---------------------------------------------------------------------------------------- reads


def lookup(
    con: duckdb.DuckDBPyConnection,
    columns: str,
    view: str,
    ids: pl.Series,
    days: list[date | None] | None,
    where: str = "TRUE",
    starts: pl.Series | None = None,
) -> pl.DataFrame:
    """``columns`` of the rows of ``view`` for the session ids ``ids``.

    ``days``: the rows can only be on these days, so only their files are read (a lookup by id
    alone reads every file's ids); None: anywhere. ``starts``: the rows' exact ``started_at``
    values, when known: only the files and row groups around them are read
    (:func:`~pipelines.score.predicates.on_times`). A ``started_at`` column comes back as UTC.
    """
    con.register("__lookup", pa.table({"session_id": ids.cast(pl.Utf8).to_arrow()}))
    within = "TRUE" if days is None else on_days(days)
    if starts is not None:
        within += f" AND {on_times(starts)}"
    try:
        rows = con.sql(
            f"SELECT {columns} FROM {view} "
            f"WHERE {within} AND session_id IN (SELECT session_id FROM __lookup) AND {where}"
        ).pl()
    finally:
        con.unregister("__lookup")
    if "started_at" in rows.columns:
        rows = rows.with_columns(pl.col("started_at").cast(pl.Datetime("us", "UTC")))
    return rows


def index_positions(con: duckdb.DuckDBPyConnection, sessions: pl.DataFrame, anywhere: bool = True) -> pl.DataFrame:
    """Where ``sessions`` (session_id, day) stood in the index before this run (family, started_at, day).

    ``anywhere``: also find the rows of sessions whose start moved to another day (a lookup over
    every day's session ids); else only ``sessions``' own days are read.
    """
    days = None if anywhere else sessions["day"].unique().to_list()
    columns = "session_id, family, started_at, day, coalesce(profile, 'unknown') AS profile"
    return lookup(con, columns, "session_index", sessions["session_id"], days)


def existing_keys(
    con: duckdb.DuckDBPyConnection,
    view: str,
    ids: pl.Series,
    days: list[date | None] | None = None,
    where: str = "TRUE",
) -> pl.DataFrame:
    """``session_id``, ``started_at`` of the rows of ``view`` for ``ids``: what a replace deletes (often nothing).

    ``days``: the rows can only be on these days (only their files are read); None: anywhere.
    """
    columns = "DISTINCT session_id, started_at::TIMESTAMPTZ AS started_at"
    return delete_keys(lookup(con, columns, view, ids, days, where))


def delete_keys(*frames: pl.DataFrame) -> pl.DataFrame:
    """``session_id``, ``started_at`` rows to delete: where the sessions are now and where they were."""
    parts = [f.select("session_id", pl.col("started_at").cast(pl.Datetime("us", "UTC"))) for f in frames if f.height]
    if not parts:
        return pl.DataFrame(schema={"session_id": pl.Utf8, "started_at": pl.Datetime("us", "UTC")})
    return pl.concat(parts).unique()


# ---------------------------------------------------------------------------------------- rows


def arrow_rows(frame: pl.DataFrame, spec: TableSpec, version: str, now: datetime) -> pa.Table:
    """``frame`` as rows of ``spec``'s table: its columns cast, ``scorer_version`` and ``scored_at`` filled in."""
    schema = spec.arrow_schema()
    extra: dict[str, object] = {"scorer_version": version, "scored_at": now}
    columns = []
    for f in schema:
        if f.name in frame.columns:
            columns.append(frame[f.name].to_arrow().cast(f.type))
        else:
            columns.append(pa.array([extra.get(f.name)] * frame.height, type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def band_rows(facts: pl.DataFrame) -> pl.DataFrame:
    """``band_keys`` rows of ``facts`` (session_key, started_at, bands): one per session and band."""
    rows = facts.select(
        "session_key", "started_at", "bands", pl.int_ranges(1, pl.col("bands").list.len() + 1).alias("band")
    ).explode("bands", "band")
    rows = rows.filter(pl.col("bands").is_not_null())
    mixed = flat_band_keys(rows["bands"].to_numpy(), rows["band"].to_numpy())
    return rows.select(pl.Series("band_key", mixed, pl.Int64), "session_key", "started_at")


# ---------------------------------------------------------------------------------------- writes


def replace_sessions(
    table: Table,
    rows: pa.Table,
    keys: pl.DataFrame,
    by: str = "session_id",
    extra: BooleanExpression | None = None,
) -> None:
    """Delete the rows of the sessions in ``keys`` (``by``, started_at; and ``extra``), append ``rows``: one commit."""
    if keys.height == 0:
        delete_and_append(table, rows, None)
        return
    ids = keys[by].unique().to_list()
    predicate: BooleanExpression = And(
        In(term=Reference(by), literals={literal(v) for v in ids}),
        day_terms("started_at", keys["started_at"].to_list()),
    )
    if extra is not None:
        predicate = And(predicate, extra)
    delete_and_append(table, rows, predicate, (by, ids))


def replace_days(table: Table, rows: pa.Table, days: list[date | None]) -> None:
    """Replace every row of ``table`` (keyed by ``day``) on ``days``."""
    listed = [d.isoformat() for d in days if d is not None]
    terms: list[BooleanExpression] = (
        [In(term=Reference("day"), literals={literal(v) for v in listed})] if listed else []
    )
    if None in days:
        terms.append(IsNull(term=Reference("day")))
    predicate = None if not terms else (terms[0] if len(terms) == 1 else Or(*terms))
    delete_and_append(table, rows, predicate)


def clear_table(table: Table) -> None:
    """Delete every row of ``table``."""
    delete_and_append(table, None, AlwaysTrue())


def delete_and_append(
    table: Table,
    rows: pa.Table | None,
    predicate: BooleanExpression | None,
    keyed: tuple[str, list[object]] | None = None,
) -> None:
    """Delete the rows matching ``predicate`` (None: none) and append ``rows``, retried on conflicts.

    ``keyed``: (column, values) that ``predicate`` restricts the rows to: only the files holding one
    of the values are rewritten (:meth:`warehouse.transactions.Transaction.replace_rows`).

    Raises:
        CommitConflict: the commit kept losing to concurrent ones for every retry.
    """
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        if attempts:
            table.refresh()  # compaction (``trajlake maintain``) may have rewritten the files meanwhile
        attempts += 1
        has_rows = rows is not None and rows.num_rows > 0
        if not has_rows and (predicate is None or table.current_snapshot() is None):
            return
        with transaction(table) as tx, warnings.catch_warnings():
            # pyiceberg warns when a delete matches nothing (a new session, a day without duplicates)
            warnings.filterwarnings("ignore", "Delete operation did not match any records")
            if keyed is not None and predicate is not None:
                tx.replace_rows(predicate, keyed[0], keyed[1], rows)
                return
            if predicate is not None and table.current_snapshot() is not None:
                tx.delete(predicate)
            if has_rows:
                tx.append(rows)

    retry_on_conflict(f"update {table.name()[-1]}", attempt)


def refresh_view(con: duckdb.DuckDBPyConnection, lake: Lakehouse, spec: TableSpec) -> None:
    """Point ``spec``'s view on ``con`` at the table's current snapshot (after this run wrote it)."""
    register_table(con, spec.view, lake.table(spec.name), spec)
