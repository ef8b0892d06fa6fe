"""Incremental scoring: one new day scored on top of histories of different sizes (``trajlake bench incremental``).

A fast synthetic history writer fills the real Iceberg ``trajectories`` and ``steps`` tables of a
bench lakehouse with sessions shaped like assembled ones: the distributions and vocabularies of
:mod:`benchmarks.quality` (three task types, 8 rollouts per task, lognormal step counts, the
command vocabulary, cheat commands in 0.3 % of steps, 2 % near-duplicates), every other column of
:data:`warehouse.tables.TRAJECTORIES` / :data:`~warehouse.tables.STEPS` filled with plausible
values or nulls. Sessions start at the product's 35/s, so day partitions are real days; the
near-duplicates copy a fixed pool of trajectories, so a new day duplicates sessions of history.

For each history size H (one lakehouse grown from the smallest to the largest): write history up
to H sessions, score it (the catch-up score), append one new day of sessions, then score again.
Each scoring run is what ``trajlake score`` runs (:func:`pipelines.score.score_all`) in a fresh
child process, which reports its ``ScoreStats`` (mode, changed and rescored sessions, affected
days); the parent measures its wall seconds and the peak RSS of its process tree. Incremental
scoring is flat in history when the new-day runs at the largest and smallest H are within 1.3× of
each other (the figures' ratios here are that growth). Last, a full rescore (``force``, as
``trajlake score --force``) of the largest lakehouse: wall and peak RSS (target ≤ 4 GB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.harness import BASE_US, Figure, bench_home, cli_env, print_figures, tree_rss_bytes
from benchmarks.quality import _CHEATS, _TOOLS, _VERBS
from common.errors import ConfigError
from warehouse.lakehouse import Lakehouse
from warehouse.tables import SCORES, STEPS, TRAJECTORIES

DAY_US = 86_400_000_000
SPACING_US = 28_571  # 35 new sessions a second (3M a day), the product's reference rate
ASSEMBLY_DELAY_US = 20_000_000  # a session is assembled ~20 s after it ended (the automation's p50)
_MODULES = 400  # the quality bench's command vocabulary: verb × module
_ECHOES = 100  # a near-duplicate's changed first command: one of these
_POOL = 2_000  # trajectories the near-duplicates copy (the same pool in every batch and day)
_FAMILIES = 300  # task templates (a multiple of the 3 task types, so a family keeps one type)
_TASK_TYPES = ["bugfix", "implement", "data_cli"]
_MIB = 2**20
FORCE_RSS_TARGET_MIB = 4 * 1024
_ROOT = Path(__file__).resolve().parent.parent


def parse_sizes(text: str) -> list[int]:
    """Comma-separated positive session counts (``"1000000,5000000"``, underscores allowed), ascending.

    Raises:
        ConfigError: an entry is not a positive integer, or there is none.
    """
    sizes: list[int] = []
    for part in text.split(","):
        try:
            size = int(part.strip())
        except ValueError:
            raise ConfigError(f"history sizes: {part.strip()!r} is not a whole number of sessions") from None
        if size <= 0:
            raise ConfigError(f"history sizes: {size} is not a positive number of sessions")
        sizes.append(size)
    if not sizes:
        raise ConfigError("history sizes: none given")
    return sorted(set(sizes))


def _vocabulary() -> pa.Array:
    """Every command a synthetic step can run: verb × module, then the cheats, then the changed first commands."""
    commands = [f"{verb} mod{module}" for verb in _VERBS.tolist() for module in range(_MODULES)]
    commands += _CHEATS.tolist() + [f"echo changed {k}" for k in range(_ECHOES)]
    return pa.array(commands, pa.string())


_CHEAT_BASE = len(_VERBS) * _MODULES
_ECHO_BASE = _CHEAT_BASE + len(_CHEATS)


def _ids(prefix: str, numbers: np.ndarray, width: int) -> pa.Array:
    """``prefix-000…n`` strings (zero-padded, so they sort as the numbers do)."""
    padded = pc.utf8_lpad(pc.cast(pa.array(numbers), pa.string()), width=width, padding="0")
    return pc.binary_join_element_wise(prefix, padded, "-")


def _conform(columns: dict[str, Any], schema: pa.Schema, rows: int) -> pa.Table:
    """A table of exactly ``schema``: the given columns cast, every other one null."""
    arrays = [
        pc.cast(columns[f.name], f.type) if f.name in columns else pa.nulls(rows, f.type)
        for f in schema  # the table's own Arrow schema (field ids), so append needs no reconciling
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


@dataclass
class HistoryWriter:
    """Appends synthetic assembled sessions to the ``trajectories`` and ``steps`` tables, batch by batch.

    Sessions are numbered globally (``bench-0000000000``, …) and start :data:`SPACING_US` apart from
    :data:`~benchmarks.harness.BASE_US`; :meth:`write_day` starts a fresh UTC day. Memory is bounded by
    ``batch`` (sessions generated and appended at a time).
    """

    lake: Lakehouse
    seed: int = 0
    batch: int = 100_000
    sessions: int = 0
    next_start_us: int = BASE_US
    last_assembled_us: int = 0
    steps_written: int = 0
    seconds: float = 0.0
    _vocab: pa.Array = field(init=False, repr=False)
    _pool: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._trajectories = self.lake.table(TRAJECTORIES.name)
        self._steps = self.lake.table(STEPS.name)
        self._vocab = _vocabulary()
        rng = np.random.default_rng(self.seed)
        n = np.clip(rng.lognormal(np.log(12), 0.5, _POOL).astype(np.int64), 2, 120)
        offsets = np.cumsum(n) - n
        tools = rng.integers(0, len(_TOOLS), int(n.sum()))
        commands = rng.integers(0, len(_VERBS), int(n.sum())) * _MODULES + rng.integers(0, _MODULES, int(n.sum()))
        self._pool = (n, offsets, tools, commands)

    def write(self, sessions: int) -> float:
        """Append ``sessions`` sessions continuing the history; returns seconds taken.

        The next batch is generated while the previous one is written (Parquet encoding and
        compression release the GIL); at most one batch is in flight, so memory stays bounded.
        """
        started = time.perf_counter()
        done = 0
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-history") as pool:
            pending: Future[None] | None = None
            while done < sessions:
                n = min(self.batch, sessions - done)
                trajectories, steps = self.frames(n, self.next_start_us)
                if pending is not None:
                    pending.result()
                pending = pool.submit(self._append, trajectories, steps)
                self.sessions += n
                self.steps_written += steps.num_rows
                self.next_start_us += n * SPACING_US
                done += n
                del trajectories, steps
            if pending is not None:
                pending.result()
        pa.default_memory_pool().release_unused()  # the batches' buffers, while a scoring child runs
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        return elapsed

    def write_day(self, sessions: int) -> tuple[datetime, float]:
        """Append ``sessions`` sessions from the start of the next UTC day; returns that day and seconds taken."""
        self.next_start_us = BASE_US + ((self.next_start_us - BASE_US) // DAY_US + 1) * DAY_US
        day = datetime.fromtimestamp(self.next_start_us / 1e6, UTC)
        return day, self.write(sessions)

    def _append(self, trajectories: pa.Table, steps: pa.Table) -> None:
        # one commit per table and batch; trajectories first, as assembly commits them
        self._trajectories.append(trajectories)
        self._steps.append(steps)

    def frames(self, n: int, start_us: int) -> tuple[pa.Table, pa.Table]:
        """The next ``n`` sessions (numbered from :attr:`sessions`) as ``trajectories`` and ``steps`` rows.

        Args:
            n: sessions to generate.
            start_us: ``started_at`` of the first one (epoch micros); the rest follow at 35/s.

        Returns:
            Arrow tables of the two tables' own schemas, sorted by session (and step).
        """
        first = self.sessions
        rng = np.random.default_rng((self.seed, first))
        number = np.arange(first, first + n)
        n_steps = np.clip(rng.lognormal(np.log(12), 0.5, n).astype(np.int64), 1, 120)
        # 2 % near-duplicates: a pool trajectory's steps with the first command changed
        copies = np.flatnonzero(rng.random(n) < 0.02)
        pool_n, pool_offsets, pool_tools, pool_commands = self._pool
        picks = rng.integers(0, _POOL, len(copies))
        n_steps[copies] = pool_n[picks]
        offsets = np.cumsum(n_steps) - n_steps
        total = int(n_steps.sum())
        owner = np.repeat(np.arange(n), n_steps)
        step_index = np.arange(total) - offsets[owner]
        tool = rng.integers(0, len(_TOOLS), total)
        command = rng.integers(0, len(_VERBS), total) * _MODULES + rng.integers(0, _MODULES, total)
        cheats = np.flatnonzero(rng.random(total) < 0.003)
        command[cheats] = _CHEAT_BASE + rng.integers(0, len(_CHEATS), len(cheats))
        copy_n = n_steps[copies]
        within = np.arange(int(copy_n.sum())) - np.repeat(np.cumsum(copy_n) - copy_n, copy_n)
        target = np.repeat(offsets[copies], copy_n) + within
        source = np.repeat(pool_offsets[picks], copy_n) + within
        command[target], tool[target] = pool_commands[source], pool_tools[source]
        command[offsets[copies]] = _ECHO_BASE + rng.integers(0, _ECHOES, len(copies))
        exit_code = (rng.random(total) < 0.2).astype(np.int32)

        started = start_us + np.arange(n, dtype=np.int64) * SPACING_US
        duration_us = (n_steps * rng.uniform(3, 20, n) * 1e6).astype(np.int64)
        ended = started + duration_us
        # assembled_at in the history's own time: each session shortly after it ended, never before an
        # earlier-written one (assembly stamps only move forward), so a scoring run's watermark falls
        # between history and the new day as in production (wall-clock stamps would put the whole
        # freshly written history inside the run's watermark lag, ``TRAJLAKE_SCORE_WATERMARK_LAG_S``)
        assembled = np.maximum(np.maximum.accumulate(ended + ASSEMBLY_DELAY_US), self.last_assembled_us + 1)
        self.last_assembled_us = int(assembled[-1])
        # steps evenly inside the session; each feedback within its step's interval
        interval = duration_us // (n_steps + 1)
        ts = started[owner] + (step_index + 1) * interval[owner]
        step_duration_us = (interval[owner] * rng.uniform(0.1, 0.5, total)).astype(np.int64)
        passed = rng.random(n) < 0.5
        timeout = rng.random(n) < 0.05
        tool_counts = np.bincount(owner * len(_TOOLS) + tool, minlength=n * len(_TOOLS)).reshape(n, len(_TOOLS))
        present = tool_counts > 0
        errors = np.bincount(owner, weights=exit_code, minlength=n).astype(np.int64)
        task = number // 8
        type_index = task % len(_TASK_TYPES)
        session_id = _ids("bench", number, 10)
        task_id = _ids("task", task, 9)
        task_type = pc.take(pa.array(_TASK_TYPES), pa.array(type_index))
        ts_type = TRAJECTORIES.arrow_schema().field("started_at").type
        n_events = 2 * n_steps + 4
        input_tokens = n_steps * rng.integers(800, 2_500, n)
        output_tokens = n_steps * rng.integers(40, 300, n)
        trajectories = {
            "session_id": session_id,
            "task_id": task_id,
            "task_type": task_type,
            "sandbox_id": _ids("sbx", number, 10),
            "host_id": _ids("host", number % 64, 2),
            "image_name": pa.repeat("trajlake/task-python", n),
            "image_version": pa.repeat("1", n),
            "agent_name": pa.repeat("scripted", n),
            "agent_version": pa.repeat("1.0", n),
            "policy_version": pa.repeat("bench-v1", n),
            "status": pa.array(np.where(timeout, "timeout", "completed")),
            "exit_reason": pa.array(np.where(timeout, "timeout", "agent_finished")),
            "started_at": pa.array(started).cast(ts_type),
            "ended_at": pa.array(ended).cast(ts_type),
            "last_event_at": pa.array(ended).cast(ts_type),
            "duration_s": pa.array(duration_us / 1e6),
            "n_events": pa.array(n_events),
            "max_seq": pa.array(n_events - 1),
            "n_missing_seq": pa.array(np.zeros(n, np.int64)),
            "n_steps": pa.array(n_steps),
            "n_tool_errors": pa.array(errors),
            "n_distinct_tools": pa.array(present.sum(axis=1).astype(np.int64)),
            "tool_counts": pa.MapArray.from_arrays(
                pa.array(np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)),
                pc.take(pa.array(_TOOLS.tolist()), pa.array(np.tile(np.arange(len(_TOOLS)), n)[present.ravel()])),
                pa.array(tool_counts.ravel()[present.ravel()].astype(np.int64)),
            ),
            "n_file_writes": pa.array(rng.integers(0, 6, n)),
            "n_file_deletes": pa.array(np.zeros(n, np.int64)),
            "n_files_outside_workspace": pa.array(np.zeros(n, np.int64)),
            "n_network_requests": pa.array(rng.integers(0, 2, n)),
            "n_network_denied": pa.array(np.zeros(n, np.int64)),
            "input_tokens": pa.array(input_tokens),
            "cached_tokens": pa.array(input_tokens // 2),
            "output_tokens": pa.array(output_tokens),
            "cost_usd": pa.array(input_tokens * 3e-6 + output_tokens * 15e-6),
            "cpu_seconds": pa.array(rng.uniform(0.1, 30, n)),
            "peak_memory_bytes": pa.array(rng.integers(30 << 20, 600 << 20, n)),
            "peak_processes": pa.array(rng.integers(1, 16, n)),
            "disk_write_bytes": pa.array(rng.integers(0, 4 << 20, n)),
            "timeout_s": pa.array(np.full(n, 1200.0)),
            "instruction": pc.binary_join_element_wise("Task", task_id, " "),
            "eval_passed": pa.array(passed),
            "tests_total": pa.array(np.full(n, 10, np.int64)),
            "tests_passed": pa.array(np.where(passed, 10, rng.integers(0, 10, n))),
            "reward": pa.array(np.where(passed, 1.0, 0.25)),
            "completed": pa.array(~timeout),
            "assembled_at": pa.array(assembled).cast(ts_type),
            "task_family": pc.binary_join_element_wise(
                task_type, pc.cast(pa.array(task % _FAMILIES), pa.string()), "-"
            ),
            "processes_started": pa.array(rng.integers(1, 40, n)),
            "group_id": task_id,
            "attempt": pa.array((number % 8).astype(np.int32)),
            "exit_codes": pc.binary_join_element_wise(
                '{"0": ',
                pc.cast(pa.array(n_steps - errors), pa.string()),
                ', "1": ',
                pc.cast(pa.array(errors), pa.string()),
                "}",
                "",
            ),
        }
        step_session = pc.take(session_id, pa.array(owner))
        step_number = pc.cast(pa.array(step_index), pa.string())
        steps = {
            "session_id": step_session,
            "step_index": pa.array(step_index),
            "task_id": pc.take(task_id, pa.array(owner)),
            "task_type": pc.take(task_type, pa.array(owner)),
            "action_event_id": pc.binary_join_element_wise(step_session, step_number, "-a"),
            "seq": pa.array(2 * step_index + 2),
            "ts": pa.array(ts).cast(ts_type),
            "tool_name": pc.take(pa.array(_TOOLS.tolist()), pa.array(tool)),
            "command": pc.take(self._vocab, pa.array(command)),
            "output_tokens": pa.array(rng.integers(10, 400, total)),
            "cost_usd": pa.array(rng.uniform(1e-4, 5e-3, total)),
            "model_latency_ms": pa.array(rng.uniform(200, 4_000, total)),
            "feedback_ts": pa.array(ts + step_duration_us).cast(ts_type),
            "exit_code": pa.array(exit_code),
            "duration_ms": pa.array(step_duration_us / 1e3),
            "truncated": pa.array(np.zeros(total, bool)),
            "output_bytes": pa.array(rng.integers(0, 8_192, total)),
        }
        return (
            _conform(trajectories, self._trajectories.schema().as_arrow(), n),
            _conform(steps, self._steps.schema().as_arrow(), total),
        )


_SCORE_CHILD = """
import json
from common.settings import load_settings
from pipelines.score import score_all
from warehouse.lakehouse import Lakehouse
print(json.dumps(score_all(Lakehouse.open(load_settings()), force={force}).as_dict(), default=str))
"""


@dataclass
class ScoreRun:
    """One scoring child: wall time, peak RSS of its process tree, its ``ScoreStats``, the ``scores`` rows after it."""

    wall_s: float
    peak_rss_mib: float
    scores_rows: int
    scores_sessions: int
    stats: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """Plain dict: the measurements and the run's own counters (mode, changed and rescored sessions, days)."""
        keep = (
            "mode",
            "sessions",
            "changed_sessions",
            "rescored_sessions",
            "affected_days",
            "closed_sets",
            "seconds",
            "skipped",
            "phases",
        )
        return {
            "wall_s": self.wall_s,
            "peak_rss_mib": self.peak_rss_mib,
            "scores_rows": self.scores_rows,
            "scores_sessions": self.scores_sessions,
            **{key: self.stats[key] for key in keep if key in self.stats},
        }


