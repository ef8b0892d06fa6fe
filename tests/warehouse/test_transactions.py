"""The cached Iceberg transaction stages exactly what pyiceberg's does, computing it once per change."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyiceberg.table
import pytest

import warehouse.transactions as transactions
from common.settings import Settings
from tests.helpers import raw_rows, summary_of
from warehouse.catalog import open_catalog
from warehouse.tables import RAW_EVENTS, ensure_table
from warehouse.transactions import transaction


def test_updates_apply_as_pyiceberg_applies_them_without_copying_what_they_leave(settings: Settings) -> None:
    """Staging (the transaction's and the catalog's) gives pyiceberg's metadata, field for field, but shares the
    snapshots and schemas it does not change with the table's: pyiceberg deep-copied them all, twice a commit, a
    cost that grew with the table's history (docs/performance.md, "Freshness")."""
    from pyiceberg.table.update import update_table_metadata

    from warehouse.catalog import apply_updates

    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    for n in range(3):
        with transaction(table) as tx:
            tx.append(raw_rows(5, start=10 * n), snapshot_properties={"n": str(n)})
        table = table.refresh()
    base = table.metadata
    tx = transaction(table)
    tx.append(raw_rows(5, start=100))
    tx.set_properties({"trajlake.test": "x"})
    updates = tx._updates
    ours = apply_updates(base, updates, table.metadata_location)
    theirs = update_table_metadata(base, updates, metadata_location=table.metadata_location)
    assert ours.model_dump(exclude={"last_updated_ms"}) == theirs.model_dump(exclude={"last_updated_ms"})
    assert len(ours.snapshots) == 4 and ours.metadata_log[-1].metadata_file == table.metadata_location
    assert ours.snapshots[0] is base.snapshots[0] and ours.schemas[0] is base.schemas[0]
    assert theirs.snapshots[0] is not base.snapshots[0]
    assert base.properties.get("trajlake.test") is None and len(base.snapshots) == 3  # the base is untouched

    tx.commit_transaction()  # through the catalog's staging, which applies them the same way
    committed = table.refresh().metadata
    assert committed.model_dump(exclude={"last_updated_ms"}) == ours.model_dump(exclude={"last_updated_ms"})


