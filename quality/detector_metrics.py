"""Measuring the detectors against ground truth: cheat labels from a fleet run, injected near-duplicates.

Labels are only ever read here (``trajlake quality evaluate``), never by the detectors.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import polars as pl

from quality.cheats import FLAG_RULES
from quality.config import QualityConfig
from quality.dedup import build_documents, find_duplicates


@dataclass(frozen=True)
class Metric:
    """Confusion counts of one binary detector."""

    name: str
    positives: int
    negatives: int
    tp: int
    fp: int

    @property
    def recall(self) -> float | None:
        """TP / labelled positives."""
        return self.tp / self.positives if self.positives else None

    @property
    def precision(self) -> float | None:
        """TP / predicted positives."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def fpr(self) -> float | None:
        """FP / labelled negatives."""
        return self.fp / self.negatives if self.negatives else None

    def as_dict(self) -> dict[str, object]:
        """Counts and rates (rounded) for printing."""

        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {
            "detector": self.name,
            "positives": self.positives,
            "negatives": self.negatives,
            "tp": self.tp,
            "fp": self.fp,
            "recall": r(self.recall),
            "precision": r(self.precision),
            "fpr": r(self.fpr),
        }


def _metric(name: str, universe: pl.DataFrame, truth: pl.Expr, predicted: pl.Expr) -> Metric:
    counts = universe.select(
        truth.sum().alias("p"),
        (~truth).sum().alias("n"),
        (truth & predicted).sum().alias("tp"),
        (~truth & predicted).sum().alias("fp"),
    ).row(0)
    return Metric(name, int(counts[0]), int(counts[1]), int(counts[2]), int(counts[3]))


def evaluate_cheats(flags: pl.DataFrame, labels: pl.DataFrame) -> list[Metric]:
    """Precision, recall and false-positive rate per cheat type, plus ``any`` (cheater or not).

    Args:
        flags: the flags table (session_id, flag, flag_class).
        labels: fleet labels (session_id, cheat_type; null for honest sessions). Only labelled
            sessions are evaluated.
    """
    mapping = pl.DataFrame(
        {"flag": list(FLAG_RULES), "cheat_type": [r.cheat_type for r in FLAG_RULES.values()]},
        schema={"flag": pl.Utf8, "cheat_type": pl.Utf8},
    )
    detected = (
        flags.join(mapping, on="flag", how="inner")
        .group_by("session_id")
        .agg(pl.col("cheat_type").drop_nulls().unique().alias("detected_types"))
    )
    universe = (
        labels.select("session_id", pl.col("cheat_type").cast(pl.Utf8))
        .unique("session_id")
        .join(detected, on="session_id", how="left")
        .with_columns(pl.col("detected_types").fill_null([]))
    )
    # a session with any cheat flag (even a security flag with no fleet counterpart) is "detected"
    any_flag = flags.filter(pl.col("flag_class").is_in(["security", "behavioural"]))["session_id"].unique()
    metrics = [
        _metric(
            "any_cheat", universe, pl.col("cheat_type").is_not_null(), pl.col("session_id").is_in(any_flag.implode())
        )
    ]
    for cheat in sorted({r.cheat_type for r in FLAG_RULES.values() if r.cheat_type}):
        metrics.append(
            _metric(
                cheat,
                universe,
                pl.col("cheat_type").fill_null("") == cheat,
                pl.col("detected_types").list.contains(cheat),
            )
        )
    return metrics