def score_child(lake: Lakehouse, force: bool = False) -> ScoreRun:
    """Run ``score_all`` (what ``trajlake score [--force]`` runs) in a fresh child process and measure it.

    The child prints its :class:`~pipelines.score.ScoreStats` as JSON; the parent samples the RSS of
    the child's process tree every 0.1 s, then counts the ``scores`` rows the run left.

    Raises:
        RuntimeError: the child exited non-zero (its stderr tail is in the message).
    """
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-c", _SCORE_CHILD.format(force=force)],
            env={**os.environ, **cli_env(lake.settings), "PYTHONPATH": str(_ROOT)},
            cwd=_ROOT,
            stdout=stdout,
            stderr=stderr,
        )
        peak = 0
        while child.poll() is None:
            peak = max(peak, tree_rss_bytes(child.pid))
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        stdout.seek(0)
        stderr.seek(0)
        if child.returncode != 0:
            raise RuntimeError(f"score child exited {child.returncode}: {stderr.read()[-2000:]}")
        stats = json.loads(stdout.read().strip().splitlines()[-1])
    scores = lake.table(SCORES.name)
    rows = scores.scan(selected_fields=("session_id",)).to_arrow()
    return ScoreRun(
        wall_s=seconds,
        peak_rss_mib=peak / _MIB,
        scores_rows=rows.num_rows,
        scores_sessions=pc.count_distinct(rows.column("session_id")).as_py(),
        stats=stats,
    )


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def bench_incremental(
    history: list[int] | None = None,
    day: int = 100_000,
    force: bool = True,
    batch: int = 100_000,
    seed: int = 0,
    home: Path | None = None,
) -> dict[str, Any]:
    """Score one new day of ``day`` sessions on top of each history size; then a full rescore of the largest.

    Args:
        history: history sizes in sessions (default 1M and 5M); one lakehouse grows through them.
        day: sessions of the new day appended after each history.
        force: also time ``trajlake score --force`` on the largest lakehouse.
        batch: sessions generated and appended at a time (bounds the writer's memory).
        seed: seed of the synthetic sessions.
        home: TRAJLAKE_HOME to use (a temporary directory by default).

    Returns:
        Figures (new-day wall and RSS growth from the smallest to the largest history, writer
        throughput, full rescore), and per history size the runs' measurements under ``runs``.
    """
    sizes = sorted(set(history or [1_000_000, 5_000_000]))
    runs: list[dict[str, Any]] = []
    rescore: ScoreRun | None = None
    with bench_home(home, kafka=False) as settings:
        lake = Lakehouse.open(settings)
        writer = HistoryWriter(lake, seed=seed, batch=batch)
        for size in sizes:
            writer.write(max(0, size - writer.sessions))
            h = writer.sessions
            catch_up = score_child(lake)
            new_day, _ = writer.write_day(day)
            run = score_child(lake)
            runs.append(
                {
                    "history": h,
                    "day": new_day.date().isoformat(),
                    "catch_up": catch_up.as_dict(),
                    "new_day": run.as_dict(),
                }
            )
        if force:
            rescore = score_child(lake, force=True)
        writer_rate = writer.sessions / writer.seconds if writer.seconds else 0.0
    first, last = runs[0], runs[-1]
    figures = [Figure("history writer", writer_rate, 50_000, "sessions/s")]
    if len(runs) > 1:
        # The ratio is the growth from the smallest to the largest history (target ≤ 1.3×).
        figures += [
            Figure(
                f"new day of {day:,} wall, on {last['history']:,} history vs on {first['history']:,}",
                last["new_day"]["wall_s"],
                first["new_day"]["wall_s"],
                "s",
            ),
            Figure(
                f"new day of {day:,} peak RSS, on {last['history']:,} history vs on {first['history']:,}",
                last["new_day"]["peak_rss_mib"],
                first["new_day"]["peak_rss_mib"],
                "MiB",
            ),
        ]
    if rescore is not None:
        figures += [
            Figure(
                f"full rescore of {rescore.scores_rows:,} peak RSS vs the 4 GB target",
                rescore.peak_rss_mib,
                FORCE_RSS_TARGET_MIB,
                "MiB",
                higher_is_better=False,
            ),
            Figure(
                f"new day score vs full rescore, {last['history']:,} history",
                last["new_day"]["wall_s"],
                rescore.wall_s,
                "s",
                higher_is_better=False,
            ),
        ]
    printed: dict[str, Any] = {
        "sessions_written": writer.sessions,
        "steps_written": writer.steps_written,
        "writer_s": writer.seconds,
    }
    for entry in runs:
        h = entry["history"]
        for phase in ("catch_up", "new_day"):
            stats = entry[phase]
            printed[f"{h}: {phase} score wall_s"] = stats["wall_s"]
            printed[f"{h}: {phase} score peak_rss_mib"] = stats["peak_rss_mib"]
            counts = " / ".join(
                _count(stats.get(key)) for key in ("changed_sessions", "rescored_sessions", "scores_rows")
            )
            printed[f"{h}: {phase} score sessions changed / rescored / scores rows"] = (
                f"{counts} ({stats.get('mode', '?')}, {_count(stats.get('affected_days'))} days, "
                f"{_count(stats.get('closed_sets'))} closed sets)"
            )
            if phase == "new_day" and stats.get("phases"):
                # where the run's time went: what grows with history shows here first
                printed[f"{h}: new_day phases s"] = ", ".join(f"{k} {v:.2f}" for k, v in stats["phases"].items())
    if rescore is not None:
        printed["full rescore wall_s"] = rescore.wall_s
        printed["full rescore peak_rss_mib"] = rescore.peak_rss_mib
    print_figures("incremental", figures, printed)
    return {
        "history": sizes,
        "day": day,
        "sessions_written": writer.sessions,
        "steps_written": writer.steps_written,
        "writer_sessions_per_s": writer_rate,
        "runs": runs,
        "force": rescore.as_dict() if rescore is not None else None,
        "figures": [f.as_dict() for f in figures],
    }
