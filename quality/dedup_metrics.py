"""Measuring duplicate clusters against generated ground truth: tasks whose solutions look alike.

:func:`task_corpus` makes sessions of many tasks in families whose tasks are solved by the same
commands (two tasks, one solution: ``data_cli.fx`` and ``data_cli.group_sum``), and within each
task sessions that repeat a run with at most one command changed, sessions of another approach
and one-off sessions. The truth is what a near-duplicate means: two sessions of **one task** whose
exact k-shingle Jaccard similarity (instruction and actions) reaches the threshold, closed under
links (clusters are connected components). :func:`pair_scores` compares the clusters
:func:`quality.dedup.find_duplicates` finds with it, pair by pair.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import polars as pl

from quality.config import QualityConfig
from quality.dedup import build_documents, find_duplicates, normalize_command

_VERBS = ("cat", "grep -n", "sed -n 1,40p", "python3 -m pytest -q", "ls -la", "head -n 30", "wc -l", "diff -u")


@dataclass(frozen=True)
class PairScores:
    """Pairwise precision and recall of "in one cluster" against the truth, and the cross-task pairs found."""

    true_pairs: int
    found_pairs: int
    correct_pairs: int
    cross_task_pairs: int

    @property
    def precision(self) -> float:
        """Found pairs that are true."""
        return self.correct_pairs / self.found_pairs if self.found_pairs else 1.0

    @property
    def recall(self) -> float:
        """True pairs that were found."""
        return self.correct_pairs / self.true_pairs if self.true_pairs else 1.0


def _actions(rng: random.Random, n: int) -> list[str]:
    return [f"{rng.choice(_VERBS)} src/module_{rng.randrange(1 << 20):05x}.py" for _ in range(n)]


def task_corpus(
    families: int = 8, tasks_per_family: int = 3, actions: int = 40, seed: int = 0
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``trajectories`` (session_id, task_id, instruction, started_at) and ``steps`` of a generated corpus.

    Per family one solution (``actions`` commands) that each of its tasks is solved by. Per task:
    the solution run three times (unchanged, then with one command changed in each rerun),
    another approach run twice (the second with one change), and a one-off session.
    """
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    trajectories: list[dict[str, object]] = []
    steps: list[dict[str, object]] = []
    for family in range(families):
        solution = _actions(rng, actions)
        for task in range(tasks_per_family):
            task_id = f"family{family}.task{task}-{rng.randrange(1 << 32):08x}"
            other = _actions(rng, actions)
            runs = [solution, _edited(rng, solution), _edited(rng, solution), other, _edited(rng, other)]
            runs.append(_actions(rng, actions))
            for run in runs:
                session_id = f"s{len(trajectories):06d}"
                trajectories.append(
                    {
                        "session_id": session_id,
                        "task_id": task_id,
                        "instruction": f"Task {task_id}: make the tests of family {family} pass.",
                        "started_at": start + timedelta(seconds=len(trajectories)),
                    }
                )
                steps += [
                    {"session_id": session_id, "step_index": i, "tool_name": "bash", "command": command}
                    for i, command in enumerate(run)
                ]
    trajectories_frame = pl.DataFrame(trajectories)
    steps_frame = pl.DataFrame(steps).with_columns(pl.lit(None, pl.Utf8).alias("failure_reason"))
    return trajectories_frame, steps_frame


def _edited(rng: random.Random, run: list[str]) -> list[str]:
    changed = list(run)
    changed[rng.randrange(len(changed))] = f"echo changed-{rng.randrange(1 << 30)}"
    return changed


def _shingles(instruction: str, commands: list[str], k: int) -> set[tuple[str, ...]]:
    frame = pl.DataFrame({"c": commands, "i": [instruction] * len(commands)}, schema={"c": pl.Utf8, "i": pl.Utf8})
    actions = frame.select("bash\x1f" + normalize_command(pl.col("c"))).to_series().to_list()
    head = frame.select(normalize_command(pl.col("i"))).to_series().to_list()[:1] or [instruction]
    padded = actions + [""] * (k - 1)
    return {("instruction", head[0])} | {tuple(padded[i : i + k]) for i in range(len(actions))}


def true_clusters(trajectories: pl.DataFrame, steps: pl.DataFrame, config: QualityConfig) -> dict[str, int]:
    """Session → cluster number under the truth: same task, exact Jaccard ≥ threshold, closed under links."""
    commands = {
        sid: frame.sort("step_index")["command"].to_list()
        for (sid,), frame in steps.partition_by("session_id", as_dict=True).items()
    }
    rows = trajectories.select("session_id", "task_id", "instruction").rows()
    parent = {sid: sid for sid, _, _ in rows}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    by_task: dict[str, list[tuple[str, set[tuple[str, ...]]]]] = {}
    for sid, task, instruction in rows:
        by_task.setdefault(task, []).append((sid, _shingles(instruction, commands.get(sid, []), config.shingle_size)))
    for members in by_task.values():
        for (a, sa), (b, sb) in itertools.combinations(members, 2):
            if len(sa & sb) / len(sa | sb) >= config.dedup_threshold:
                parent[root(a)] = root(b)
    roots = sorted({root(sid) for sid in parent})
    number = {r: i for i, r in enumerate(roots)}
    return {sid: number[root(sid)] for sid in parent}


def pair_scores(
    trajectories: pl.DataFrame, steps: pl.DataFrame, config: QualityConfig | None = None, by_task: bool = True
) -> PairScores:
    """Cluster ``trajectories`` (``by_task``: near-duplicates within a task, as scoring does; False: across
    tasks, as it did before) and score every pair of sessions put in one cluster against the truth."""
    config = config or QualityConfig()
    documents = trajectories if by_task else trajectories.drop("task_id")
    ranking = trajectories.select("session_id", "started_at", pl.lit(0.0).alias("quality"))
    found = find_duplicates(build_documents(documents, steps, config), ranking, config)
    truth = true_clusters(trajectories, steps, config)
    task = dict(trajectories.select("session_id", "task_id").rows())
    true_pairs = {
        frozenset(pair) for members in _groups(truth).values() for pair in itertools.combinations(sorted(members), 2)
    }
    clusters = dict(found.select("session_id", "cluster_id").rows())
    found_pairs = {
        frozenset(pair) for members in _groups(clusters).values() for pair in itertools.combinations(sorted(members), 2)
    }
    cross = sum(1 for pair in found_pairs if len({task[s] for s in pair}) > 1)
    return PairScores(len(true_pairs), len(found_pairs), len(true_pairs & found_pairs), cross)


def _groups(assignment: Mapping[str, object]) -> dict[object, list[str]]:
    groups: dict[object, list[str]] = {}
    for sid, group in assignment.items():
        groups.setdefault(group, []).append(sid)
    return groups
