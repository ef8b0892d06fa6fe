"""User SQL can read only the lakehouse's own tables and views (issue 18, part 1).

Two layers, each tested on its own: ``check_read_only`` lets through exactly one plain
read-only statement (DuckDB's parser decides), and the connection ``run_query`` uses is
locked before user text runs (only the views' data files readable, no extensions, no
settings changes, a timeout and a memory limit). The probes are the ones the issue
measured plus others an attacker would try next.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from tests.helpers import BASE, day_events, write_raw
from warehouse.errors import QueryError
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.sql import check_read_only, open_views
from warehouse.tables import TABLES

FAKE_SECRET = "fake-aws-secret-Zq9xT4"
FAKE_SASL = "fake-sasl-password-Wm3k"


@pytest.fixture
def lake(settings: Settings) -> Settings:
    """A small lakehouse: raw events, trajectories and steps in the hot tier."""
    write_raw(settings, day_events(2, 3), batch_size=20)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    open_views(settings).close()  # every table exists from now on: the catalog changes only if attacked
    return settings


def _catalog(settings: Settings) -> Path:
    return settings.home_dir / "catalog.db"


def _catalog_rows(path: Path) -> list[tuple]:
    """The catalog's table pointers (opening the catalog bumps SQLite's change counter, so bytes differ)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return sorted(db.execute("SELECT * FROM iceberg_tables").fetchall())


# --- the statement check -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1; SELECT 2",
        "SELECT 1; DROP VIEW events",
        "SET memory_limit = '100GB'",
        "SET enable_external_access = true",
        "RESET lock_configuration",
        "PRAGMA enable_profiling",
        "PRAGMA show_tables",
        "ATTACH '/tmp/x.duckdb' AS x",
        "DETACH memory",
        "INSTALL httpfs",
        "LOAD httpfs",
        "CALL pragma_version()",
        "COPY (SELECT 1) TO '/tmp/x.csv'",
        "COPY events FROM '/etc/passwd'",
        "EXPORT DATABASE '/tmp/exported'",
        "CREATE TABLE t AS SELECT 1",
        "CREATE SECRET (TYPE s3, KEY_ID 'a', SECRET 'b')",
        "CREATE OR REPLACE VIEW events AS SELECT 1",
        "DROP VIEW events",
        "INSERT INTO events SELECT * FROM events",
        "UPDATE events SET seq = 0",
        "DELETE FROM events",
        "USE memory",
        "CHECKPOINT",
        "VACUUM",
        "PIVOT (SELECT 1 AS a) ON a",
        "EXPLAIN ANALYZE SELECT 1",
        "EXPLAIN ANALYSE SELECT 1",
        "EXPLAIN /* hidden */ ANALYZE SELECT 1",
        "EXPLAIN ANALYZE SET memory_limit = '100GB'",
        "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
        "EXPLAIN ANALYZE INSTALL httpfs",
        "EXPLAIN ANALYZE COPY (SELECT 'x') TO '/tmp/x.csv' (FORMAT csv)",
        "EXPLAIN COPY (SELECT 'x') TO '/tmp/x.csv'",
        "EXPLAIN CREATE TABLE t AS SELECT 1",
        "EXPLAIN (ANALYZE) SELECT 1",
        "EXPLAIN\u00a0ANALYZE SELECT 1",
        "\ufeffEXPLAIN ANALYZE SELECT 1",
        "EXPLAIN ANALYZE\u200b SELECT 1",
        "SELECT 1\uff1b SELECT 2",
        # DuckDB parses a data-modifying CTE into a statement typed SELECT.
        "WITH x AS (COPY (SELECT 'x') TO '/tmp/x.csv') SELECT 1",
        "WITH x AS MATERIALIZED (COPY (SELECT 'x') TO '/tmp/x.csv') SELECT * FROM x",
        "SELECT * FROM (WITH y AS (DELETE FROM events RETURNING *) SELECT * FROM y)",
        "SELECT 1 WHERE EXISTS (WITH z AS (UPDATE events SET seq = 0 RETURNING *) SELECT 1)",
        "WITH x AS (INSERT INTO events SELECT * FROM events RETURNING *) SELECT count(*) FROM x",
        "EXPLAIN WITH x AS (COPY (SELECT 'x') TO '/tmp/x.csv') SELECT 1",
        "EXPLAIN",
        "",
        "  ;  ",
        "-- only a comment",
    ],
)
def test_only_one_plain_read_only_statement_is_accepted(query: str) -> None:
    with pytest.raises(QueryError) as raised:
        check_read_only(query)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT 1",
        "select 1;",
        "SELECT 1 /* ; DROP VIEW events */",
        "SELECT 1; -- trailing comment",
        "WITH a AS (SELECT 1 AS x) SELECT x FROM a",
        "FROM range(3)",
        "VALUES (1), (2)",
        "DESCRIBE events",
        "SHOW TABLES",
        "SUMMARIZE SELECT 1 AS x",
        "EXPLAIN SELECT count(*) FROM events",
        "/* é */ EXPLAIN -- ü\n SELECT 'ü'",
        "SELECT 'EXPLAIN ANALYZE COPY'",
        "SELECT 1 UNION ALL SELECT 2 INTERSECT SELECT 2",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
        "SELECT * FROM (SELECT 1 AS a, 2 AS b) PIVOT (sum(b) FOR a IN (1))",
    ],
)
def test_plain_reads_are_accepted(query: str) -> None:
    check_read_only(query)


