"""Export memory: peak RSS of ``trajlake export`` over a large lakehouse vs one ten times smaller.

The lakehouse is written directly (trajectories, steps and scores rows of synthetic sessions, no
fleet, no assembly) so the benchmark measures the export alone. A ratio near 1 means the export
streams: memory follows a batch, not the number of trajectories.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.harness import Figure, bench_home, child_peak_rss, cli_env, print_figures
from common.settings import Settings
from warehouse.lakehouse import Lakehouse
from warehouse.tables import SCORES, STEPS, TRAJECTORIES, TableSpec

_START = datetime(2026, 1, 1, tzinfo=UTC)


def _rows(spec: TableSpec, n: int, columns: dict[str, Any]) -> pa.Table:
    """``n`` rows of ``spec`` with ``columns`` given and every other column null."""
    schema = spec.arrow_schema()
    arrays = [pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def write_synthetic_lake(lake: Lakehouse, sessions: int, steps: int = 8, chunk: int = 50_000) -> None:
    """``sessions`` scored trajectories of ``steps`` steps each, written in chunks of ``chunk`` sessions."""
    tables = {spec.name: lake.table(spec.name) for spec in (TRAJECTORIES, STEPS, SCORES)}
    for start in range(0, sessions, chunk):
        ids = [f"{i:012d}" for i in range(start, min(start + chunk, sessions))]
        n = len(ids)
        started = [_START + timedelta(seconds=i) for i in range(start, start + n)]
        families = [f"family-{i % 997}" for i in range(start, start + n)]
        tasks = [f"task-{i % 5000}" for i in range(start, start + n)]
        tables["trajectories"].append(
            _rows(
                TRAJECTORIES,
                n,
                {
                    "session_id": ids,
                    "task_id": tasks,
                    "task_type": ["swe"] * n,
                    "task_family": families,
                    "status": ["completed"] * n,
                    "started_at": started,
                    "agent_name": ["bench-agent"] * n,
                    "policy_version": [f"p{i % 3}" for i in range(start, start + n)],
                    "instruction": [f"Fix the failing test in module {i}." for i in range(start, start + n)],
                },
            )
        )
        m = n * steps
        tables["steps"].append(
            _rows(
                STEPS,
                m,
                {
                    "session_id": [s for s in ids for _ in range(steps)],
                    "step_index": [k for _ in ids for k in range(steps)],
                    "task_id": [t for t in tasks for _ in range(steps)],
                    "task_type": ["swe"] * m,
                    "ts": [t for t in started for _ in range(steps)],
                    "tool_name": ["bash"] * m,
                    "tool_call_id": [f"call_{k}" for _ in ids for k in range(steps)],
                    "arguments": [f'{{"command": "pytest -q tests/test_{k}.py"}}' for _ in ids for k in range(steps)],
                    "command": [f"pytest -q tests/test_{k}.py" for _ in ids for k in range(steps)],
                    "thought": ["Run the tests to see what fails."] * m,
                    "output": [("collected 12 items\n" + "." * 120 + "\n12 passed in 0.31s") for _ in range(m)],
                    "exit_code": [0] * m,
                },
            )
        )
        tables["scores"].append(
            _rows(
                SCORES,
                n,
                {
                    "session_id": ids,
                    "task_id": tasks,
                    "task_type": ["swe"] * n,
                    "completion": [1.0] * n,
                    "validity": [1.0] * n,
                    "novelty": [0.5] * n,
                    "quality": [0.9] * n,
                    "security_flagged": [False] * n,
                    "failure_cause": [None] * n,
                    "exportable": [True] * n,
                    "flags": [""] * n,
                    "task_family": families,
                },
            )
        )


def export_peak_rss(settings: Settings, fmt: str, out: Path, parquet: bool = False) -> tuple[int, float]:
    """Peak RSS (bytes) and seconds of ``trajlake export --format fmt`` as a child process."""
    args = ["export", "--format", fmt, "--origin", "all", "--out", str(out), "--min-quality", "0"] + (
        ["--parquet"] if parquet else []
    )
    return child_peak_rss(args, cli_env(settings))


def bench_export(sessions: int = 200_000, steps: int = 8, fmt: str = "rl", parquet: bool = False) -> dict[str, Any]:
    """Export peak RSS with ``sessions`` trajectories vs ten times fewer (same steps per session)."""
    small = max(sessions // 10, 1)
    measured: dict[int, tuple[int, float]] = {}
    for size in (small, sessions):
        with bench_home(kafka=False) as settings, tempfile.TemporaryDirectory(prefix="trajlake-export-") as out:
            write_synthetic_lake(Lakehouse.open(settings), size, steps)
            measured[size] = export_peak_rss(settings, fmt, Path(out) / "set", parquet)
    (small_rss, small_s), (big_rss, big_s) = measured[small], measured[sessions]
    figures = [
        Figure(
            f"export --format {fmt}{' --parquet' if parquet else ''} peak RSS, {sessions:,} vs {small:,} trajectories",
            big_rss / 2**20,
            small_rss / 2**20,
            "MiB",
            higher_is_better=False,
        ),
        Figure("export throughput", sessions / big_s, small / small_s, "trajectories/s"),
    ]
    result = {
        "sessions": sessions,
        "steps_per_session": steps,
        "peak_rss_mib": big_rss / 2**20,
        "baseline_peak_rss_mib": small_rss / 2**20,
        "export_s": big_s,
        "baseline_export_s": small_s,
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("export", figures, result)
    return result
