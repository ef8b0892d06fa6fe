"""Pairwise precision/recall of duplicate clusters on generated tasks whose solutions look alike, within a task
(as scoring clusters) and across tasks (as it did before). Prints one line per seed."""

from __future__ import annotations

import sys

from quality.dedup_metrics import pair_scores, task_corpus


def main(seeds: list[int]) -> None:
    for seed in seeds:
        trajectories, steps = task_corpus(families=8, tasks_per_family=3, seed=seed)
        within, across = pair_scores(trajectories, steps), pair_scores(trajectories, steps, by_task=False)
        sys.stdout.write(
            f"seed {seed}: {trajectories.height} sessions, {within.true_pairs} true pairs | within tasks: "
            f"precision {within.precision:.4f} recall {within.recall:.4f} cross-task pairs {within.cross_task_pairs}"
            f" | across tasks: precision {across.precision:.4f} recall {across.recall:.4f} "
            f"cross-task pairs {across.cross_task_pairs}\n"
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 2, 3])