def inject_near_duplicates(
    trajectories: pl.DataFrame, steps: pl.DataFrame, n: int, seed: int
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Copies of ``n`` random sessions with the kinds of change a rerun makes.

    Each copy gets a new session id and one of: cosmetic edits (case, whitespace, new hex ids in
    commands), one step repeated (a retry; sessions of 6+ steps), or one command replaced
    (sessions of 20+ steps). Returns the extended trajectories and steps and ``(copy_id, source_id, change)``.
    """
    rng = random.Random(seed)
    with_steps = steps["session_id"].unique().sort().to_list()
    sources = rng.sample(with_steps, min(n, len(with_steps)))
    by_session = steps.filter(pl.col("session_id").is_in(sources)).partition_by("session_id", as_dict=True)
    new_traj, new_steps, truth = [], [], []
    for i, source in enumerate(sources):
        src = by_session[(source,)].sort("step_index")
        copy_id = f"injected-{seed}-{i:06d}"
        rows = src.to_dicts()
        # one changed action alters k shingles: only long sessions stay above the threshold
        change = rng.choice(["cosmetic"] + ["retry"] * (len(rows) >= 6) + ["edit"] * (len(rows) >= 20))
        if change == "cosmetic":
            for row in rows:
                cmd = row["command"] or ""
                row["command"] = ("  " + cmd.upper() + " ") if rng.random() < 0.3 else cmd.replace(" ", "   ")
        elif change == "retry":
            at = rng.randrange(len(rows))
            rows.insert(at, dict(rows[at]))
        else:
            at = rng.randrange(len(rows))
            rows[at]["command"] = f"echo changed-step-{rng.randrange(1 << 30)}"
        for index, row in enumerate(rows):
            row["session_id"] = copy_id
            row["step_index"] = index
            row["action_event_id"] = f"{copy_id}-{index}"
        new_steps.append(pl.DataFrame(rows, schema=steps.schema))
        new_traj.append(
            trajectories.filter(pl.col("session_id") == source).with_columns(pl.lit(copy_id).alias("session_id"))
        )
        truth.append((copy_id, source, change))
    truth_frame = pl.DataFrame(truth, schema=["copy_id", "source_id", "change"], orient="row")
    return (
        pl.concat([trajectories, *new_traj], how="vertical_relaxed"),
        pl.concat([steps, *new_steps], how="vertical_relaxed"),
        truth_frame,
    )


def evaluate_dedup(
    trajectories: pl.DataFrame, steps: pl.DataFrame, n: int, seed: int, config: QualityConfig | None = None
) -> Metric:
    """Near-duplicate recall and precision on ``n`` injected copies.

    Positives are the copies whose exact shingle-set Jaccard similarity to their source reaches
    the threshold (the definition of a near-duplicate); a copy counts as found when it lands in
    its source's cluster. False positives are sessions that are duplicates only after injection
    without being a copy or a copy's source, and copies clustered away from their source.
    """
    config = config or QualityConfig()
    ranking = trajectories.select("session_id", "started_at", pl.lit(0.0).alias("quality"))
    before = find_duplicates(build_documents(trajectories, steps, config), ranking, config)
    traj2, steps2, truth = inject_near_duplicates(trajectories, steps, n, seed)
    ranking2 = traj2.select("session_id", "started_at", pl.lit(0.0).alias("quality"))
    after = find_duplicates(build_documents(traj2, steps2, config), ranking2, config)
    truth = truth.filter(
        pl.Series(
            [
                _true_jaccard(steps2, c, s, config.shingle_size) >= config.dedup_threshold
                for c, s in truth.select("copy_id", "source_id").iter_rows()
            ],
            dtype=pl.Boolean,
        )
    )
    cluster = dict(after.select("session_id", "cluster_id").iter_rows())
    found = sum(
        1
        for copy, source in truth.select("copy_id", "source_id").iter_rows()
        if copy in cluster and cluster.get(source) == cluster[copy]
    )
    misplaced = sum(
        1
        for copy, source in truth.select("copy_id", "source_id").iter_rows()
        if copy in cluster and cluster.get(source) != cluster[copy]
    )
    involved = set(truth["copy_id"]) | set(truth["source_id"]) | set(before["session_id"])
    spurious = sum(1 for sid in cluster if sid not in involved)
    return Metric(
        "near_duplicate",
        positives=truth.height,
        negatives=trajectories.height,
        tp=found,
        fp=misplaced + spurious,
    )


def _true_jaccard(steps: pl.DataFrame, a: str, b: str, k: int) -> float:
    """Exact Jaccard similarity of two sessions' k-shingle sets of normalized actions."""
    from quality.dedup import normalize_command

    def shingles(session_id: str) -> set[tuple[str, ...]]:
        actions = (
            steps.filter(pl.col("session_id") == session_id)
            .sort("step_index")
            .select(pl.col("tool_name").fill_null("") + "\x1f" + normalize_command(pl.col("command")))
            .to_series()
            .to_list()
        )
        padded = actions + [""] * (k - 1)
        return {tuple(padded[i : i + k]) for i in range(len(actions))}

    left, right = shingles(a), shingles(b)
    return len(left & right) / len(left | right) if left | right else 1.0
