"""The view plan: a query opens the views from it only while the catalog still points where it was made.

Every view answers from the plan as it does through the catalog; a commit, a corrupt or foreign
file, or a plan that holds anything but view statements sends the query the long way (which
writes a new plan); the connection a planned query runs on is locked exactly as the other.
"""

from __future__ import annotations

import json
import re
import threading
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.score import score_all
from tests.helpers import AS_OF, BASE, day_events, one_row, raw_rows, write_raw
from warehouse.catalog import open_catalog
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.sql import open_views
from warehouse.tables import RAW_EVENTS, ensure_table
from warehouse.tiering import tier
from warehouse.transactions import transaction
from warehouse.view_plan import FORMAT, _digest, load_plan, open_planned_views, plan_path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sql.md"


def _documented_views() -> list[str]:
    """The views docs/sql.md lists (first cell of each row of its tables), with their hot_/cold_ forms."""
    names = re.findall(r"^\| `([a-z_]+)` \|", DOCS.read_text(), flags=re.M)
    tiered = [f"{tier}_{name}" for name in ("events", "trajectories", "steps") for tier in ("hot", "cold")]
    return names + tiered


def _answers(con: duckdb.DuckDBPyConnection, view: str) -> tuple[list, list]:
    columns = [row[:2] for row in con.execute(f'DESCRIBE "{view}"').fetchall()]
    rows = sorted(repr(row) for row in con.execute(f'SELECT * FROM "{view}"').fetchall())
    return columns, rows


def _count(settings: Settings) -> int:
    return run_query(settings, "SELECT count(*) FROM events")[1][0][0]


@pytest.fixture
def lake(settings: Settings) -> Settings:
    """Both tiers, trajectories and scores: days 0–2 cold, day 3 hot."""
    write_raw(settings, day_events(4, 3), batch_size=50)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=10))
    return settings


@pytest.mark.slow
def test_every_view_answers_from_the_plan_as_through_the_catalog(lake: Settings) -> None:
    assert not plan_path(lake).exists()
    full = open_views(lake, locked=True, save_plan=True)
    assert plan_path(lake).exists()
    planned = open_planned_views(lake)
    assert planned is not None
    views = _documented_views()
    assert len(views) > 15
    assert {"costs", "fleet_health", "pipeline_health", "scores", "quarantine"} <= set(views)
    for view in views:
        assert _answers(planned, view) == _answers(full, view), view
    assert _answers(planned, "events")[1] and _answers(planned, "cold_events")[1] and _answers(planned, "scores")[1]
    setting = "SELECT current_setting('allowed_paths')"
    assert sorted(one_row(planned, setting)[0]) == sorted(one_row(full, setting)[0])


def test_a_commit_is_seen_by_the_next_query(settings: Settings) -> None:
    write_raw(settings, day_events(1, 2))
    open_views(settings).close()
    before = _count(settings)  # opens through the catalog, saves the plan
    assert before > 0 and load_plan(settings) is not None
    assert _count(settings) == before  # from the plan

    write_raw(settings, day_events(1, 1))  # one commit to raw_events: its pointer moves
    assert load_plan(settings) is None
    after = _count(settings)
    assert after > before
    assert load_plan(settings) is not None  # the query made a new plan
    assert _count(settings) == after


def test_a_commit_that_adds_no_file_still_invalidates(settings: Settings) -> None:
    """Any commit moves the pointer (here a property change on the cold table the hot view is filtered by)."""
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    with transaction(table) as tx:
        tx.append(raw_rows(10))
    assert _count(settings) == 10 and load_plan(settings) is not None
    hot_file = run_query(
        settings, "SELECT DISTINCT filename FROM read_parquet(current_setting('allowed_paths'), filename=1)"
    )
    cold = open_catalog(settings).load_table((f"{settings.namespace}_cold", RAW_EVENTS.name))
    with transaction(cold) as tx:  # as tiering's first phase records: these hot files are in cold now
        tx.set_properties({"trajlake.tiered-hot-files": json.dumps(["file://" + hot_file[1][0][0]])})
    assert load_plan(settings) is None
    assert _count(settings) == 0


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00\xff garbage",
        b'{"format": "trajlake-view-plan/1", "digest": "x", "body": {}',
        b'{"format": "another/9", "body": {}}',
        b"[1, 2, 3]",
    ],
)
def test_a_corrupt_plan_is_ignored(settings: Settings, content: bytes) -> None:
    write_raw(settings, day_events(1, 2))
    expected = _count(settings)
    plan_path(settings).write_bytes(content)
    assert load_plan(settings) is None
    assert _count(settings) == expected
    assert load_plan(settings) is not None  # replaced by a good one


