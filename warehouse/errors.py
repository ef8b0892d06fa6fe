"""Errors of the warehouse layer."""

from __future__ import annotations

from common.errors import TerminalError, TrajlakeError, TransientError


class WarehouseError(TrajlakeError):
    """Base class of catalog and table errors."""


class UnknownTable(WarehouseError, TerminalError):
    """A table name that trajlake does not define."""


class QueryError(WarehouseError, TerminalError):
    """A SQL query was rejected (not read-only) or failed."""


class QueryTimeout(QueryError):
    """A query was still running at its deadline (``TRAJLAKE_SQL_TIMEOUT_S``) and was killed."""


class QueryMemoryExceeded(QueryError):
    """A query needed more memory than its limit (``TRAJLAKE_SQL_MEMORY_LIMIT``) or its process's cap."""


class QueryKilled(QueryError):
    """The process running a query died without reporting why (killed by a signal, most often its memory cap)."""


class CommitConflict(WarehouseError, TransientError):
    """An Iceberg commit lost a race with another writer after all retries."""


class LockBusy(WarehouseError, TransientError):
    """Another run of the same job held its lock for longer than we waited."""
