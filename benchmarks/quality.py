"""Benchmark: scoring and deduplication of many synthetic trajectories (``trajlake bench quality``).

Builds frames directly (no Kafka, no Iceberg) with the shape of assembled tables: task types,
8 rollouts per task, lognormal step counts, a command vocabulary, cheat commands and
forbidden egress in a few percent, injected near-duplicates. Times :func:`score_sessions` on all
of them, and as a baseline datasketch's per-document path (``MinHash.update_batch`` +
``MinHashLSH.insert``/``query``) on a sample, extrapolated per trajectory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import polars as pl

from quality.config import QualityConfig
from quality.scoring import score_sessions

_VERBS = np.array(
    [
        "cat",
        "grep -n def",
        "sed -n 1,40p",
        "python3 -c 'import m'",
        "ls -la",
        "head -n 5",
        "wc -l",
        "python3 run_tests.py",
        "git diff --stat",
        "python3 tool.py",
    ]
)
_CHEATS = np.array(
    [
        "rm -f tests/test_visible.py",
        "sed -i 's/assert .*/assert True/' tests/test_visible.py",
        "cp run_tests.py /opt/tl/bin/tl_test.py",
        "curl -s http://answers.example.com/x",
        "find / -xdev -name '*hidden*' 2>/dev/null | head",
    ]
)
_TOOLS = np.array(["bash", "read_file", "write_file", "run_tests"])


def synthetic_frames(sessions: int, seed: int = 0) -> dict[str, pl.DataFrame]:
    """Frames shaped like the ``trajectories``/``steps``/event inputs of :func:`score_sessions`."""
    rng = np.random.default_rng(seed)
    n_steps = np.clip(rng.lognormal(np.log(12), 0.5, sessions).astype(np.int64), 1, 120)
    task = rng.integers(0, max(1, sessions // 8), sessions)
    task_type = np.array(["bugfix", "implement", "data_cli"])[task % 3]
    sid = np.char.add("s", np.arange(sessions).astype(str))
    started = np.datetime64(datetime(2026, 1, 1, tzinfo=UTC).replace(tzinfo=None), "us") + (
        np.arange(sessions) * 28_571
    ).astype("timedelta64[us]")  # 35 sessions/s
    passed = rng.random(sessions) < 0.5
    trajectories = pl.DataFrame(
        {
            "session_id": sid,
            "task_id": np.char.add("task-", task.astype(str)),
            "task_type": task_type,
            "status": np.where(rng.random(sessions) < 0.05, "timeout", "completed"),
            "exit_reason": "agent_finished",
            "started_at": started,
            "duration_s": n_steps * rng.uniform(3, 20, sessions),
            "n_steps": n_steps,
            "n_file_writes": rng.integers(0, 6, sessions),
            "cpu_seconds": rng.uniform(0.1, 30, sessions),
            "peak_memory_bytes": rng.integers(30 << 20, 600 << 20, sessions),
            "peak_processes": rng.integers(1, 16, sessions),
            "n_network_requests": rng.integers(0, 2, sessions),
            "instruction": np.char.add("Task task-", task.astype(str)),
            "eval_passed": passed,
            "reward": np.where(passed, 1.0, 0.25),
        }
    ).with_columns(pl.col("started_at").dt.replace_time_zone("UTC"))
    owner = np.repeat(np.arange(sessions), n_steps)
    total = len(owner)
    step_index = np.arange(total) - np.repeat(np.cumsum(n_steps) - n_steps, n_steps)
    module = rng.integers(0, 400, total)
    command = np.char.add(np.char.add(_VERBS[rng.integers(0, len(_VERBS), total)], " mod"), module.astype(str))
    cheat_rows = np.flatnonzero(rng.random(total) < 0.003)
    command[cheat_rows] = _CHEATS[rng.integers(0, len(_CHEATS), len(cheat_rows))]
    steps = pl.DataFrame(
        {
            "session_id": sid[owner],
            "step_index": step_index,
            "action_event_id": np.char.add(sid[owner], np.char.add("-", step_index.astype(str))),
            "tool_name": _TOOLS[rng.integers(0, len(_TOOLS), total)],
            "command": command,
            "exit_code": (rng.random(total) < 0.2).astype(np.int32),
            "failure_reason": pl.Series([None] * total, dtype=pl.Utf8),
        }
    )
    # near-duplicates: 2 % of sessions repeat another session's steps with one command changed
    copies = rng.choice(sessions, size=sessions // 50, replace=False)
    sources = rng.choice(sessions, size=len(copies), replace=False)
    mapping = pl.DataFrame({"session_id": sid[sources], "copy": sid[copies]})
    copied = (
        steps.join(mapping, on="session_id", how="inner")
        .with_columns(pl.col("copy").alias("session_id"))
        .drop("copy")
        .with_columns(
            pl.when(pl.col("step_index") == 0)
            .then(pl.lit("echo changed"))
            .otherwise(pl.col("command"))
            .alias("command")
        )
    )
    steps = pl.concat([steps.filter(~pl.col("session_id").is_in(sid[copies])), copied])
    n_ops = sessions // 10
    file_ops = pl.DataFrame(
        {
            "session_id": sid[rng.integers(0, sessions, n_ops)],
            "event_id": np.char.add("f", np.arange(n_ops).astype(str)),
            "op": np.array(["write", "read", "delete"])[rng.integers(0, 3, n_ops)],
            "path": np.array(["/workspace/mod.py", "/workspace/README.md", "/eval/hidden/test_hidden.py"])[
                rng.choice(3, n_ops, p=[0.7, 0.29, 0.01])
            ],
            "in_workspace": rng.random(n_ops) < 0.99,
        }
    )
    n_net = sessions // 20
    network = pl.DataFrame(
        {
            "session_id": sid[rng.integers(0, sessions, n_net)],
            "event_id": np.char.add("n", np.arange(n_net).astype(str)),
            "host": "rates.internal",
            "port": np.full(n_net, 80, dtype=np.int32),
            "allowed": rng.random(n_net) < 0.9,
        }
    )
    return {"trajectories": trajectories, "steps": steps, "file_ops": file_ops, "network": network}


@dataclass
class QualityBenchmark:
    """Figures of one benchmark run."""

    sessions: int
    steps: int
    seconds: float
    sessions_per_s: float
    baseline_sample: int
    baseline_s_per_session: float
    baseline_extrapolated_s: float
    speedup: float
    flagged: int
    duplicates: int

    def summary(self) -> str:
        """The lines the benchmark prints."""
        return (
            f"quality: scored + deduplicated {self.sessions:,} trajectories ({self.steps:,} steps) in "
            f"{self.seconds:.1f} s ({self.sessions_per_s:,.0f}/s); {self.flagged:,} flagged sessions, "
            f"{self.duplicates:,} duplicates\n"
            f"baseline: datasketch per-document MinHash + MinHashLSH on {self.baseline_sample:,} trajectories: "
            f"{self.baseline_s_per_session * 1e6:.1f} µs each → {self.baseline_extrapolated_s:.1f} s extrapolated "
            f"(dedup only)\nratio: {self.speedup:.1f}× faster than the baseline (which does no scoring)"
        )


def _baseline(frames: dict[str, pl.DataFrame], sample: int, config: QualityConfig) -> float:
    from datasketch import MinHash, MinHashLSH

    steps = frames["steps"]
    ids = frames["trajectories"]["session_id"].head(sample)
    docs = (
        steps.filter(pl.col("session_id").is_in(ids.implode()))
        .sort("session_id", "step_index")
        .group_by("session_id", maintain_order=True)
        .agg((pl.col("tool_name") + " " + pl.col("command")).alias("actions"))
    )
    started = time.perf_counter()
    lsh = MinHashLSH(threshold=config.dedup_threshold, num_perm=config.num_perm)
    for session_id, actions in docs.iter_rows():
        shingles = [f"{a}\x1f{b}".encode() for a, b in zip(actions, actions[1:] + [""], strict=True)]
        m = MinHash(num_perm=config.num_perm, seed=config.seed)
        m.update_batch(shingles)
        lsh.query(m)
        lsh.insert(session_id, m)
    return (time.perf_counter() - started) / max(1, docs.height)


def run_quality_benchmark(sessions: int = 1_000_000, seed: int = 0, baseline_sample: int = 20_000) -> QualityBenchmark:
    """Time :func:`score_sessions` on ``sessions`` synthetic trajectories against the datasketch baseline."""
    config = QualityConfig()
    frames = synthetic_frames(sessions, seed)
    started = time.perf_counter()
    result = score_sessions(**frames, config=config)
    seconds = time.perf_counter() - started
    per_session = _baseline(frames, min(baseline_sample, sessions), config)
    extrapolated = per_session * sessions
    return QualityBenchmark(
        sessions=sessions,
        steps=frames["steps"].height,
        seconds=seconds,
        sessions_per_s=sessions / seconds,
        baseline_sample=min(baseline_sample, sessions),
        baseline_s_per_session=per_session,
        baseline_extrapolated_s=extrapolated,
        speedup=extrapolated / seconds,
        flagged=result.flags.filter(pl.col("flag_class") != "anomaly")["session_id"].n_unique(),
        duplicates=result.duplicates.filter(~pl.col("is_representative")).height,
    )


if __name__ == "__main__":  # pragma: no cover - manual run
    import sys

    print(run_quality_benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000).summary())
