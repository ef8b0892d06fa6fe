"""The data files of Iceberg tables as DuckDB reads them: paths, ``read_parquet`` sources, object stores.

The lowest piece of the SQL layer, shared by the views (:mod:`warehouse.sql`) and by tiering
(:mod:`warehouse.tiering`), which both read data files where they lie: local files directly,
``s3://`` files through a connection's :class:`~warehouse.object_store_fs.ObjectStoreFS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import duckdb
from pyiceberg.table import Table

from common.settings import Settings
from warehouse.object_store import ObjectStores, footer_cache, is_object_store_path
from warehouse.snapshots import current_files, live_files

if TYPE_CHECKING:
    from warehouse.object_store_fs import ObjectStoreFS


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


def object_stores(settings: Settings) -> ObjectStores:
    """A connection's object stores with the configured footer cache (``TRAJLAKE_FOOTER_CACHE_*``)."""
    return ObjectStores(footer_cache(settings.footer_cache_path, settings.footer_cache_bytes))


def object_store(con: duckdb.DuckDBPyConnection, table: Table, stores: ObjectStores | None) -> ObjectStoreFS:
    """The connection's ``s3`` filesystem (kept in ``stores``), configured like ``table``'s FileIO."""
    if stores is not None and stores.s3 is not None:
        return stores.s3
    if "s3" in con.list_filesystems():  # a caller without ``stores`` registered one before
        con.unregister_filesystem("s3")
    from warehouse.object_store_fs import register_object_store  # fsspec only where the object store is read

    store = register_object_store(con, table.io.properties, stores.cache if stores is not None else None)
    # DuckDB's in-memory cache of remote files fetches whole files of up to 2 MiB through a Python
    # filesystem: a session lookup read 30 MB of a 10M-event cold tier with it, 1.6 MB without.
    con.execute("SET enable_external_file_cache = false")
    if stores is not None:
        stores.s3 = store
    return store


def readable_files(con: duckdb.DuckDBPyConnection, table: Table, stores: ObjectStores | None = None) -> list[str]:
    """The current data files of ``table``, readable on ``con`` with :func:`parquet_source` where they lie.

    ``s3://`` files are served by the connection's object-store filesystem (registered on first use).
    """
    files = current_files(table)
    if files.paths and all(is_object_store_path(p) for p in files.paths):
        object_store(con, table, stores).add_files({e.path: e.data_file.file_size_in_bytes for e in live_files(table)})
    return files.paths
