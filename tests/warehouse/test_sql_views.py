"""SQL views read a table's files directly when they share one schema, by name otherwise."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from pyiceberg.types import StringType

from common.settings import Settings
from tests.helpers import one_row, raw_rows
from warehouse.catalog import open_catalog
from warehouse.snapshots import current_files
from warehouse.sql import local_path, open_views
from warehouse.tables import RAW_EVENTS, ensure_table
from warehouse.transactions import transaction


def _view_sql(con: duckdb.DuckDBPyConnection, name: str) -> str:
    return one_row(con, "SELECT sql FROM duckdb_views() WHERE view_name = ?", [name])[0]


def test_one_schema_reads_files_directly_and_an_evolved_table_by_name(settings: Settings) -> None:
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    for start in (0, 10):  # two files
        with transaction(table) as tx:
            tx.append(raw_rows(10, start))
        table = table.refresh()

    con = open_views(settings)
    assert "union_by_name" not in _view_sql(con, "hot_events")  # the point-lookup fast path
    assert [c[0] for c in con.execute("DESCRIBE hot_events").fetchall()] == RAW_EVENTS.arrow_schema().names
    assert con.execute("SELECT count(*), count(DISTINCT event_id) FROM events").fetchone() == (20, 20)
    assert con.execute("SELECT seq FROM events WHERE session_id = 's1' ORDER BY seq").fetchall() == [
        (i,) for i in range(20) if i % 3 == 1
    ]

    # A second schema: older files lack the new column, so files are matched by name again.
    with table.update_schema() as update:
        update.add_column("note", StringType())
    table = table.refresh()
    with transaction(table) as tx:
        rows = raw_rows(5, 20)
        tx.append(rows.append_column("note", rows.column("event_id")))
    con = open_views(settings)
    assert "union_by_name" in _view_sql(con, "hot_events")
    assert con.execute("SELECT count(*), count(note) FROM events").fetchone() == (25, 5)
    names = [c[0] for c in con.execute("DESCRIBE hot_events").fetchall()]
    assert set(RAW_EVENTS.arrow_schema().names) < set(names) and "note" in names


def test_locked_views_read_the_same_rows_and_nothing_else(settings: Settings) -> None:
    """The connection user SQL runs on sees every view's rows, through both source kinds, but no other file."""
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    with transaction(table) as tx:
        tx.append(raw_rows(10))
    with table.refresh().update_schema() as update:  # a second schema: the union_by_name source
        update.add_column("note", StringType())
    table = table.refresh()
    with transaction(table) as tx:
        rows = raw_rows(5, 10)
        tx.append(rows.append_column("note", rows.column("event_id")))

    trusted, locked = open_views(settings), open_views(settings, locked=True)
    query = "SELECT event_id, seq, note FROM events ORDER BY event_id"
    assert locked.execute(query).fetchall() == trusted.execute(query).fetchall()
    assert len(locked.execute(query).fetchall()) == 15
    data_files = {path for (path,) in locked.execute("SELECT unnest(current_setting('allowed_paths'))").fetchall()}
    assert data_files == {local_path(p) for p in current_files(table).paths}
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        locked.execute(f"SELECT * FROM read_text('{settings.home_dir / 'catalog.db'}')")


def test_planning_after_a_commit_reads_only_the_new_manifests(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot lists the manifests of the one before it plus new ones: only those are read again."""
    from pyiceberg.expressions import EqualTo
    from pyiceberg.manifest import ManifestFile

    import warehouse.snapshots as snapshots

    read: list[str] = []
    real = ManifestFile.fetch_manifest_entry

    def counted(self: ManifestFile, *args: object, **kwargs: object) -> object:
        read.append(self.manifest_path)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    for start in range(0, 50, 10):  # five appends: five manifests
        with transaction(table) as tx:
            tx.append(raw_rows(10, start))
        table = table.refresh()
    assert len(current_files(table).paths) == 5
    assert len(read) == 5
    with transaction(table) as tx:
        tx.append(raw_rows(10, 50))
    table = table.refresh()
    read.clear()
    assert len(current_files(table).paths) == 6
    assert len(read) == 1  # the new one; five came from the cache
    # a delete rewrites a file: the manifests it writes are new (read once), the removed file is gone
    before = set(current_files(table).paths)
    with transaction(table) as tx:
        tx.delete(EqualTo(term="event_id", value="e3"))
    table = table.refresh()
    read.clear()
    files = set(current_files(table).paths)
    assert len(files) == 6 and len(files - before) == 1 and 1 <= len(read) <= 2
    assert table.scan().to_arrow().num_rows == 59
    con = open_views(settings)
    assert con.execute("SELECT count(*), count(*) FILTER (WHERE event_id = 'e3') FROM events").fetchone() == (59, 0)
    # a bounded cache: the oldest manifests are dropped first
    monkeypatch.setattr(snapshots, "_MANIFEST_ENTRIES_KEPT", 2)
    monkeypatch.setattr(snapshots, "_MANIFESTS", type(snapshots._MANIFESTS)())
    monkeypatch.setattr(snapshots, "_manifest_entries", 0)
    monkeypatch.setattr(snapshots, "_PLANS", type(snapshots._PLANS)())
    read.clear()
    assert len(current_files(table).paths) == 6
    assert len(snapshots._MANIFESTS) <= 2 and snapshots._manifest_entries <= 2


def test_a_view_over_some_days_opens_only_their_files(settings: Settings) -> None:
    """``register_tiered(on_days=…)``: the files of other day partitions are not in the view at all."""
    from datetime import UTC, date, datetime

    from warehouse.lakehouse import Lakehouse
    from warehouse.sql import register_tiered

    catalog = open_catalog(settings)
    table = ensure_table(catalog, settings, RAW_EVENTS.name)
    for day, start in ((1, 0), (2, 10), (None, 20)):  # a file per day partition, and one without a ts
        rows = raw_rows(10, start)
        if day is not None:
            ts = pa.array([datetime(2026, 1, day, 12, tzinfo=UTC)] * 10, rows.schema.field("ts").type)
            rows = rows.set_column(rows.schema.get_field_index("ts"), "ts", ts)
        with transaction(table) as tx:
            tx.append(rows)
        table = table.refresh()
    con = open_views(settings)
    register_tiered(
        con, Lakehouse.open(settings, catalog), RAW_EVENTS, view="some_events", on_days=lambda d: d != date(2026, 1, 2)
    )
    ids = {r[0] for r in con.execute("SELECT event_id FROM some_events").fetchall()}
    assert ids == {f"e{i}" for i in (*range(10), *range(20, 30))}
    text = _view_sql(con, "hot_some_events")
    day2 = [p for p in current_files(table).paths if "2026-01-02" in p]
    assert len(day2) == 1 and local_path(day2[0]) not in text
    assert con.execute("SELECT count(*) FROM events").fetchone() == (30,)  # the full view is untouched
