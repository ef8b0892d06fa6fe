"""The fsspec filesystem DuckDB reads ``s3://`` Parquet through (see :mod:`warehouse.object_store`).

A module of its own so that fsspec is imported only by a process that reads the object store: a
query over local tiers (``trajlake sql`` on the default set-up) does not pay for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.spec import AbstractBufferedFile
from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO

from warehouse.object_store import _FETCHED, _FETCHED_LOCK, _IMMUTABLE_MTIME, FooterCache, s3_properties


class _RangeFile(AbstractBufferedFile):
    """A read-only file of known size: its tail from the footer cache, other reads ranged GETs on a shared handle."""

    def __init__(self, fs: ObjectStoreFS, path: str, size: int) -> None:
        super().__init__(fs, path, mode="rb", block_size=0, cache_type="none", size=size)

    def _fetch_range(self, start: int, end: int) -> bytes:
        fs: ObjectStoreFS = self.fs
        tail = fs.tail(self.path, self.size, load=end >= self.size - 8)
        if tail is not None and start >= tail[0]:
            try:
                with open(tail[1], "rb") as cached:
                    cached_bytes = os.pread(cached.fileno(), end - start, start - tail[0])
                if len(cached_bytes) == end - start:
                    return cached_bytes
            except OSError:
                pass
            fs.forget_tail(self.path)  # evicted meanwhile (another process's cache is the same directory)
        return fs.read_at(self.path, end - start, start)


class ObjectStoreFS(ArrowFSWrapper):
    """fsspec ``s3`` filesystem for DuckDB over pyarrow's S3 client, knowing the planned files' sizes.

    Args:
        properties: pyiceberg FileIO properties of the tables (``s3.endpoint``, ``s3.region``, …).
    """

    protocol = "s3"

    def __init__(self, properties: Mapping[str, str], cache: FooterCache | None = None) -> None:
        self._io = PyArrowFileIO(s3_properties(properties))
        self._sizes: dict[str, int] = {}
        self._handles: dict[str, Any] = {}
        self._tails: dict[str, tuple[int, Path] | None] = {}
        self._cache = cache
        self._open_lock = threading.Lock()
        self._tail_lock = threading.Lock()
        self._tail_locks: dict[str, threading.Lock] = {}
        super().__init__(self.arrow_fs("s3://"))

    def forget_tail(self, key: str) -> None:
        """Stop serving ``key``'s tail from the cache (its entry went): later reads go to the store."""
        self._tails[key] = None

    def tail(self, key: str, size: int, load: bool) -> tuple[int, Path] | None:
        """The cached tail of ``key`` as ``(offset, local file)``; fetched into the cache first when ``load``."""
        if self._cache is None:
            return None
        if key in self._tails:
            return self._tails[key]
        with self._tail_lock:  # one lock per file: other files' footers are fetched meanwhile
            lock = self._tail_locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._tails:
                return self._tails[key]
            uri = f"s3://{key}"
            found = self._cache.lookup(uri, size)
            if found is None and not load:
                return None  # a data read before any footer read: nothing to fill from yet
            if found is None:
                found = self._cache.fill(uri, size, lambda n, offset: self.read_at(key, n, offset))
            self._tails[key] = found
            return found

    def read_at(self, key: str, nbytes: int, offset: int) -> bytes:
        """One ranged GET of ``key`` (counted in :func:`fetched`)."""
        data: bytes = self.input_file(key).read_at(nbytes, offset)
        with _FETCHED_LOCK:
            _FETCHED[0] += 1
            _FETCHED[1] += len(data)
        return data

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


def register_object_store(
    con: duckdb.DuckDBPyConnection, properties: Mapping[str, str], cache: FooterCache | None = None
) -> ObjectStoreFS:
    """A new :class:`ObjectStoreFS` registered on ``con`` (one per connection: DuckDB keys them by protocol)."""
    store = ObjectStoreFS(properties, cache)
    con.register_filesystem(store)
    return store
