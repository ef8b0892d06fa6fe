"""SQL views read a table's files directly when they share one schema, by name otherwise."""

from __future__ import annotations

import duckdb
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
