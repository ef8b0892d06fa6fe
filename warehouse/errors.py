"""Errors of the warehouse layer."""

from __future__ import annotations

from pipelines.errors import TerminalError


class WarehouseError(TerminalError):
    """Base class of catalog and table errors."""


class UnknownTable(WarehouseError):
    """A table name that trajlake does not define."""


class QueryError(WarehouseError):
    """A SQL query was rejected (not read-only) or failed."""