def test_a_plan_from_another_lakehouse_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    homes = {}
    for name, sessions in (("a", 3), ("b", 1)):
        monkeypatch.setenv("TRAJLAKE_HOME", str(tmp_path / name))
        homes[name] = load_settings()
        write_raw(homes[name], day_events(1, sessions))
    a, b = homes["a"], homes["b"]
    expected = _count(b)
    assert _count(a) > expected
    plan_path(b).write_bytes(plan_path(a).read_bytes())
    assert load_plan(b) is None
    assert _count(b) == expected


def test_a_plan_holding_other_statements_runs_nothing(settings: Settings, tmp_path: Path) -> None:
    write_raw(settings, day_events(1, 1))
    _count(settings)
    document = json.loads(plan_path(settings).read_text())
    target = tmp_path / "written"
    body = document["body"]
    body["statements"].append(f"CREATE OR REPLACE VIEW \"x\" AS SELECT 1; COPY (SELECT 1) TO '{target}'")
    plan_path(settings).write_text(json.dumps({"format": FORMAT, "digest": _digest(body), "body": body}))
    assert load_plan(settings) is not None  # well formed and current …
    assert open_planned_views(settings) is None  # … but not only view statements: not replayed
    assert not target.exists()
    assert _count(settings) > 0


@pytest.mark.slow
def test_the_planned_connection_is_locked(lake: Settings) -> None:
    open_views(lake, locked=True, save_plan=True).close()
    con = open_planned_views(lake)
    assert con is not None
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        con.execute(f"SELECT * FROM read_text('{lake.home_dir / 'catalog.db'}')")
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        con.execute(f"SELECT * FROM read_text('{plan_path(lake)}')")
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET memory_limit = '64GB'")
    with pytest.raises(duckdb.Error):
        con.execute("INSTALL httpfs")


def test_turned_off_the_plan_is_neither_written_nor_read(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    write_raw(settings, day_events(1, 1))
    monkeypatch.setenv("TRAJLAKE_SQL_VIEW_CACHE", "false")
    off = load_settings()
    assert _count(off) > 0
    assert not plan_path(off).exists()
    monkeypatch.delenv("TRAJLAKE_SQL_VIEW_CACHE")
    on = load_settings()
    _count(on)
    assert load_plan(on) is not None and load_plan(off) is None


def test_queries_during_commits_never_see_less_than_was_committed(settings: Settings) -> None:
    """A writer commits batch after batch while queries run (through the fork server: a thread is alive)."""
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    batches, per_batch = 12, 10
    committed = 0
    failure: list[BaseException] = []

    def write() -> None:
        nonlocal committed, table
        try:
            for i in range(batches):
                with transaction(table) as tx:
                    tx.append(raw_rows(per_batch, i * per_batch))
                table = table.refresh()
                committed += per_batch
        except BaseException as exc:  # reported by the test below
            failure.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    seen = []
    while writer.is_alive():
        floor = committed
        count = _count(settings)
        assert floor <= count <= batches * per_batch
        seen.append(count)
    writer.join()
    assert not failure
    assert _count(settings) == batches * per_batch
    assert seen == sorted(seen)


def test_a_plan_whose_empty_tables_would_not_come_back_the_same_is_not_written(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The empty tables are the one part of a plan made again rather than replayed verbatim: if one of them
    came back with other columns, the replayed views could differ, so no plan is written."""
    from warehouse import view_plan

    write_raw(settings, day_events(1, 1))
    real = view_plan._empty_table_sql

    def every_column_text(name: str, columns: list[list[str]]) -> str:
        return real(name, [[column, "VARCHAR"] for column, _ in columns])

    monkeypatch.setattr(view_plan, "_empty_table_sql", every_column_text)
    open_views(settings, save_plan=True).close()
    assert not plan_path(settings).exists()
    monkeypatch.setattr(view_plan, "_empty_table_sql", real)
    full = open_views(settings, locked=True, save_plan=True)
    planned = open_planned_views(settings)
    assert planned is not None
    for view in ("events", "hot_events", "dead_letters", "trajectories"):
        assert _answers(planned, view) == _answers(full, view), view
