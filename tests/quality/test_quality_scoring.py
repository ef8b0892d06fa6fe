"""Scores, failure causes, anomalies, deduplication and novelty as pure functions over frames."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl
import pytest
from datasketch import MinHash

from quality.anomalies import MIN_GROUP
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


def _score(sessions: list[tuple[dict, list[dict]]], file_ops=None, context=None, **config: Any):
    traj, steps = _frames(sessions)
    ops = EMPTY_OPS if file_ops is None else pl.DataFrame(file_ops, schema=EMPTY_OPS.schema, orient="row")
    return score_sessions(traj, steps, ops, EMPTY_NET, QualityConfig(**config), context)


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
        # imported runs: the framework's exit status decides
        (
            "error",
            "InternalServerError: litellm.InternalServerError: DeepseekException - [SSL: UNEXPECTED_EOF]",
            None,
            "infrastructure_error",
            "rerun",
            0.0,
        ),
        (
            "error",
            "Timeout: litellm.Timeout: Connection timed out after 600.0 seconds.",
            None,
            "infrastructure_error",
            "rerun",
            0.0,
        ),
        ("failed", "RateLimitError: 429 Too Many Requests", None, "infrastructure_error", "rerun", 0.0),
        ("failed", "LimitsExceeded", None, "limit_reached", "rerun_with_higher_limits", 1.0),
        ("failed", "exit_cost", None, "limit_reached", "rerun_with_higher_limits", 1.0),
        ("completed", "Submitted", "unevaluated", "unevaluated", "evaluate", 1.0),
    ],
)
def test_failure_cause_and_retry_advice(status, exit_reason, failure, cause, advice, validity) -> None:
    unevaluated = failure == "unevaluated"
    session = _session(
        "x",
        SOLVE,
        status=status,
        exit_reason=exit_reason,
        reward=None if unevaluated else 0.0,
        failure=None if unevaluated else failure,
    )
    if unevaluated:
        session[0]["eval_passed"] = None
    row = _score([session]).scores.row(0, named=True)
    assert (row["failure_cause"], row["retry_advice"], row["validity"]) == (cause, advice, validity)


def test_graded_governance_suspicion_confirmed_cheat_and_security() -> None:
    honest = _session("honest", SOLVE)
    suspect = _session("suspect", SOLVE)  # edits a pristine test, but the evaluator never runs it
    forged = _session("forged", SOLVE)  # the evaluator says its verdict was tampered with
    framework = _session("framework", SOLVE)  # a conftest.py inside the evaluated deliverable
    escape = _session("escape", SOLVE + ["cp a.py /etc/cron.d/job"])
    ops = [
        ("suspect", "f1", "write", "/workspace/tests/test_visible.py", True),
        ("framework", "f2", "create", "/workspace/conftest.py", True),
    ]
    context = pl.DataFrame(
        {
            "session_id": ["forged", "framework"],
            "eval_details": [
                json.dumps({"evaluator_tampered": ["forged result frame"]}),
                json.dumps({"deliverable": {"conftest.py": "x", "a.py": "y"}}),
            ],
        }
    )
    sessions = [honest, suspect, forged, framework, escape]
    scores = {r["session_id"]: r for r in _score(sessions, ops, context).scores.iter_rows(named=True)}
    assert scores["honest"]["completion"] == 1.0 and scores["honest"]["exportable"] and scores["honest"]["flags"] == ""
    # suspicion: the verdict stands, quality × the flag's weight, exported with the flag in the record
    assert scores["suspect"]["completion"] == 1.0 and scores["suspect"]["failure_cause"] == "success"
    assert scores["suspect"]["quality"] == pytest.approx(0.5 * 1.0)
    assert scores["suspect"]["exportable"] and scores["suspect"]["flags"] == "edited_tests"
    # confirmed: completion 0, cheating; security: never exported
    assert scores["forged"]["completion"] == 0.0 and scores["forged"]["failure_cause"] == "cheating"
    assert scores["forged"]["security_flagged"] and not scores["forged"]["exportable"]
    assert scores["framework"]["completion"] == 0.0 and not scores["framework"]["security_flagged"]
    assert scores["escape"]["security_flagged"] and not scores["escape"]["exportable"]
    # the weight is configuration, and part of the digest every row carries
    lighter = {
        r["session_id"]: r for r in _score(sessions, ops, context, behavioural_weight=0.8).scores.iter_rows(named=True)
    }
    assert lighter["suspect"]["quality"] == pytest.approx(0.8)
    assert lighter["suspect"]["config_digest"] != scores["suspect"]["config_digest"]
    custom = _score(sessions, ops, context, governance_overrides={"edited_tests": {"voids_verdict": True}})
    assert custom.scores.filter(pl.col("session_id") == "suspect")["completion"][0] == 0.0


def test_one_step_success_is_an_anomaly_and_a_typical_run_is_not() -> None:
    rng = np.random.default_rng(0)
    sessions = [
        _session(f"n{i}", [f"cmd {j}" for j in range(int(rng.integers(18, 23)))]) for i in range(MIN_GROUP + 10)
    ]
    sessions.append(_session("oneshot", ["cat > a.py"]))
    sessions.append(_session("typical", [f"cmd {j}" for j in range(20)]))
    result = _score(sessions)
    anomalous = set(result.flags.filter(pl.col("flag") == "behaviour_anomaly")["session_id"])
    assert "oneshot" in anomalous and "typical" not in anomalous


def test_using_less_of_a_resource_is_no_anomaly_using_far_more_is() -> None:
    """A session that hung writes nothing and peaks low; one that wrote twenty times the usual is worth a look.

    Resource features count on their high side only (the fleet's honest ``hang`` policy was flagged
    on every session for ``disk_write_bytes`` 0); steps still count both ways (one step where the
    others need twenty).
    """
    rng = np.random.default_rng(1)
    sessions = []
    for i in range(MIN_GROUP + 10):
        traj, steps = _session(f"n{i}", [f"cmd {j}" for j in range(20)])
        traj.update(disk_write_bytes=int(rng.integers(4000, 6000)), n_file_writes=int(rng.integers(2, 4)))
        sessions.append((traj, steps))
    hung, hung_steps = _session("hung", [f"cmd {j}" for j in range(20)], status="timeout", reward=0.0)
    hung.update(disk_write_bytes=0, n_file_writes=0, cpu_seconds=0.0, peak_memory_bytes=4 << 20, peak_processes=1)
    writer, writer_steps = _session("writer", [f"cmd {j}" for j in range(20)])
    writer.update(disk_write_bytes=900_000, n_file_writes=3)
    oneshot, oneshot_steps = _session("oneshot", ["cat > a.py"])
    oneshot.update(disk_write_bytes=5000, n_file_writes=3)
    result = _score([*sessions, (hung, hung_steps), (writer, writer_steps), (oneshot, oneshot_steps)])
    flags = result.flags.filter(pl.col("flag") == "behaviour_anomaly")
    assert set(flags["session_id"]) == {"writer", "oneshot"}
    evidence = dict(zip(flags["session_id"], flags["evidence"], strict=True))
    assert set(json.loads(evidence["writer"])["features"]) == {"disk_write_bytes"}
    assert set(json.loads(evidence["oneshot"])["features"]) == {"n_steps", "duration_s"}


def _in_profile(session: tuple[dict, list[dict]], origin: str, family: str) -> tuple[dict, list[dict]]:
    traj, steps = session
    return {**traj, "origin": origin, "task_family": family}, steps


def test_a_profile_flags_nothing_until_it_has_enough_sessions() -> None:
    """The same one-step outlier: unflagged in a profile of MIN_GROUP − 1 others, flagged at MIN_GROUP."""
    for n, flagged in ((MIN_GROUP - 2, False), (MIN_GROUP, True)):
        sessions = [_session(f"n{i}", [f"cmd {j}" for j in range(20)]) for i in range(n)]
        sessions.append(_session("oneshot", ["cat > a.py"]))
        anomalous = set(_score(sessions).flags.filter(pl.col("flag") == "behaviour_anomaly")["session_id"])
        assert ("oneshot" in anomalous) is flagged, (n, anomalous)
    # the minimum is configuration: a profile of 12 flags when 12 is enough
    sessions = [_session(f"n{i}", [f"cmd {j}" for j in range(20)]) for i in range(11)]
    sessions.append(_session("oneshot", ["cat > a.py"]))
    assert "oneshot" in set(_score(sessions, min_profile_sessions=12).flags["session_id"])


def test_profiles_never_mix_origins_and_compare_within_a_task_family() -> None:
    """Real sandbox runs that differ from a large synthetic load of their family are not anomalies of it."""
    load = [
        _in_profile(_session(f"s{i}", [f"cmd {j}" for j in range(20)]), "synthetic", "bugfix.clamp")
        for i in range(MIN_GROUP + 10)
    ]
    oneshot = _in_profile(_session("s-oneshot", ["cat > a.py"]), "synthetic", "bugfix.clamp")
    real = [_in_profile(_session(f"r{i}", ["cat a.py", "cat > a.py"]), "sandbox", "bugfix.clamp") for i in range(5)]
    # another family of the same task type, with its own (two-step) norm and enough sessions
    other = [
        _in_profile(_session(f"o{i}", ["cat b.py", "cat > b.py"]), "synthetic", "bugfix.median")
        for i in range(MIN_GROUP + 5)
    ]
    result = _score([*load, oneshot, *real, *other])
    anomalous = set(result.flags.filter(pl.col("flag") == "behaviour_anomaly")["session_id"])
    assert anomalous == {"s-oneshot"}, anomalous
    profiles = dict(result.profiles.select("profile", "sessions").iter_rows())
    assert profiles == {
        "synthetic/bugfix.clamp": MIN_GROUP + 11,
        "sandbox/bugfix.clamp": 5,
        "synthetic/bugfix.median": MIN_GROUP + 5,
    }
    # mixed into one profile (what a per-task-type baseline did), the real runs would all be flagged
    mixed = [_in_profile(s, "synthetic", "bugfix.clamp") for s in real]
    remixed = _score([*load, *mixed]).flags.filter(pl.col("flag") == "behaviour_anomaly")["session_id"]
    assert set(remixed) == {f"r{i}" for i in range(5)}


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


def test_novelty_compares_within_the_task_family_across_task_ids() -> None:
    commands = [f"step {j} of the clamp fix" for j in range(30)]
    first = _session("first", commands, task_id="bugfix.clamp-1a2b", minute=0)
    again = _session("again", commands, task_id="bugfix.clamp-9f8e", minute=5)  # same template, another instance
    elsewhere = _session("elsewhere", commands, task_id="implement.rle-77aa", minute=3)
    traj, steps = _frames([first, again, elsewhere])
    traj = traj.with_columns(pl.Series("task_family", ["bugfix.clamp", "bugfix.clamp", "implement.rle"]))
    result = score_sessions(traj, steps, EMPTY_OPS, EMPTY_NET, QualityConfig())
    novelty = dict(result.scores.select("session_id", "novelty").iter_rows())
    assert novelty["first"] == 1.0 and novelty["elsewhere"] == 1.0 and novelty["again"] < 0.1
    assert set(result.scores["task_family"]) == {"bugfix.clamp", "implement.rle"}


def test_sessions_without_actions_are_never_duplicates() -> None:
    # three runs of one task that executed nothing (all their model calls failed, or every tool call was
    # malformed): equal empty action sequences, yet nothing says they did the same thing
    empties = [_session(sid, [], task_id="t") for sid in ("e1", "e2", "e3")]
    traj, steps = _frames([*empties, _session("x", SOLVE, task_id="t"), _session("y", SOLVE, task_id="t")])
    docs = build_documents(traj, steps, QualityConfig())
    keys = dict(docs.sessions.select("session_id", "exact_key").iter_rows())
    assert len({keys["e1"], keys["e2"], keys["e3"]}) == 3 and keys["x"] == keys["y"]
    dups = find_duplicates(docs, traj.with_columns(pl.lit(1.0).alias("quality")), QualityConfig())
    assert sorted(dups["session_id"]) == ["x", "y"]  # only the real twins


@pytest.mark.parametrize(
    "overrides",
    [
        {"edited_tests": {"weight": "x"}},
        {"edited_tests": {"weight": True}},
        {"edited_tests": {"weight": float("nan")}},
        {"edited_tests": {"voids_verdict": "no"}},
        {"edited_tests": {"cheat_type": 3}},
    ],
)
def test_governance_overrides_of_the_wrong_type_are_refused(overrides: dict) -> None:
    with pytest.raises(ValueError, match="edited_tests"):
        QualityConfig(governance_overrides=overrides)


def test_nan_quality_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="weights"):
        QualityConfig(w_completion=float("nan"), w_validity=0.5, w_novelty=0.5)
