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

That cache dies with the connection, and every ``trajlake sql`` is a new process: before it can
prune a single row group DuckDB reads the footer of every file of the views (two ranged GETs per
file; 120 KB each for the cold ``raw_events``, 127 columns). A :class:`FooterCache` keeps each
file's tail — everything after its last column chunk: Bloom filters, page indexes, the footer — on
local disk, keyed by URI and size (data files are never rewritten in place and their names are
unique), so a query in a new process asks the store only for the row groups it reads.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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


#: Bytes of a file's end fetched at once on a cache miss (most footers fit; a larger one takes a second GET).
_FIRST_TAIL_BYTES = 256 << 10
#: A tail longer than this (huge page indexes or Bloom filters) is cached from the footer on only.
_MAX_TAIL_BYTES = 16 << 20
#: A cached tail starts at a multiple of this: DuckDB reads in aligned blocks, so the block holding
#: a footer's first byte starts before it.
_TAIL_ALIGN = 64 << 10
_MAGIC = b"PAR1"
#: Ranged GETs of data files this process made, and their bytes (see :func:`fetched`).
_FETCHED = [0, 0]
_FETCHED_LOCK = threading.Lock()


def fetched() -> tuple[int, int]:
    """Ranged GETs of object-store data files made by this process so far, and the bytes they returned."""
    with _FETCHED_LOCK:
        return _FETCHED[0], _FETCHED[1]


def _metadata_start(footer: bytes, footer_start: int) -> int:
    """Offset where a Parquet file's data ends: after its last column chunk (``footer`` = footer + length + magic).

    What follows it — Bloom filters, column and offset indexes, the footer — is metadata, written
    after every row group by both Arrow's and parquet-mr's writers. ``footer_start`` if unknown.
    """
    try:
        meta = pq.read_metadata(pa.BufferReader(_MAGIC + footer))
    except (pa.ArrowException, OSError):
        return footer_start
    end = 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            offsets = [o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o]
            if offsets:
                end = max(end, min(offsets) + chunk.total_compressed_size)
    return end if 0 < end <= footer_start else footer_start


class FooterCache:
    """The tails of immutable Parquet files on object storage, on local disk, shared by every process.

    An entry is the bytes from a file's end of data (see :func:`_metadata_start`) to its end, in a
    file named by a digest of the URI and size; it is written atomically (temporary file, rename),
    so concurrent processes see a whole entry or none. Past ``limit_bytes`` the least recently used
    entries go. A file that does not end like Parquet is not cached.

    Args:
        directory: Where the entries live (created owner-only).
        limit_bytes: Disk the entries may take.
    """

    def __init__(self, directory: Path, limit_bytes: int) -> None:
        self.directory = directory
        self.limit_bytes = limit_bytes
        self._total: int | None = None  # bytes of all entries, learnt from the disk at the first fill
        self._lock = threading.Lock()

    def _entry(self, uri: str, size: int) -> Path:
        digest = hashlib.sha256(f"{uri}\0{size}".encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.tail"

    def lookup(self, uri: str, size: int) -> tuple[int, Path] | None:
        """``(offset, entry)`` of the cached tail of ``uri``, or None."""
        entry = self._entry(uri, size)
        try:
            length = entry.stat().st_size
        except OSError:
            return None
        if not 0 < length <= size:
            return None
        try:
            os.utime(entry)  # recency, for eviction
        except OSError:
            pass
        return size - length, entry

    def fill(self, uri: str, size: int, read_at: Any) -> tuple[int, Path] | None:
        """Fetch the tail of ``uri`` with ``read_at(nbytes, offset)`` and keep it; None if it is not Parquet."""
        first = min(size, _FIRST_TAIL_BYTES)
        start = size - first
        data = bytes(read_at(first, start))
        if len(data) < 12 or data[-4:] != _MAGIC:
            return None
        footer_length = struct.unpack("<I", data[-8:-4])[0]
        footer_start = size - 8 - footer_length
        if footer_start < 4:
            return None
        if footer_start < start:
            data = bytes(read_at(start - footer_start, footer_start)) + data
            start = footer_start
        begin = _metadata_start(data[footer_start - start :], footer_start) // _TAIL_ALIGN * _TAIL_ALIGN
        if begin < start:
            if start - begin <= _MAX_TAIL_BYTES:
                data = bytes(read_at(start - begin, begin)) + data
                start = begin
        else:
            data, start = data[begin - start :], begin
        entry = self._entry(uri, size)
        temporary: str | None = None
        try:
            entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=entry.parent, prefix=".tmp-", delete=False) as out:
                temporary = out.name
                out.write(data)
            os.replace(temporary, entry)
        except OSError:
            if temporary is not None:
                Path(temporary).unlink(missing_ok=True)
            return None  # a full or read-only disk costs speed, not correctness
        self._account(len(data))
        return start, entry

    def _entries(self) -> list[tuple[float, int, Path]]:
        found = []
        for path in self.directory.glob("*/*.tail"):
            try:
                stat = path.stat()
            except OSError:
                continue  # evicted by another process meanwhile
            found.append((stat.st_mtime, stat.st_size, path))
        return found

    def _account(self, written: int) -> None:
        with self._lock:
            if self._total is None:
                self._total = sum(size for _, size, _ in self._entries())  # other processes' entries too
            else:
                self._total += written
            if self._total <= self.limit_bytes:
                return
            self._total = self.evict()

    def evict(self) -> int:
        """Remove the least recently used entries until at most 80 % of ``limit_bytes`` is taken; returns the rest."""
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.limit_bytes * 0.8:
                break
            path.unlink(missing_ok=True)
            total -= size
        return total


class ObjectStores:
    """The object-store filesystem of one DuckDB connection (registered on first use) and its footer cache.

    The filesystem itself (:class:`warehouse.object_store_fs.ObjectStoreFS`) is built by
    ``warehouse.object_store_fs.register_object_store``.
    """

    def __init__(self, cache: FooterCache | None = None) -> None:
        self.cache = cache
        # its warehouse.object_store_fs.ObjectStoreFS once registered (not imported here: that module imports this one)
        self.s3: Any = None


def footer_cache(directory: Path, limit_bytes: int) -> FooterCache | None:
    """The footer cache at ``directory``, or None when ``limit_bytes`` is 0 (turned off)."""
    return FooterCache(directory, limit_bytes) if limit_bytes > 0 else None
