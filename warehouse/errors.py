"""Errors of the warehouse layer."""

from __future__ import annotations

from common.errors import TerminalError, TrajlakeError, TransientError


class WarehouseError(TrajlakeError):
    """Base class of catalog and table errors."""


class UnknownTable(WarehouseError, TerminalError):
    """A table name that trajlake does not define."""


class QueryError(WarehouseError, TerminalError):
    """A SQL query was rejected (not read-only) or failed."""


class CommitConflict(WarehouseError, TransientError):
    """An Iceberg commit lost a race with another writer after all retries."""


class LockBusy(WarehouseError, TransientError):
    """Another run of the same job held its lock for longer than we waited."""
