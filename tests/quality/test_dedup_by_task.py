"""Near-duplicates are found within a task: two tasks are two samples however alike their solutions; exact
duplicates may cross anything. Measured pairwise against generated ground truth."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from quality.config import QualityConfig
from quality.dedup import band_keys, task_keys
from quality.dedup_metrics import pair_scores, task_corpus
from tests.quality.test_quality_scoring import _score, _session


def _commands(n: int = 30, changed: int | None = None) -> list[str]:
    commands = [f"python3 -m data_cli step {j} --in data.csv" for j in range(n)]
    if changed is not None:
        commands[changed] = "echo one more look"
    return commands


def test_sessions_of_two_tasks_with_the_same_solution_are_two_samples() -> None:
    # the instruction differs, the actions are the same: similar enough to cluster were tasks ignored
    fx = _session("fx", _commands(), task_id="data_cli.fx")
    group_sum = _session("group_sum", _commands(), task_id="data_cli.group_sum", minute=1)
    rerun = _session("rerun", _commands(changed=7), task_id="data_cli.fx", minute=2)
    result = _score([fx, group_sum, rerun])
    clusters = dict(result.duplicates.select("session_id", "cluster_id").iter_rows())
    assert clusters == {"fx": "fx", "rerun": "fx"}  # the rerun of one task, not the other task
    exportable = dict(result.scores.select("session_id", "exportable").iter_rows())
    assert exportable["fx"] and exportable["group_sum"] and not exportable["rerun"]


def test_exact_duplicates_cross_tasks() -> None:
    first = _session("first", _commands(), task_id="a")
    second = _session("second", _commands(), task_id="b", minute=1)
    second[0]["instruction"] = first[0]["instruction"]  # the same task statement under two ids
    result = _score([first, second])
    rows = {r["session_id"]: r for r in result.duplicates.iter_rows(named=True)}
    assert set(rows) == {"first", "second"} and rows["second"]["method"] == "exact"


def test_band_keys_of_two_tasks_never_meet() -> None:
    config = QualityConfig()
    rng = np.random.default_rng(0)
    signatures = np.repeat(rng.integers(0, 2**32, size=(1, config.num_perm), dtype=np.uint64).astype(np.uint32), 4, 0)
    scopes = task_keys(pl.Series(["t1", "t1", "t2", None]))
    keys = band_keys(signatures, config, scopes)
    assert (keys[0] == keys[1]).all()  # one task, one signature: every band shared
    assert not np.isin(keys[2], keys[0]).any() and not np.isin(keys[3], keys[0]).any()
    assert (band_keys(signatures, config)[0] == band_keys(signatures, config)[2]).all()  # without tasks: shared


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pairwise_precision_and_recall_against_generated_truth(seed: int) -> None:
    trajectories, steps = task_corpus(families=8, tasks_per_family=3, seed=seed)
    scoped = pair_scores(trajectories, steps)
    assert scoped.cross_task_pairs == 0 and scoped.precision == 1.0
    assert scoped.recall >= 0.9 and scoped.true_pairs >= 80
    # what clustering across tasks did on the same corpus: most pairs it found joined two tasks
    unscoped = pair_scores(trajectories, steps, by_task=False)
    assert unscoped.cross_task_pairs > scoped.found_pairs and unscoped.precision < 0.5
