"""DuckDB over the lakehouse: one view per table under its stable name, read-only.

Views: ``events``, ``dead_letters``, ``trajectories``, ``steps`` and every other
registered table (``scores``, ``flags``, ``duplicates``, ``exports``, …). Each
view reads the Parquet files of the table's current Iceberg snapshot, planned
by pyiceberg; a view over a table with no rows still has the full schema.
``events``, ``trajectories`` and ``steps`` span the hot and cold tiers; ``hot_*``
and ``cold_*`` views query one tier.

:func:`warehouse.query.stream_query` (and ``run_query``, which collects its rows) runs text it does
not trust (``trajlake sql``) on views locked with :func:`lock_connection` (both re-exported here
from :mod:`warehouse.sql_lock`, with :func:`check_read_only`).
:func:`open_views` can record the views it makes as a plan (:mod:`warehouse.view_plan`), from which
the next query opens them without the catalog while no table has moved on.
Cold tables on ``s3://`` are read in place too (``warehouse.object_store``): a query fetches
the footers and row groups it needs, never the whole table.
:func:`open_views` without ``locked`` is for trusted internal callers (scoring, export, Dagster).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Protocol

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from common.settings import Settings
from warehouse.catalog import open_catalog
from warehouse.cold import TIERED_TABLES, ensure_cold_table, tiered_files
from warehouse.files import local_path, object_store, object_stores, parquet_source
from warehouse.object_store import ObjectStores, is_object_store_path
from warehouse.snapshots import current_files, day_partitions, live_files
from warehouse.sql_lock import check_read_only as check_read_only
from warehouse.sql_lock import connect as connect
from warehouse.sql_lock import finish_views
from warehouse.sql_lock import lock_connection as lock_connection
from warehouse.sql_output import format_rows as format_rows  # for callers that render materialised rows
from warehouse.tables import TABLES, TableSpec, ensure_table
from warehouse.view_plan import ViewPlan
from warehouse.view_plan import save_plan as _save_plan
from warehouse.view_plan import view as _view


class TableSource(Protocol):
    """Where the views' tables come from: a :class:`warehouse.lakehouse.Lakehouse`, whose tables exist."""

    def table(self, name: str) -> Table:
        """The hot table ``name``, current."""
        ...

    def cold_table(self, name: str) -> Table:
        """The cold tier's table ``name``, current."""
        ...


class _Ensured:
    """The tables of ``catalog``, created or evolved on the way (views opened without a lakehouse)."""

    def __init__(self, catalog: Catalog, settings: Settings) -> None:
        self.catalog, self.settings = catalog, settings

    def table(self, name: str) -> Table:
        return ensure_table(self.catalog, self.settings, name)

    def cold_table(self, name: str) -> Table:
        return ensure_cold_table(self.catalog, self.settings, name)