@pytest.mark.slow
def test_explain_analyze_copy_cannot_overwrite_the_catalog(lake: Settings) -> None:
    catalog = _catalog(lake)
    before = _catalog_rows(catalog)
    with pytest.raises(QueryError, match="EXPLAIN ANALYZE"):
        run_query(lake, f"EXPLAIN ANALYZE COPY (SELECT 'x') TO '{catalog}' (FORMAT csv)")
    with pytest.raises(QueryError, match="COPY"):
        run_query(lake, f"WITH x AS (COPY (SELECT 'x') TO '{catalog}' (FORMAT csv)) SELECT 1")
    # Statement text inside a string is parsed only when it runs, past the check.
    for inner in (f"WITH x AS (COPY (SELECT 1) TO ''{catalog}'') SELECT 1", f"COPY (SELECT 1) TO ''{catalog}''"):
        with pytest.raises(QueryError):
            run_query(lake, f"SELECT * FROM query('{inner}')")
    assert _catalog_rows(catalog) == before and before
    assert run_query(lake, "SELECT count(*) > 0 FROM events")[1] == [(True,)]


@pytest.mark.slow
def test_plain_explain_of_a_select_runs_without_running_it(lake: Settings) -> None:
    columns, rows = run_query(lake, "EXPLAIN SELECT count(*) FROM events")
    assert columns and rows and "explain" in columns[0]


# --- the lock: probes that are one SELECT, so only the locked connection stands in their way --------------------


def _file_probes(home: Path) -> list[str]:
    catalog = home / "catalog.db"
    return [
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM read_text(['/etc/hostname', '/etc/passwd'])",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_csv_auto('/etc/passwd', header = false)",
        "SELECT * FROM read_json('/etc/passwd')",
        "SELECT * FROM read_parquet('/etc/passwd')",
        "SELECT * FROM parquet_metadata('/etc/passwd')",
        "SELECT * FROM parquet_schema('/etc/passwd')",
        "SELECT * FROM sniff_csv('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'",
        'SELECT * FROM "/etc/passwd"',
        "SELECT * FROM glob('/**')",
        "SELECT * FROM glob('/etc/*')",
        f"SELECT * FROM glob('{home}/**')",
        f"SELECT * FROM read_blob('{catalog}')",
        f"SELECT * FROM read_text('{catalog}')",
        f"SELECT * FROM read_csv('{catalog}')",
        f"SELECT * FROM read_text('{home}/hot/../catalog.db')",
        "SELECT * FROM read_text('/proc/self/environ')",
        "SELECT * FROM read_blob('/proc/self/environ')",
        "SELECT * FROM read_csv('/proc/self/environ', sep = '\\0')",
        "SELECT * FROM read_text('file:///etc/passwd')",
        "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')",
        "SELECT * FROM read_parquet('s3://trajlake-cold/x.parquet')",
        "SELECT * FROM query('SELECT * FROM read_text(''/etc/passwd'')')",
        "SELECT * FROM query_table('/etc/passwd')",
        "WITH leak AS (SELECT content FROM read_text('/etc/passwd')) SELECT * FROM leak",
        "SELECT (SELECT content FROM read_text('/etc/passwd'))",
        "SELECT * FROM events WHERE event_id IN (SELECT content FROM read_text('/etc/passwd'))",
        "SELECT * FROM read_text('/etc/' || 'passwd')",
        "SELECT * FROM duckdb_secrets()",
        "SELECT * FROM duckdb_extensions()",
        "SELECT getenv('HOME')",
        f"SELECT * FROM sqlite_scan('{catalog}', 'iceberg_tables')",
        f"SELECT * FROM iceberg_scan('{home}/hot')",
        "SELECT * FROM read_xlsx('/etc/passwd')",
        f"SELECT * FROM read_blob('{home}/hot/./../catalog.db')",
    ]


