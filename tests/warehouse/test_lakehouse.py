"""The lakehouse object: every table made at open, tables current on each load, its own directories."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError

from common.settings import Settings, load_settings
from tests.helpers import open_lakehouse_at_once, raw_rows
from warehouse.catalog import ensure_namespace, open_catalog
from warehouse.cold import TIERED_TABLES
from warehouse.errors import UnknownTable
from warehouse.lakehouse import Lakehouse, Locations
from warehouse.tables import RAW_EVENTS, SCORES, TABLES


def test_opening_makes_every_hot_and_cold_table(settings: Settings) -> None:
    lake = Lakehouse.open(settings)
    catalog = open_catalog(settings)  # a second look, through another catalog object
    hot = {name for _, name in catalog.list_tables(settings.namespace)}
    cold = {name for _, name in catalog.list_tables(lake.cold_namespace)}
    assert hot == set(TABLES) and cold == set(TIERED_TABLES)
    assert lake.cold_table(RAW_EVENTS.name).location().startswith(settings.cold_location.rstrip("/"))


def test_opening_adds_the_columns_a_definition_gained(settings: Settings) -> None:
    catalog = open_catalog(settings)
    older = SCORES.arrow_schema().remove(SCORES.arrow_schema().get_field_index("min_quality"))
    catalog.create_table((settings.namespace, SCORES.name), schema=older)
    lake = Lakehouse.open(settings)
    assert "min_quality" in lake.table(SCORES.name).schema().column_names


def test_a_table_is_loaded_at_its_current_snapshot(settings: Settings) -> None:
    lake = Lakehouse.open(settings)
    before = lake.table(RAW_EVENTS.name)
    Lakehouse.open(settings).table(RAW_EVENTS.name).append(raw_rows(3))  # another writer
    assert before.current_snapshot() is None
    assert lake.table(RAW_EVENTS.name).scan().to_arrow().num_rows == 3


def test_a_table_dropped_after_opening_is_made_again(settings: Settings) -> None:
    lake = Lakehouse.open(settings)
    lake.catalog.drop_table((settings.namespace, SCORES.name))
    assert lake.table(SCORES.name).schema().column_names == SCORES.arrow_schema().names


def test_unknown_names_are_refused(settings: Settings) -> None:
    lake = Lakehouse.open(settings)
    with pytest.raises(UnknownTable, match="no_such"):
        lake.table("no_such")
    with pytest.raises(UnknownTable, match="no cold tier"):
        lake.cold_table(SCORES.name)


def test_views_read_through_the_lakehouse(settings: Settings) -> None:
    lake = Lakehouse.open(settings)
    lake.table(RAW_EVENTS.name).append(raw_rows(4))
    with lake.views() as con:
        assert con.execute("SELECT count(*) FROM events").fetchone() == (4,)
        assert con.execute("SELECT count(*) FROM scores").fetchone() == (0,)


def test_local_directories_are_the_home_and_the_file_stores_only(tmp_path: Path) -> None:
    settings = load_settings(
        home=tmp_path / "home", hot_warehouse=(tmp_path / "hot").as_uri(), cold_warehouse="s3://bucket/cold"
    )
    places = Locations.of(settings).local_directories()
    assert places == [(tmp_path / "home").resolve(), (tmp_path / "hot").resolve()]


def test_scratch_is_a_private_directory_under_the_home(settings: Settings) -> None:
    lake = Lakehouse.open(settings)
    path = lake.scratch("export")
    assert path.is_dir() and path.is_relative_to(settings.home_dir) and path.stat().st_mode & 0o077 == 0


def test_an_opening_after_the_tables_are_made_loads_none_until_the_definitions_change(settings: Settings) -> None:
    from warehouse.lakehouse import LAYOUT

    lake = Lakehouse.open(settings)
    lake.catalog.drop_table((settings.namespace, SCORES.name))
    Lakehouse.open(settings)  # the recorded layout is current: no table is looked at
    assert SCORES.name not in {name for _, name in lake.catalog.list_tables(settings.namespace)}
    lake.catalog.update_namespace_properties(settings.namespace, updates={LAYOUT: "an older trajlake"})
    Lakehouse.open(settings)  # definitions changed since: every table is made or evolved again
    assert SCORES.name in {name for _, name in lake.catalog.list_tables(settings.namespace)}


@pytest.mark.parametrize("properties", [None, {"location": "file:///elsewhere"}])
def test_a_namespace_another_opener_inserted_between_look_and_insert_is_taken_as_made(
    settings: Settings, properties: dict[str, str] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes opening one new lakehouse: both look, neither sees the namespace, one inserts first."""
    catalog = open_catalog(settings)
    ensure_namespace(catalog, "raced", properties)  # the other opener's insert
    real = catalog.namespace_exists
    stale = [False, False]  # this opener's looks (ours, then pyiceberg's own) came before that insert

    def look(namespace: str) -> bool:
        return stale.pop() if stale else real(namespace)

    monkeypatch.setattr(catalog, "namespace_exists", look)
    ensure_namespace(catalog, "raced", properties)  # the unique key refuses the insert: not an error
    assert not stale and catalog.namespace_exists("raced")


def test_a_namespace_insert_failing_for_another_reason_is_raised(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = open_catalog(settings)

    def refuse(namespace: str, properties: dict[str, str]) -> None:
        raise IntegrityError("INSERT", {}, Exception("NOT NULL constraint failed"))

    monkeypatch.setattr(catalog, "namespace_exists", lambda namespace: False)
    monkeypatch.setattr(catalog, "create_namespace", refuse)
    with pytest.raises(IntegrityError):
        ensure_namespace(catalog, "broken")


@pytest.mark.slow
def test_processes_opening_one_new_lakehouse_at_the_same_moment_all_open_it(tmp_path: Path) -> None:
    """Every opener of a new home creates the catalog's tables, namespaces, tables and cold properties at once."""
    for round_ in range(3):
        settings = load_settings(home=tmp_path / f"home{round_}")
        assert open_lakehouse_at_once(settings, openers=4) == []
        lake = Lakehouse.open(settings)
        assert {name for _, name in lake.catalog.list_tables(lake.cold_namespace)} == set(TIERED_TABLES)
