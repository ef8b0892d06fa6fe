"""Iceberg transactions whose staged metadata is built once per change, not once per look.

pyiceberg's ``Transaction.table_metadata`` re-applies every staged update to the table's
metadata and deep-copies the result each time it is read, and one append reads it about
twenty times (schema checks, partition spec, the snapshot producer, the manifest writer).
The copy covers every schema, snapshot and log entry of the table, so with the wide
``raw_events`` schema an append spent ~0.3 s copying — about half of an ingest commit —
and the cost grew with the table's history. Pydantic metadata models are frozen, so the
staged metadata can be shared between readers until the next update is staged.
"""

from __future__ import annotations

from pyiceberg.table import Table, TableMetadata
from pyiceberg.table import Transaction as _Transaction
from pyiceberg.table.update import update_table_metadata


class Transaction(_Transaction):
    """A pyiceberg transaction that caches its staged metadata until the next staged update."""

    _staged: tuple[object, object, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        # Keyed on identity: staging replaces the ``_updates`` tuple, a commit replaces the
        # table's metadata object; either one invalidates the cached copy.
        base, updates = self._table.metadata, self._updates
        staged = self._staged
        if staged is None or staged[0] is not base or staged[1] is not updates:
            staged = (base, updates, update_table_metadata(base, updates))
            self._staged = staged
        return staged[2]


def transaction(table: Table) -> Transaction:
    """Start a transaction on ``table`` (use as a context manager; it commits on exit)."""
    return Transaction(table)
