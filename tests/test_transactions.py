"""The cached Iceberg transaction stages exactly what pyiceberg's does, computing it once per change."""

from __future__ import annotations

import pyiceberg.table
import pytest

import warehouse.transactions as transactions
from pipelines.settings import Settings
from tests.helpers import raw_rows
from warehouse.catalog import open_catalog
from warehouse.tables import RAW_EVENTS, ensure_table
from warehouse.transactions import transaction


def test_staged_metadata_follows_every_update_and_is_built_once_per_change(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    built = []
    real = transactions.update_table_metadata

    def counted(*args: object, **kwargs: object) -> object:
        built.append(1)
        return real(*args, **kwargs)

    # Both names: ours, and the one pyiceberg's own Transaction.table_metadata calls.
    monkeypatch.setattr(transactions, "update_table_metadata", counted)
    monkeypatch.setattr(pyiceberg.table, "update_table_metadata", counted)

    with transaction(table) as tx:
        assert tx.table_metadata is tx.table_metadata  # no change staged: one build, shared
        tx.set_properties({"a": "1"})
        assert tx.table_metadata.properties["a"] == "1"  # the staged update is visible at once
        tx.append(raw_rows(10), snapshot_properties={"k": "first"})
        staged = tx.table_metadata
        assert staged.properties["a"] == "1" and staged.current_snapshot_id is not None
        tx.set_properties({"a": "2"})
        assert tx.table_metadata.properties["a"] == "2"
    # An append reads the staged metadata ~20 times; pyiceberg rebuilt (and deep-copied) it on every read.
    assert len(built) <= 8

    table = table.refresh()
    assert table.properties["a"] == "2"
    assert table.current_snapshot().summary["k"] == "first"
    assert table.scan().to_arrow().num_rows == 10

    with transaction(table) as tx:  # a second commit on the refreshed table builds on the new base
        tx.append(raw_rows(5, start=10), snapshot_properties={"k": "second"})
    table = table.refresh()
    assert table.scan().to_arrow().num_rows == 15
    assert [s.summary["k"] for s in table.snapshots()][-2:] == ["first", "second"]