def _source(
    con: duckdb.DuckDBPyConnection,
    name: str,
    table: Table,
    spec: TableSpec,
    exclude: frozenset[str] | set[str] = frozenset(),
    reads: set[str] | None = None,
    stores: ObjectStores | None = None,
    plan: ViewPlan | None = None,
) -> str:
    """SQL table expression over ``table``'s current rows, skipping the data files in ``exclude``.

    Parquet files without deletes are read by DuckDB where they lie (their paths are added
    to ``reads``): local files directly, ``s3://`` files through the connection's
    :class:`~warehouse.object_store_fs.ObjectStoreFS` (``stores``, registered on first use), so
    DuckDB fetches only the footers and row groups a query needs. Anything else (delete
    files, other schemes) is read through pyiceberg, into a registered Arrow table.
    ``plan`` records the source (only Parquet files read where they lie can be replayed).
    """
    empty_name = f"__empty_{name}"
    con.register(empty_name, pa.Table.from_pylist([], schema=spec.arrow_schema()))
    if plan is not None:
        plan.empty.append(empty_name)
    files = current_files(table)
    paths = [p for p in files.paths if p not in exclude]
    if not paths:
        return f'(SELECT * FROM "{empty_name}")'
    remote = all(is_object_store_path(p) for p in paths)
    if plan is not None and (remote or files.has_deletes or not all(p.startswith(("file://", "/")) for p in paths)):
        plan.cacheable = False
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
    plan: ViewPlan | None = None,
) -> None:
    """Create view ``name`` over ``table``'s current snapshot; the files it reads go into ``reads``.

    A table whose spec has a ``derived`` query gets two: ``<name>_stored``, its rows, and ``name``,
    the query over them (and the views it reads, created before). ``stores`` holds the
    connection's object-store filesystem across calls (see :func:`_source`); ``plan`` records
    the table's metadata file and the views.
    """
    if plan is not None:
        plan.read_table(table.name(), table.metadata_location)
    source = _source(con, name, table, spec, reads=reads, stores=stores, plan=plan)
    if spec.derived is None:
        _view(con, f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM {source}', plan)
        return
    _view(con, f'CREATE OR REPLACE VIEW "{name}_stored" AS SELECT * FROM {source}', plan)
    _view(con, f'CREATE OR REPLACE VIEW "{name}" AS {spec.derived.format(stored=f"{name}_stored")}', plan)


def register_tiered(
    con: duckdb.DuckDBPyConnection,
    tables: TableSource,
    spec: TableSpec,
    reads: set[str] | None = None,
    stores: ObjectStores | None = None,
    view: str | None = None,
    on_days: Callable[[date | None], bool] | None = None,
    plan: ViewPlan | None = None,
) -> None:
    """Views ``hot_<view>``, ``cold_<view>`` and their union ``<view>``, which counts every row once.

    A crash mid-tiering can leave rows in both tiers (see :mod:`warehouse.tiering`):
    raw events are excluded from hot by the cold table's list of copied hot files,
    trajectories and steps by session (the cold copy wins). So ``hot_<view>`` is the
    hot rows not already in cold, and ``hot_<view>`` ∪ ``cold_<view>`` = ``<view>``.
    ``tables``: the lakehouse (or what stands for it) the hot and cold tables are loaded from. The data
    files the views read directly go into ``reads``; ``stores`` as for :func:`register_table`.

    ``view``: the views' name (default: the spec's). ``on_days``: only the files of the day
    partitions (None: NULL) it accepts are read, in both tiers — DuckDB then opens no other file,
    where a filter on the partition column still reads every file's footer to skip it. A
    session's copies in the two tiers are of the same day, so the union still counts it once.
    ``plan`` records both tables' metadata files and the views.
    """
    hot = tables.table(spec.name)
    cold = tables.cold_table(spec.name)
    name = view or spec.view
    if plan is not None:
        plan.read_table(hot.name(), hot.metadata_location)
        plan.read_table(cold.name(), cold.metadata_location)

    def outside(table: Table) -> set[str]:
        if on_days is None or not spec.partition_by:
            return set()
        return {path for path, day in day_partitions(table, spec.partition_by[0][0]).items() if not on_days(day)}

    cold_src = _source(con, f"cold_{name}", cold, spec, exclude=outside(cold), reads=reads, stores=stores, plan=plan)
    _view(con, f'CREATE OR REPLACE VIEW "cold_{name}" AS SELECT * FROM {cold_src}', plan)
    if spec.name == "raw_events":
        skipped = tiered_files(cold) | outside(hot)
        hot_src = _source(con, f"hot_{name}", hot, spec, exclude=skipped, reads=reads, stores=stores, plan=plan)
        _view(con, f'CREATE OR REPLACE VIEW "hot_{name}" AS SELECT * FROM {hot_src}', plan)
    else:
        hot_src = _source(con, f"hot_{name}", hot, spec, exclude=outside(hot), reads=reads, stores=stores, plan=plan)
        _view(
            con,
            f'CREATE OR REPLACE VIEW "hot_{name}" AS SELECT * FROM {hot_src} AS h '
            f'ANTI JOIN (SELECT DISTINCT session_id FROM "cold_{name}") AS c USING (session_id)',
            plan,
        )
    _view(
        con,
        f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM "cold_{name}" UNION ALL BY NAME SELECT * FROM "hot_{name}"',
        plan,
    )


def open_views(
    settings: Settings,
    catalog: Catalog | None = None,
    locked: bool = False,
    save_plan: bool = False,
    tables: TableSource | None = None,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per trajlake table under its stable name.

    Tables with a cold tier (events, trajectories, steps) also get ``hot_*`` and
    ``cold_*`` views; their plain view spans both tiers.

    Args:
        settings: Where the lakehouse is; ``sql_memory_limit`` when ``locked``.
        catalog: An open catalog, or None to open the configured one (unused with ``tables``).
        locked: Lock the connection for untrusted SQL (see :func:`lock_connection`).
        save_plan: Save the views as the lakehouse's view plan (:mod:`warehouse.view_plan`),
            from which the next query opens them without the catalog while it is current.
        tables: The lakehouse the tables come from (:meth:`warehouse.lakehouse.Lakehouse.views` passes
            itself); None: the tables of ``catalog``, created or evolved as they are met.

    Returns:
        The connection; the caller closes it.
    """
    tables = tables or _Ensured(catalog or open_catalog(settings), settings)
    con = connect()
    plan = ViewPlan()
    stores = object_stores(settings)
    # derived views read the others: created last
    for spec in sorted(TABLES.values(), key=lambda s: s.derived is not None):
        if spec.name in TIERED_TABLES:
            register_tiered(con, tables, spec, reads=plan.reads, stores=stores, plan=plan)
        else:
            table = tables.table(spec.name)
            register_table(con, spec.view, table, spec, reads=plan.reads, stores=stores, plan=plan)
    if save_plan:
        _save_plan(settings, plan, con)
    return finish_views(con, settings, plan.reads, locked)