@pytest.mark.slow
def test_files_outside_the_lakehouse_cannot_be_read(lake: Settings) -> None:
    # Traversal from a data file the lock allows, up to the catalog.
    data_file = run_query(lake, "SELECT unnest(current_setting('allowed_paths')) LIMIT 1")[1][0][0]
    up = Path(data_file).relative_to(lake.home_dir).parts
    traversal = data_file + "/.." * len(up) + "/catalog.db"
    assert os.path.normpath(traversal) == str(_catalog(lake))
    for query in [*_file_probes(lake.home_dir), f"SELECT * FROM read_blob('{traversal}')"]:
        check_read_only(query)  # each probe is one plain SELECT: the parser alone does not stop it
        with pytest.raises(QueryError) as raised:
            run_query(lake, query)
        assert "\n" not in str(raised.value), query


def test_only_the_views_data_files_are_readable(lake: Settings) -> None:
    data = run_query(lake, "SELECT DISTINCT filename FROM read_parquet(current_setting('allowed_paths'), filename=1)")
    assert data[1], "the views read data files directly"
    metadata = sorted((lake.home_dir / "hot").rglob("*.metadata.json"))
    assert metadata
    with pytest.raises(QueryError, match="disabled by configuration"):
        run_query(lake, f"SELECT * FROM read_text('{metadata[0]}')")


