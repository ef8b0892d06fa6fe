"""Scores, failure causes, anomalies, deduplication and novelty as pure functions over frames."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
from datasketch import MinHash

from quality.config import QualityConfig
from quality.dedup import build_documents, find_duplicates, minhash_signatures
from quality.detector_metrics import evaluate_dedup
from quality.scoring import score_sessions

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EMPTY_OPS = pl.DataFrame(
    schema={"session_id": pl.Utf8, "event_id": pl.Utf8, "op": pl.Utf8, "path": pl.Utf8, "in_workspace": pl.Boolean}
)
EMPTY_NET = pl.DataFrame(
    schema={"session_id": pl.Utf8, "event_id": pl.Utf8, "host": pl.Utf8, "port": pl.Int32, "allowed": pl.Boolean}
)


def _session(
    sid: str,
    commands: list[str],
    *,
    task_id: str | None = None,
    task_type: str = "bugfix",
    status: str = "completed",
    exit_reason: str = "agent_finished",
    reward: float | None = 1.0,
    minute: int = 0,
    failure: dict[int, str] | None = None,
) -> tuple[dict, list[dict]]:
    traj = {
        "session_id": sid,
        "task_id": task_id or f"task-{sid}",
        "task_type": task_type,
        "status": status,
        "exit_reason": exit_reason,
        "started_at": T0 + timedelta(minutes=minute),
        "duration_s": 10.0 * len(commands),
        "n_steps": len(commands),
        "n_file_writes": 1,
        "cpu_seconds": 1.0,
        "peak_memory_bytes": 100 << 20,
        "peak_processes": 4,
        "n_network_requests": 0,
        "instruction": f"Fix the bug in {task_id or sid}.",
        "eval_passed": reward == 1.0,
        "reward": reward,
    }
    steps = [
        {
            "session_id": sid,
            "step_index": i,
            "action_event_id": f"{sid}-{i}",
            "tool_name": "bash",
            "command": c,
            "exit_code": 0,
            "failure_reason": (failure or {}).get(i),
        }
        for i, c in enumerate(commands)
    ]
    return traj, steps


def _frames(sessions: list[tuple[dict, list[dict]]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    traj = pl.DataFrame([t for t, _ in sessions])
    steps = pl.DataFrame(
        [s for _, ss in sessions for s in ss],
        schema={
            "session_id": pl.Utf8,
            "step_index": pl.Int64,
            "action_event_id": pl.Utf8,
            "tool_name": pl.Utf8,
            "command": pl.Utf8,
            "exit_code": pl.Int32,
            "failure_reason": pl.Utf8,
        },
    )
    return traj, steps


def _score(sessions: list[tuple[dict, list[dict]]], **config: object):
    traj, steps = _frames(sessions)
    return score_sessions(traj, steps, EMPTY_OPS, EMPTY_NET, QualityConfig(**config))  # type: ignore[arg-type]


SOLVE = ["cat a.py", "python3 run_tests.py", "mkdir -p . && cat > a.py", "python3 run_tests.py"]


def test_quality_is_the_weighted_sum_with_configurable_weights() -> None:
    result = _score([_session("a", SOLVE, reward=0.5)])
    row = result.scores.row(0, named=True)
    assert (row["completion"], row["validity"], row["novelty"]) == (0.5, 1.0, 1.0)
    assert row["quality"] == pytest.approx(0.5 * 0.5 + 0.3 + 0.2)
    custom = _score([_session("a", SOLVE, reward=0.5)], w_completion=0.8, w_validity=0.1, w_novelty=0.1)
    assert custom.scores["quality"][0] == pytest.approx(0.8 * 0.5 + 0.1 + 0.1)
    assert row["scorer_version"] == QualityConfig().scorer_version
    with pytest.raises(ValueError, match="sum to 1"):
        QualityConfig(w_completion=0.9)


def test_loop_of_identical_actions_lowers_validity_but_transient_retries_do_not() -> None:
    loop = _session("loop", ["ls", "python3 run_tests.py", "python3 run_tests.py", "python3 run_tests.py"])
    retried = _session(
        "retry",
        ["ls", "python3 run_tests.py", "python3 run_tests.py", "python3 run_tests.py"],
        failure={1: "transient (injected)", 2: "transient (injected)"},
    )
    scores = {r["session_id"]: r for r in _score([loop, retried]).scores.iter_rows(named=True)}
    assert scores["loop"]["has_loop"] and scores["loop"]["validity"] == pytest.approx(0.6)
    assert not scores["retry"]["has_loop"] and scores["retry"]["validity"] == 1.0


@pytest.mark.parametrize(
    ("status", "exit_reason", "failure", "cause", "advice", "validity"),
    [
        ("timeout", "reaper", None, "reaper_timeout", "rerun_once", 0.0),
        ("error", "sandbox died: oom", None, "infrastructure_error", "rerun", 0.0),
        ("timeout", "idle_timeout", None, "infrastructure_error", "rerun", 0.0),
        ("completed", "agent_finished", {3: "transient (injected)"}, "infrastructure_error", "rerun", 0.0),
        ("gave_up", "gave_up", None, "agent_gave_up", "do_not_rerun", 1.0),
        ("completed", "agent_finished", None, "wrong_answer", "do_not_rerun", 1.0),
    ],
)
def test_failure_cause_and_retry_advice(status, exit_reason, failure, cause, advice, validity) -> None:
    row = _score(
        [_session("x", SOLVE, status=status, exit_reason=exit_reason, reward=0.0, failure=failure)]
    ).scores.row(0, named=True)
    assert (row["failure_cause"], row["retry_advice"], row["validity"]) == (cause, advice, validity)


def test_confirmed_cheat_zeroes_completion_and_security_blocks_export() -> None:
    honest = _session("honest", SOLVE)
    cheat = _session("cheat", ["rm -f tests/test_visible.py", "python3 run_tests.py"])
    escape = _session("escape", SOLVE + ["cp a.py /opt/tl/bin/tl_test.py"])
    scores = {r["session_id"]: r for r in _score([honest, cheat, escape]).scores.iter_rows(named=True)}
    assert scores["honest"]["completion"] == 1.0 and scores["honest"]["exportable"]
    assert scores["cheat"]["completion"] == 0.0 and scores["cheat"]["failure_cause"] == "cheating"
    # behavioural: down-weighted by behavioural_weight, still a scored row
    assert scores["cheat"]["quality"] == pytest.approx(0.5 * (0.3 + 0.2))
    assert scores["escape"]["security_flagged"] and not scores["escape"]["exportable"]


def test_one_step_success_is_an_anomaly_and_a_typical_run_is_not() -> None:
    rng = np.random.default_rng(0)
    sessions = [_session(f"n{i}", [f"cmd {j}" for j in range(int(rng.integers(18, 23)))]) for i in range(40)]
    sessions.append(_session("oneshot", ["cat > a.py"]))
    sessions.append(_session("typical", [f"cmd {j}" for j in range(20)]))
    result = _score(sessions)
    anomalous = set(result.flags.filter(pl.col("flag") == "behaviour_anomaly")["session_id"])
    assert "oneshot" in anomalous and "typical" not in anomalous
    score = result.flags.filter(pl.col("session_id") == "oneshot")["score"][0]
    assert score > 3.5
    profile = result.profiles.row(0, named=True)
    assert profile["task_type"] == "bugfix" and profile["sessions"] == 42 and 18 <= profile["n_steps_p50"] <= 22


def test_signatures_match_datasketch() -> None:
    config = QualityConfig()
    docs = [np.array([1, 2, 3, 99], dtype=np.uint32), np.array([7], dtype=np.uint32)]
    index = np.concatenate([np.full(len(d), i) for i, d in enumerate(docs)])
    ours = minhash_signatures(index, np.concatenate(docs), len(docs), config)
    for i, doc in enumerate(docs):
        reference = MinHash(num_perm=config.num_perm, seed=config.seed, scheme="affine32", hashfunc=lambda x: x)
        reference.update_batch(doc.tolist())
        assert np.array_equal(ours[i], reference.hashvalues)


def _long(sid: str, task: str, minute: int, variant: int = 0) -> tuple[dict, list[dict]]:
    commands = [f"step {j} of {task}" for j in range(30)]
    if variant:
        commands[10] = f"echo something else {variant}"
    return _session(sid, commands, task_id=task, minute=minute)


def test_exact_and_near_duplicates_keep_the_best_and_spare_distinct_work() -> None:
    a = _long("a", "t1", 0)
    a_copy = _session("a_copy", [c.upper() + "  " for c in SOLVE], task_id="t9")  # cosmetic copy of b below
    b = _session("b", SOLVE, task_id="t9", minute=1, reward=0.5)
    near = _long("near", "t1", 2, variant=1)  # one of 30 actions changed
    other = _session("other", ["ls", "cat README.md", "python3 tool.py data.csv"], task_id="t3")
    result = _score([a, a_copy, b, near, other])
    dups = {r["session_id"]: r for r in result.duplicates.iter_rows(named=True)}
    assert set(dups) == {"a", "near", "a_copy", "b"}
    assert dups["a_copy"]["cluster_id"] == dups["b"]["cluster_id"] and dups["b"]["method"] == "exact"
    # the representative is the better one (reward 1.0 beats 0.5)
    assert dups["a_copy"]["is_representative"] and not dups["b"]["is_representative"]
    assert dups["near"]["cluster_id"] == "a" and dups["near"]["method"] == "minhash"
    assert 0.8 <= dups["near"]["similarity"] < 1.0
    exportable = dict(result.scores.select("session_id", "exportable").iter_rows())
    assert not exportable["b"] and exportable["a_copy"] and exportable["other"]


def test_novelty_compares_with_earlier_trajectories_of_the_same_task_only() -> None:
    first = _long("first", "t1", 0)
    again = _long("again", "t1", 5)  # identical, later
    other_task = _long("other", "t2", 3)
    novelty = dict(_score([first, again, other_task]).scores.select("session_id", "novelty").iter_rows())
    assert novelty == {"first": 1.0, "again": 0.0, "other": 1.0}


def test_documents_group_equal_sequences() -> None:
    traj, steps = _frames([_session("x", SOLVE, task_id="t"), _session("y", SOLVE, task_id="t")])
    docs = build_documents(traj, steps, QualityConfig())
    assert docs.signatures.shape == (1, QualityConfig().num_perm)
    assert find_duplicates(docs, traj.with_columns(pl.lit(1.0).alias("quality")), QualityConfig()).height == 2


def test_injected_near_duplicates_are_found() -> None:
    rng = np.random.default_rng(1)
    words = ["cat", "grep", "sed -n", "python3", "ls", "head", "wc -l", "diff"]
    sessions = [
        _session(
            f"s{i}", [f"{words[int(rng.integers(8))]} f{int(rng.integers(10**6))}.py" for _ in range(25)], minute=i
        )
        for i in range(60)
    ]
    traj, steps = _frames(sessions)
    metric = evaluate_dedup(traj, steps, n=40, seed=3)
    assert metric.positives >= 30 and metric.recall is not None and metric.recall >= 0.95 and metric.fp == 0