def test_staged_metadata_follows_every_update_and_is_built_once_per_change(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    built = []
    real = transactions.apply_updates

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return real(*args, **kwargs)

    # Ours, and the one pyiceberg's own Transaction.table_metadata calls (which must not be reached).
    monkeypatch.setattr(transactions, "apply_updates", counted)
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
    assert summary_of(table.current_snapshot())["k"] == "first"
    assert table.scan().to_arrow().num_rows == 10

    with transaction(table) as tx:  # a second commit on the refreshed table builds on the new base
        tx.append(raw_rows(5, start=10), snapshot_properties={"k": "second"})
    table = table.refresh()
    assert table.scan().to_arrow().num_rows == 15
    assert [summary_of(s)["k"] for s in table.snapshots()][-2:] == ["first", "second"]


def _files_by_partition(table: pyiceberg.table.Table) -> dict[object, int]:
    counts: dict[object, int] = {}
    for task in table.scan().plan_files():
        partition = task.file.partition
        key = tuple(partition[i] for i in range(len(partition)))
        counts[key] = counts.get(key, 0) + task.file.record_count
    return counts


def test_append_splits_rows_by_partition_like_pyiceberg(settings: Settings) -> None:
    catalog = open_catalog(settings)
    ours = ensure_table(catalog, settings, RAW_EVENTS.name)
    theirs = catalog.create_table(
        (settings.namespace, "raw_events_reference"), schema=ours.schema(), partition_spec=ours.spec()
    )
    rows = raw_rows(40)
    day = 86_400_000_000
    ts = [None if i % 10 == 0 else datetime.fromtimestamp((i % 3) * day / 1e6 + i, UTC) for i in range(40)]
    rows = rows.set_column(rows.schema.get_field_index("ts"), "ts", pa.array(ts, rows.schema.field("ts").type))
    with transaction(ours) as tx:
        tx.append(rows)
    with pyiceberg.table.Transaction(theirs) as tx:
        tx.append(rows)
    ours, theirs = ours.refresh(), theirs.refresh()
    # Three days and the null partition, with the same rows in each as pyiceberg's own split.
    assert _files_by_partition(ours) == _files_by_partition(theirs)
    assert sorted(_files_by_partition(ours).values()) == [4, 12, 12, 12]
    key = [("event_id", "ascending")]
    assert ours.scan().to_arrow().sort_by(key).equals(theirs.scan().to_arrow().sort_by(key))

    one_day = rows.filter(pc.equal(pc.day(rows.column("ts")), 2))  # a batch within one day: one file, as is
    with transaction(ours) as tx:
        tx.append(one_day)
    added = summary_of(ours.refresh().current_snapshot())
    assert added["added-data-files"] == "1" and added["added-records"] == str(one_day.num_rows)


def test_append_rejects_a_schema_that_does_not_fit_before_staging_anything(settings: Settings) -> None:
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    wrong = raw_rows(3).append_column("not_a_column", pa.array([1, 2, 3]))
    with pytest.raises(ValueError, match="not_a_column"):
        with transaction(table) as tx:
            tx.append(wrong)
    assert table.refresh().current_snapshot() is None


def test_replace_rows_rewrites_only_the_files_holding_matching_rows(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One snapshot: the files with rows to delete are rewritten without them (a row without a session
    kept), a file holding a key whose rows the predicate spares stays as it is, the rows are appended."""
    from pyiceberg.expressions import And, EqualTo, In

    from warehouse.snapshots import current_files
    from warehouse.sql import local_path

    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    for start in (0, 10, 20, 30):  # four files: e0-e9, …, e30-e39; session s{i % 3}
        rows = raw_rows(10, start)
        if start == 10:  # e10 without a session: the complement of the predicate must keep it
            ids = [None] + rows.column("session_id").to_pylist()[1:]
            rows = rows.set_column(rows.schema.get_field_index("session_id"), "session_id", pa.array(ids))
        with transaction(table) as tx:
            tx.append(rows)
        table = table.refresh()
    holding = {  # each file by the first event id it holds
        pq.read_table(local_path(path), columns=["event_id"]).column("event_id")[0].as_py(): path
        for path in current_files(table).paths
    }
    snapshots = len(table.snapshots())
    keys = {"e3", "e4", "e10", "e15", "e25"}
    read_whole: list[int] = []
    real = transactions.read_data_files

    def counted(table: pyiceberg.table.Table, files: list[Any], *args: Any) -> pa.Table:
        read_whole.append(len(files))
        return real(table, files, *args)

    monkeypatch.setattr(transactions, "read_data_files", counted)
    with transaction(table) as tx:  # of the keys, e3 and e15 are s0's; e25 (the third file's) is s1's
        predicate = And(In(term="event_id", literals=keys), EqualTo(term="session_id", value="s0"))
        tx.replace_rows(predicate, "event_id", keys, raw_rows(2, 100))
    table = table.refresh()
    assert len(table.snapshots()) == snapshots + 1
    after = current_files(table).paths
    assert holding["e20"] in after and holding["e30"] in after and len(after) == 5
    assert holding["e0"] not in after and holding["e10"] not in after
    assert sum(read_whole) == 3  # the file without a key (e30-e39) is not read whole
    got = sorted(table.scan().to_arrow().column("event_id").to_pylist())
    assert got == sorted({f"e{i}" for i in range(40)} - {"e3", "e15"} | {"e100", "e101"})
    assert table.scan(row_filter="session_id IS NULL").to_arrow().column("event_id").to_pylist() == ["e10"]
    # nothing to delete and nothing to append: no commit
    with transaction(table) as tx:
        tx.replace_rows(In(term="event_id", literals={"e999"}), "event_id", {"e999"})
    assert len(table.refresh().snapshots()) == snapshots + 1
