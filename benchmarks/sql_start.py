"""What running a query in its own process costs: ``select 1`` isolated vs in the calling process.

Three figures, each against a baseline measured in the same run on the same (empty) lakehouse:

* ``in-process call``: :func:`warehouse.sql.run_query` (child process, forked directly) vs the
  same work on the caller's own connection (open the locked views, check, execute);
* ``with threads``: the same call from a process with another thread, which goes through the
  fork server (started once, before the timing);
* ``command line``: ``trajlake sql "select 1"`` end to end vs a fresh interpreter doing the
  same work in-process (the CLI's imports, settings, views, query, table) — what a user waits for.

Both sides open the views as a query does: from the view plan (:mod:`warehouse.view_plan`), saved
before the timing, so the figures are the isolation's cost alone (``trajlake bench startup``
compares with the plan turned off).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import Figure, bench_home, cli_env, print_figures
from common.settings import Settings
from warehouse.query import run_query
from warehouse.sql import check_read_only, open_views
from warehouse.view_plan import open_planned_views

#: The command's work without the query process: same imports (the CLI's), views, check, query, table.
_IN_PROCESS = (
    "import trajlake.cli\n"
    "from common.settings import load_settings\n"
    "from warehouse.sql_lock import check_read_only\n"
    "from warehouse.sql_output import format_rows\n"
    "from warehouse.view_plan import open_planned_views\n"
    "con = open_planned_views(load_settings())\n"
    "cursor = con.execute(check_read_only('select 1', con))\n"
    "print(format_rows([d[0] for d in cursor.description], cursor.fetchall(), 'table'))\n"
)


def _median(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _in_process(settings: Settings) -> None:
    con = open_planned_views(settings)
    assert con is not None, "the view plan was saved before the timing"
    try:
        con.execute(check_read_only("select 1", con)).fetchall()
    finally:
        con.close()


def _run(args: list[str], env: dict[str, str]) -> None:
    import os

    subprocess.run(args, env={**os.environ, **env}, check=True, capture_output=True)


def bench_sql_start(repeat: int = 10) -> dict[str, Any]:
    """Median seconds of ``select 1`` isolated vs in-process (see the module); prints and returns the figures."""
    with bench_home(kafka=False) as settings:
        open_views(settings, save_plan=True).close()  # tables and plan exist: every run opens the same views
        run_query(settings, "select 1")  # warm the page cache and the catalog
        isolated = _median(lambda: run_query(settings, "select 1"), repeat)
        direct = _median(lambda: _in_process(settings), repeat)

        stop = threading.Event()
        worker = threading.Thread(target=stop.wait, daemon=True)
        worker.start()
        try:
            run_query(settings, "select 1")  # starts the fork server
            served = _median(lambda: run_query(settings, "select 1"), repeat)
        finally:
            stop.set()
            worker.join()

        env = cli_env(settings)
        command = _median(lambda: _run([sys.executable, "-m", "trajlake.cli", "sql", "select 1"], env), repeat)
        baseline = _median(lambda: _run([sys.executable, "-c", _IN_PROCESS], env), repeat)

    figures = [
        Figure("in-process call (fork)", isolated, direct, "s", higher_is_better=False),
        Figure("with threads (fork server)", served, direct, "s", higher_is_better=False),
        Figure("command line `trajlake sql 'select 1'`", command, baseline, "s", higher_is_better=False),
    ]
    result: dict[str, Any] = {
        "repeat": repeat,
        "child_overhead_s": isolated - direct,
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("sql-start", figures, result)
    return result