@pytest.mark.slow
def test_secrets_in_the_environment_never_appear(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("TRAJLAKE_KAFKA_EXTRA", json.dumps({"sasl.password": FAKE_SASL}))
    settings = load_settings()
    assert settings.kafka_extra["sasl.password"] == FAKE_SASL
    probes = [
        "SELECT * FROM read_text('/proc/self/environ')",
        "SELECT * FROM read_blob('/proc/self/environ')",
        "SELECT * FROM read_csv('/proc/self/environ', sep = '=', header = false)",
        f"SELECT * FROM read_text('/proc/{os.getpid()}/environ')",
        "SELECT getenv('AWS_SECRET_ACCESS_KEY')",
        "SELECT current_setting('s3_secret_access_key')",
        "SELECT * FROM duckdb_settings()",
        "SELECT * FROM duckdb_secrets()",
        "SELECT * FROM which_secret('s3://trajlake-cold/x', 's3')",
    ]
    refused = 0
    for query in probes:
        try:
            text = repr(run_query(settings, query))
        except QueryError as exc:
            text, refused = str(exc), refused + 1
        assert FAKE_SECRET not in text and FAKE_SASL not in text, query
    assert refused >= 4  # the environ reads at least are refused, not just empty


@pytest.mark.slow
def test_the_locked_connection_refuses_what_the_parser_would_have_let_through(lake: Settings) -> None:
    """Defence in depth: even a statement that got past the check cannot write, change settings or load."""
    catalog = _catalog(lake)
    con = open_views(lake, locked=True)
    before = _catalog_rows(catalog)
    for statement in [
        f"COPY (SELECT 'x') TO '{catalog}' (FORMAT csv)",
        f"EXPLAIN ANALYZE COPY (SELECT 'x') TO '{catalog}' (FORMAT csv)",
        f"WITH x AS (COPY (SELECT 'x') TO '{catalog}' (FORMAT csv)) SELECT 1",
        f"ATTACH '{catalog}' AS c (TYPE sqlite)",
        f"EXPORT DATABASE '{lake.home_dir}/dump'",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "RESET enable_external_access",
        "SET GLOBAL allowed_directories = ['/']",
        "SET memory_limit = '100GB'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SELECT * FROM read_text('/etc/passwd')",
    ]:
        with pytest.raises(duckdb.Error):
            con.execute(statement)
    assert _catalog_rows(catalog) == before and before
    assert not (lake.home_dir / "dump").exists()
    assert con.execute("SELECT current_setting('enable_external_access')").fetchone() == (False,)


@pytest.mark.slow
def test_python_variables_are_not_scanned(lake: Settings) -> None:
    leaked_frame = pa.table({"x": [FAKE_SECRET]})  # noqa: F841 - DuckDB's replacement scan would find it by name
    assert duckdb.connect().execute("SELECT * FROM leaked_frame").fetchall() == [(FAKE_SECRET,)]
    with pytest.raises(duckdb.Error):
        open_views(lake, locked=True).execute("SELECT * FROM leaked_frame")


@pytest.mark.slow
def test_a_long_query_is_interrupted(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_SQL_TIMEOUT_S", "0.2")
    settings = load_settings()
    for query in (
        "SELECT count(*) FROM range(3000000000) t(i) WHERE hash(i) % 7 = 3",
        "SELECT count(*) FROM range(3000000000000)",
    ):
        started = time.monotonic()
        with pytest.raises(QueryError, match="TRAJLAKE_SQL_TIMEOUT_S"):
            run_query(settings, query)
        assert time.monotonic() - started < 20


@pytest.mark.slow
def test_memory_is_limited(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_SQL_MEMORY_LIMIT", "64MB")
    settings = load_settings()
    assert run_query(settings, "SELECT current_setting('memory_limit')")[1] == [("61.0 MiB",)]
    with pytest.raises(QueryError, match="Out of Memory"):
        run_query(settings, "SELECT count(DISTINCT i::VARCHAR || 'x') FROM range(20000000) t(i)")
    assert run_query(settings, "SELECT count(*) FROM range(1000)")[1] == [(1000,)]


# --- the views still work ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_view_is_readable_on_the_locked_connection(lake: Settings) -> None:
    from warehouse.cold import TIERED_TABLES

    views = [spec.view for spec in TABLES.values()]
    views += [f"{tier}_{TABLES[name].view}" for name in TIERED_TABLES for tier in ("hot", "cold")]
    trusted = open_views(lake)
    for view in views:
        expected = trusted.execute(f'SELECT count(*) FROM "{view}"').fetchall()
        assert run_query(lake, f'SELECT count(*) FROM "{view}"')[1] == expected, view
    assert run_query(lake, "SELECT count(*) > 0 FROM events JOIN hot_events USING (event_id)")[1] == [(True,)]
    assert run_query(lake, "DESCRIBE events")[1]


# --- the command line prints values verbatim --------------------------------------------------------------------

VERBATIM = "root:x:0:0 :smile: [red]x[/red] [bold]b[/] :x:"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_cli_prints_values_verbatim(fmt: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env["TRAJLAKE_HOME"] = str(tmp_path / "home")
    open_views(load_settings(home=tmp_path / "home")).close()  # `trajlake sql` reads an existing lakehouse
    result = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", "sql", f"SELECT '{VERBATIM}' AS v", "--format", fmt],
        env=env,
        capture_output=True,
        timeout=300,
        check=True,
    )
    lines = result.stdout.decode().splitlines()
    if fmt == "json":
        assert json.loads(result.stdout) == [{"v": VERBATIM}]
    elif fmt == "csv":
        assert lines == ["v", VERBATIM]
    else:
        assert lines[2] == VERBATIM and lines[-1] == "(1 row)"
    assert VERBATIM.encode() in result.stdout


@pytest.mark.slow
def test_cli_refuses_reading_the_environment_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(TRAJLAKE_HOME=str(tmp_path / "home"), AWS_SECRET_ACCESS_KEY=FAKE_SECRET)
    open_views(load_settings(home=tmp_path / "home")).close()
    for query in ("SELECT * FROM read_text('/proc/self/environ')", "SELECT 1; SELECT 2"):
        result = subprocess.run(
            [sys.executable, "-m", "trajlake.cli", "sql", query], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 1 and result.stdout == ""
        assert len(result.stderr.strip().splitlines()) == 1 and "error:" in result.stderr
        assert FAKE_SECRET not in result.stderr
