"""Parquet on object storage read in place by DuckDB: an fsspec filesystem over pyarrow's S3 client.

DuckDB's own ``httpfs`` extension is downloaded from DuckDB's extension repository, which a
deployment may not reach (and the locked connection of :func:`warehouse.sql.lock_connection`
may load no extension). So ``s3://`` data files are read through a Python filesystem that DuckDB
calls for byte ranges: a query reads the footers it needs and the row groups its filters keep,
never a whole table. The S3 client is pyarrow's, configured exactly as pyiceberg's FileIO
(the catalog's ``s3.*`` properties), falling back to the standard AWS environment
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_REGION`` or
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for S3-compatible servers).

Iceberg data files are immutable and their sizes are in the table metadata, so the filesystem
answers size, existence and modification time of the planned files itself: no ``HEAD`` request
per file per query, and DuckDB's Parquet metadata cache stays valid for the connection's life.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import duckdb
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.spec import AbstractBufferedFile
from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO

#: URI schemes served by :class:`ObjectStoreFS` (the ones pyiceberg's S3 FileIO handles).
S3_SCHEMES = ("s3://", "s3a://", "s3n://")
#: Modification time reported for the planned (immutable) files.
_IMMUTABLE_MTIME = datetime(2000, 1, 1, tzinfo=UTC)


def is_object_store_path(path: str) -> bool:
    """Whether ``path`` is on S3 (read through :class:`ObjectStoreFS`)."""
    return path.startswith(S3_SCHEMES)


def s3_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """FileIO properties with the AWS environment filled in where the catalog says nothing.

    pyarrow's S3 client already reads the credentials from the environment; the region and the
    endpoint of an S3-compatible server are added here so both clients agree.
    """
    props = dict(properties)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "s3.endpoint" not in props:
        props["s3.endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region and "s3.region" not in props and "client.region" not in props:
        props["s3.region"] = region
    return props


class _RangeFile(AbstractBufferedFile):
    """A read-only file of known size whose reads are ranged GETs on the filesystem's shared S3 handle."""

    def __init__(self, fs: ObjectStoreFS, path: str, size: int) -> None:
        super().__init__(fs, path, mode="rb", block_size=0, cache_type="none", size=size)

    def _fetch_range(self, start: int, end: int) -> bytes:
        data: bytes = self.fs.input_file(self.path).read_at(end - start, start)
        return data


class ObjectStoreFS(ArrowFSWrapper):
    """fsspec ``s3`` filesystem for DuckDB over pyarrow's S3 client, knowing the planned files' sizes.

    Args:
        properties: pyiceberg FileIO properties of the tables (``s3.endpoint``, ``s3.region``, …).
    """

    protocol = "s3"

    def __init__(self, properties: Mapping[str, str]) -> None:
        self._io = PyArrowFileIO(s3_properties(properties))
        self._sizes: dict[str, int] = {}
        self._handles: dict[str, Any] = {}
        self._open_lock = threading.Lock()
        super().__init__(self.arrow_fs("s3://"))

    def input_file(self, key: str) -> Any:
        """pyarrow's random-access S3 file of ``key``, opened once (its ``HEAD``) and shared by every open.

        ``read_at`` is safe from several threads, and DuckDB opens a file once per scanning thread.
        """
        with self._open_lock:
            handle = self._handles.get(key)
            if handle is None:
                handle = self._handles[key] = self.arrow_fs(key).open_input_file(key)
        return handle

    def arrow_fs(self, path: str) -> pafs.FileSystem:
        """pyarrow's S3 filesystem for the bucket of ``path`` (cached by pyiceberg per bucket)."""
        bucket = path.split("://", 1)[-1].split("/", 1)[0] or None
        return self._io.fs_by_scheme("s3", bucket)

    def add_files(self, sizes: Mapping[str, int]) -> None:
        """Record planned data files (URI → size in bytes) that DuckDB will read."""
        self._sizes.update({self._strip_protocol(uri): size for uri, size in sizes.items()})

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        key = self._strip_protocol(path)
        if key in self._sizes:
            return {"name": key, "size": self._sizes[key], "type": "file"}
        result: dict[str, Any] = super().info(path, **kwargs)
        return result

    def exists(self, path: str, **kwargs: Any) -> bool:
        return self._strip_protocol(path) in self._sizes or bool(super().exists(path, **kwargs))

    def modified(self, path: str) -> datetime:
        if self._strip_protocol(path) in self._sizes:
            return _IMMUTABLE_MTIME
        result: datetime = super().modified(path)
        return result

    def _open(
        self, path: str, mode: str = "rb", block_size: int | None = None, seekable: bool = True, **kwargs: Any
    ) -> Any:
        key = self._strip_protocol(path)
        if mode == "rb" and key in self._sizes:
            return _RangeFile(self, key, self._sizes[key])
        return super()._open(path, mode, block_size, seekable, **kwargs)


def register_object_store(con: duckdb.DuckDBPyConnection, properties: Mapping[str, str]) -> ObjectStoreFS:
    """A new :class:`ObjectStoreFS` registered on ``con`` (one per connection: DuckDB keys them by protocol)."""
    store = ObjectStoreFS(properties)
    con.register_filesystem(store)
    return store
