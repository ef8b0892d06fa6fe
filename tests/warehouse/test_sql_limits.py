"""SQL limits that hold: a deadline that includes planning, a hard memory cap, streamed results, safe output.

Each breach the limits close is reproduced here: a query whose planning alone outlasts the
timeout, a scalar function that builds one huge value under a small memory limit, a result
far larger than the command's memory, and values that carry terminal escape sequences or
spreadsheet formulas. The fuzzers drive the SQL text boundary with generated input.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.settings import Settings, load_settings
from warehouse.errors import QueryError, QueryKilled, QueryMemoryExceeded, QueryTimeout
from warehouse.isolation import BatchSink, IsolatedStream
from warehouse.query import run_query, stream_query
from warehouse.sql import check_read_only, open_views
from warehouse.sql_output import _CONTROL, escape_controls, format_rows, write_rows


@pytest.fixture
def lake(settings: Settings) -> Settings:
    """An empty lakehouse whose tables exist (the views of a query read them)."""
    open_views(settings).close()
    return settings


def _limited(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(f"TRAJLAKE_{name}", value)
    return load_settings()


def _nested_ctes(depth: int) -> str:
    """A ~1 kB query whose plan doubles with every level: each CTE reads the one before twice, inlined."""
    parts = ["a0 AS NOT MATERIALIZED (SELECT 1 AS x)"]
    parts += [
        f"a{i} AS NOT MATERIALIZED (SELECT * FROM a{i - 1} UNION ALL SELECT * FROM a{i - 1})"
        for i in range(1, depth + 1)
    ]
    return "WITH " + ", ".join(parts) + f" SELECT count(*) FROM a{depth}"


# --- the deadline covers planning --------------------------------------------------------------------------------


def test_planning_is_killed_at_the_deadline(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # DuckDB sees an interrupt only between some planning phases: with a 1 s interrupt, depth 16
    # (1.2 kB) still planned for 5.6 s, depth 18 for 28.7 s and 600 MB; each level doubles both.
    # Depth 20 is minutes and gigabytes; the deadline is 2 s.
    settings = _limited(monkeypatch, SQL_TIMEOUT_S="2")
    started = time.monotonic()
    with pytest.raises(QueryTimeout, match="TRAJLAKE_SQL_TIMEOUT_S"):
        run_query(settings, _nested_ctes(20))
    # The property under test is the deadline itself; the margin covers starting and killing the process.
    assert time.monotonic() - started < 2 + 15


def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        try:
            tasks = list(Path(f"/proc/{stack.pop()}/task").iterdir())
            children = [int(c) for task in tasks for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue  # ended while we looked
        found += children
        stack += children
    return found


def _group_leaders() -> set[int]:
    """Live descendants of this process that lead their own process group (as a query process does)."""
    leaders = set()
    for pid in _descendants(os.getpid()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        if stat[0] not in ("Z", "X") and int(stat[2]) == pid:
            leaders.add(pid)
    return leaders


def test_a_timed_out_query_leaves_no_process_behind(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _limited(monkeypatch, SQL_TIMEOUT_S="1")
    before = _group_leaders()  # brokers other tests started lead their own groups too
    with pytest.raises(QueryTimeout):
        with stream_query(settings, "SELECT count(*) FROM range(3000000000000)") as result:
            list(result.batches())
    # A query process leads its own process group (the fork server and resource tracker do not).
    assert _group_leaders() - before == set()


def _echo_environment(sink: BatchSink, name: str) -> None:
    """Work run in a query process: report what it sees of its caller."""
    values = [os.environ.get(name, ""), os.getcwd()]
    sink.write(pa.record_batch([pa.array([v]) for v in values], names=["value", "cwd"]))


def test_a_fork_server_child_runs_in_the_callers_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)  # with threads: through the fork server
    worker.start()

    def seen() -> list[tuple[str, str]]:
        with IsolatedStream(_echo_environment, ("TRAJLAKE_PROBE",), timeout_s=120, memory_bytes=1 << 30) as stream:
            return [tuple(row.values()) for batch in stream.batches() for row in batch.to_pylist()]

    try:
        seen()  # the fork server exists from here on, with the environment of this moment
        monkeypatch.setenv("TRAJLAKE_PROBE", "set after the server started")
        monkeypatch.chdir(tmp_path)
        assert seen() == [("set after the server started", str(tmp_path))]
    finally:
        stop.set()
        worker.join()


# --- the memory cap holds for what DuckDB does not account ------------------------------------------------------


@pytest.mark.slow
def test_a_huge_scalar_value_is_stopped_by_the_memory_cap(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # lpad builds one 1 GB string outside DuckDB's memory accounting: the limit alone let it through.
    settings = _limited(monkeypatch, SQL_MEMORY_LIMIT="64MB", SQL_MEMORY_HEADROOM="128MB")
    with pytest.raises((QueryMemoryExceeded, QueryKilled)) as raised:
        run_query(settings, "SELECT length(lpad('x', 1000000000, 'y'))")
    assert "TRAJLAKE_SQL_MEMORY_LIMIT=64MB" in str(raised.value) and "\n" not in str(raised.value)
    # The same limits still run ordinary queries.
    assert run_query(settings, "SELECT length(lpad('x', 1000000, 'y'))")[1] == [(1_000_000,)]


def test_duckdbs_own_limit_is_reported_as_memory(lake: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _limited(monkeypatch, SQL_MEMORY_LIMIT="64MB")
    with pytest.raises(QueryMemoryExceeded, match="Out of Memory"):
        run_query(settings, "SELECT count(DISTINCT i::VARCHAR || 'x') FROM range(20000000) t(i)")


# --- results stream: the command's memory does not follow the result's size ------------------------------------

_PEAK = """
import atexit, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("PEAK", int(line.split()[1]) * 1024, file=sys.stderr)
atexit.register(peak)
sys.argv = ["trajlake", "sql", sys.argv[1], "--format", "csv"]
from trajlake.cli import main
main()
"""


def _lakehouse(home: Path) -> Path:
    """An existing, empty lakehouse at ``home`` (``trajlake sql`` refuses a home that does not exist)."""
    if not home.exists():
        open_views(load_settings(home=home)).close()
    return home


def _cli_peak(home: Path, query: str, env: dict[str, str]) -> tuple[int, int]:
    """(bytes printed, peak RSS of the command's own process) of ``trajlake sql QUERY --format csv``."""
    _lakehouse(home)
    with subprocess.Popen(
        [sys.executable, "-c", _PEAK, query],
        env={**env, "TRAJLAKE_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        printed = 0
        while chunk := proc.stdout.read(1 << 20):
            printed += len(chunk)
        errors = proc.stderr.read().decode()
        assert proc.wait(timeout=600) == 0, errors
    return printed, int(errors.split("PEAK")[-1].split()[0])


@pytest.mark.slow
def test_a_large_result_streams_through_a_bounded_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(TRAJLAKE_SQL_MEMORY_LIMIT="128MB", TRAJLAKE_SQL_TIMEOUT_S="300")
    home = tmp_path / "home"
    _, baseline = _cli_peak(home, "SELECT 1", env)
    printed, peak = _cli_peak(home, "SELECT i, repeat('x', 1000) AS pad FROM range(400000) t(i)", env)
    assert printed > 400_000_000  # every row was printed ...
    assert peak - baseline < 100_000_000, (baseline, peak)  # ... by a process that never held them


# --- output: terminal escapes and formulas are neutralised, unless --raw ---------------------------------------

HOSTILE = {
    "csi": "\x1b[31mred\x1b[0m",
    "bell": "ding\x07",
    "osc8": "\x1b]8;;https://attacker.example/\x1b\\click\x1b]8;;\x1b\\",
    "cr": "safe\rEVIL",
    "c1_csi": "\x9b31m",
    "bidi": "abc\u202edcb",
    "newline": "one\ntwo",
}


def _cli(home: Path, *args: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env["TRAJLAKE_HOME"] = str(_lakehouse(home))
    result = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", "sql", *args], env=env, capture_output=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _select(values: dict[str, str]) -> str:
    def literal(text: str) -> str:
        return "chr(" + ") || chr(".join(str(ord(c)) for c in text) + ")"  # no control byte in the query text

    return "SELECT " + ", ".join(f"{literal(v)} AS {k}" for k, v in values.items())


@pytest.mark.slow
def test_table_output_shows_control_characters_as_escapes(tmp_path: Path) -> None:
    text = _cli(tmp_path / "home", _select(HOSTILE)).decode()
    lines = text.splitlines()
    assert len(lines) == 4  # header, rule, one row, count: no value added a line
    assert not _CONTROL.search(text.replace("\n", "")), repr(text)
    for shown in ("\\x1b[31mred", "ding\\x07", "\\x1b]8;;https://attacker.example/", "safe\\rEVIL", "\\x9b31m"):
        assert shown in lines[2]
    assert "abc\\u202edcb" in lines[2] and "one\\ntwo" in lines[2]


@pytest.mark.slow
def test_raw_keeps_the_bytes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    table = _cli(home, _select(HOSTILE), "--raw").decode()
    for value in HOSTILE.values():
        assert value in table
    assert _cli(home, "SELECT '=1+2' AS f", "--format", "csv", "--raw").decode().splitlines() == ["f", "=1+2"]


FORMULAS = {
    "eq": '=HYPERLINK("http://x")',
    "plus": "+1+2",
    "minus": "-1+2",
    "at": "@SUM(A1)",
    "tab": "\t=1",
    "cr": "\r=1",
}


@pytest.mark.slow
def test_csv_cells_that_would_run_as_formulas_are_prefixed(tmp_path: Path) -> None:
    query = _select(FORMULAS).replace("SELECT ", "SELECT -5 AS number, 'plain' AS plain, ", 1)
    rows = list(csv.reader(io.StringIO(_cli(tmp_path / "home", query, "--format", "csv").decode())))
    assert rows[0] == ["number", "plain", *FORMULAS]
    assert rows[1] == ["-5", "plain", *("'" + v for v in FORMULAS.values())]


# --- the result is the same through the process --------------------------------------------------------------


def test_values_come_back_as_the_python_client_returns_them(lake: Settings) -> None:
    query = (
        "SELECT sum(i) AS huge, INTERVAL 3 MONTH + INTERVAL 2 DAY AS span, MAP([1, 2], ['a', 'b']) AS m, "
        "[1, 2] AS l, {'x': 1} AS s, 12.5::DECIMAL(10, 2) AS d, NULL AS n FROM range(10) t(i)"
    )
    import duckdb

    expected = duckdb.connect().execute(query).fetchall()
    columns, rows = run_query(lake, query)
    assert columns == ["huge", "span", "m", "l", "s", "d", "n"]
    assert rows == expected


def test_a_query_runs_from_a_process_with_other_threads(lake: Settings) -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)  # a process with threads is not forked directly
    worker.start()
    try:
        assert run_query(lake, "SELECT 41 + 1 AS answer") == (["answer"], [(42,)])
    finally:
        stop.set()
        worker.join()


@pytest.mark.slow
def test_a_script_without_a_main_guard_can_query_from_threads(lake: Settings, tmp_path: Path) -> None:
    # The fork server's children must not re-run the caller's script (it would query again, recursively).
    script = tmp_path / "script.py"
    script.write_text(
        "import threading\n"
        "from common.settings import load_settings\n"
        "from warehouse.query import run_query\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=stop.wait, daemon=True).start()\n"
        "print(run_query(load_settings(), 'SELECT 42 AS x')[1])\n"
        "stop.set()\n"
    )
    env = {**os.environ, "TRAJLAKE_HOME": str(lake.home_dir)}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[(42,)]"


def test_rows_stream_in_batches(lake: Settings) -> None:
    with stream_query(lake, "SELECT * FROM range(100000)") as result:
        sizes = [batch.num_rows for batch in result.batches()]
    assert sum(sizes) == 100_000 and len(sizes) > 1


def test_the_table_renders_a_bounded_number_of_rows() -> None:
    out = io.StringIO()
    count = write_rows(
        ["i"], ([(i,) for i in range(j, j + 10)] for j in range(0, 100, 10)), "table", out, table_rows=25
    )
    lines = out.getvalue().splitlines()
    assert count == 100 and len(lines) == 2 + 25 + 1
    assert lines[-1] == "(100 rows, the first 25 shown; --format csv or json prints every row)"


# --- fuzzers of the SQL text boundary -----------------------------------------------------------------------------

_SQL_WORDS = st.sampled_from(
    [
        "SELECT",
        "FROM",
        "WHERE",
        "WITH",
        "AS",
        "NOT",
        "MATERIALIZED",
        "UNION",
        "ALL",
        "EXPLAIN",
        "ANALYZE",
        "COPY",
        "TO",
        "INSERT",
        "DELETE",
        "SET",
        "PRAGMA",
        "ATTACH",
        "LOAD",
        "CALL",
        "(",
        ")",
        ",",
        ";",
        "*",
        "'x'",
        "1",
        "events",
        "range(3)",
        "read_text('/etc/passwd')",
        "lpad('x', 10, 'y')",
        "--",
        "/*",
        "*/",
        "\x1b[31m",
        "chr(27)",
        "DESCRIBE",
        "SUMMARIZE",
        "VALUES",
        "RECURSIVE",
        "getenv('HOME')",
        "query('SELECT 1')",
    ]
)
_SQL_TEXT = st.lists(_SQL_WORDS | st.text(max_size=8), max_size=14).map(" ".join)


@pytest.mark.slow
@pytest.mark.fuzz
@settings(deadline=None)
@given(query=_SQL_TEXT)
def test_fuzz_the_statement_check_fails_only_with_one_line_query_errors(query: str) -> None:
    try:
        statement = check_read_only(query)
    except QueryError as exc:
        assert "\n" not in str(exc)
    else:
        assert statement.type.name in ("SELECT", "EXPLAIN")


@pytest.fixture(scope="module")
def fuzz_lake(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    settings = load_settings(
        home=tmp_path_factory.mktemp("fuzz-lake"),
        sql_timeout_s=5.0,
        sql_memory_limit="64MB",
        sql_memory_headroom="128MB",
    )
    open_views(settings).close()
    return settings


@pytest.mark.slow
@pytest.mark.fuzz
@settings(deadline=None)
@given(query=_SQL_TEXT)
def test_fuzz_any_query_text_gives_rows_or_one_line_error(fuzz_lake: Settings, query: str) -> None:
    started = time.monotonic()
    try:
        columns, rows = run_query(fuzz_lake, query)
    except QueryError as exc:
        assert "\n" not in str(exc).strip()
    else:
        assert all(len(row) == len(columns) for row in rows)
    assert time.monotonic() - started < fuzz_lake.sql_timeout_s + 15  # the deadline holds for any text


# Cell text: anything, text made of terminal-control material, and text starting like a formula.
_CELLS = st.one_of(
    st.text(),
    st.text(st.sampled_from(list("\x1b\x07\r\n\t\x00\x7f\x9b\x9d\u202e\u2066[];8mab\\"))),
    st.builds(str.__add__, st.sampled_from(["=", "+", "-", "@", "\t", "\r"]), st.text()),
)


@pytest.mark.fuzz
@settings(deadline=None)
@given(values=st.lists(_CELLS, min_size=1, max_size=5))
def test_fuzz_table_cells_never_reach_the_terminal_as_controls(values: list[str]) -> None:
    text = format_rows([f"c{i}" for i in range(len(values))], [tuple(values)], "table")
    assert not _CONTROL.search(text.replace("\n", ""))
    assert len(text.splitlines()) == 4  # header, rule, the row, the count
    assert all(escape_controls(v) == v for v in values if not _CONTROL.search(v))


@pytest.mark.fuzz
@settings(deadline=None)
@given(values=st.lists(_CELLS, min_size=1, max_size=5))
def test_fuzz_csv_cells_round_trip_with_formulas_defused(values: list[str]) -> None:
    text = format_rows([f"c{i}" for i in range(len(values))], [tuple(values)], "csv")
    row = list(csv.reader(io.StringIO(text)))[1:]
    if row:  # a single empty value is an empty line
        for original, cell in zip(values, row[0], strict=True):
            assert cell == original or (cell == "'" + original and original[:1] in "=+-@\t\r")
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
