"""Knobs of the quality layer in one typed object (filled from ``Settings`` by the pipelines)."""

from __future__ import annotations

from dataclasses import dataclass

from quality import SCORER_VERSION


@dataclass(frozen=True)
class QualityConfig:
    """Weights, thresholds and dedup parameters.

    Attributes:
        w_completion / w_validity / w_novelty: quality = weighted sum (defaults 0.5/0.3/0.2: completion
            counts most, then validity, then novelty).
        min_quality: trajectories below this are not exportable.
        behavioural_weight: quality multiplier for sessions with a behavioural cheat flag
            (down-weighted, not dropped).
        loop_run: this many identical consecutive actions count as a loop.
        outlier_z: robust z-score (median/MAD) above which a feature is anomalous.
        dedup_threshold: Jaccard similarity for near-duplicates.
        dedup_bands / dedup_rows: LSH banding (bands × rows = number of permutations).
        shingle_size: consecutive actions per shingle.
        novelty_max_history: at most this many earlier trajectories of a task are compared.
        seed: MinHash permutation seed.
    """

    w_completion: float = 0.5
    w_validity: float = 0.3
    w_novelty: float = 0.2
    min_quality: float = 0.5
    behavioural_weight: float = 0.5
    loop_run: int = 3
    outlier_z: float = 3.5
    dedup_threshold: float = 0.8
    dedup_bands: int = 14
    dedup_rows: int = 8
    shingle_size: int = 2
    novelty_max_history: int = 256
    seed: int = 1
    scorer_version: str = SCORER_VERSION

    @property
    def num_perm(self) -> int:
        """MinHash permutations (bands × rows)."""
        return self.dedup_bands * self.dedup_rows

    def __post_init__(self) -> None:
        total = self.w_completion + self.w_validity + self.w_novelty
        if min(self.w_completion, self.w_validity, self.w_novelty) < 0 or abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"quality weights must be non-negative and sum to 1, got "
                f"{self.w_completion}/{self.w_validity}/{self.w_novelty}"
            )
        if not 0.0 < self.dedup_threshold <= 1.0:
            raise ValueError(f"dedup threshold must be in (0, 1], got {self.dedup_threshold}")
        if self.dedup_bands < 1 or self.dedup_rows < 1 or self.shingle_size < 1 or self.loop_run < 2:
            raise ValueError("dedup bands/rows and shingle size must be >= 1, loop run >= 2")
