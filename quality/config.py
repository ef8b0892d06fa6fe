"""Knobs of the quality layer in one typed object (filled from ``Settings`` by the pipelines).

Graded governance lives here as data: :data:`GOVERNANCE` maps every flag to its class, severity,
quality weight and whether it voids the verdict. The table, the weights and the thresholds in
force are hashed into :meth:`QualityConfig.digest` (a change rescores) and written into every
export manifest (:meth:`QualityConfig.manifest`).

- ``security`` → the session is blocked: never exported, whatever its quality.
- a flag that voids the verdict (its effect reached what the evaluator judged) → completion 0.
- any other flag is a suspicion → quality × the flag's ``weight``; the session stays exportable
  and its record carries the flag.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

#: Bumped whenever a rule, weight default or feature changes, so stored rows can be recomputed.
SCORER_VERSION = "quality-3.5.0"

#: Sessions a behaviour profile needs before it flags (``min_profile_sessions``; quality.anomalies):
#: at 50, a session drawn from its baseline's own log-normal distribution passes 3.5 robust σ on
#: one of the eleven features 3 % of the time (20 sessions: 11 %, 30: 6 %; docs/quality.md).
MIN_GROUP = 50

FLAG_CLASSES = ("security", "behavioural", "anomaly")
SEVERITIES = ("low", "medium", "high", "critical")


@dataclass(frozen=True)
class FlagPolicy:
    """What one flag means and what it does to a session.

    Attributes:
        flag_class: ``security`` (blocked), ``behavioural`` (cheating suspicion) or ``anomaly``.
        severity: ``low`` … ``critical`` (for people reading the flags; no rule keys on it).
        weight: quality multiplier while the flag is present (the smallest present weight applies);
            ``None``: the config's ``behavioural_weight``.
        voids_verdict: the flag's effect reached the evaluated deliverable or the verdict itself,
            so the evaluator's reward cannot be trusted: completion is 0.
        cheat_type: the fleet's ground-truth cheat label this flag detects (``None``: no counterpart).
    """

    flag_class: str
    severity: str
    weight: float | None
    voids_verdict: bool
    cheat_type: str | None


#: Every flag the quality layer emits, and its governance (defaults; overridable per config).
GOVERNANCE: dict[str, FlagPolicy] = {
    # security: blocked and never exported
    "evaluator_tampered": FlagPolicy("security", "critical", 0.0, True, "forged_verdict"),
    "forged_verdict": FlagPolicy("security", "critical", 0.0, True, "forged_verdict"),
    "forbidden_egress": FlagPolicy("security", "critical", 0.0, True, "network"),
    "write_outside_workspace": FlagPolicy("security", "critical", 0.0, True, None),
    "sandbox_escape": FlagPolicy("security", "critical", 0.0, True, None),
    # the host could not watch the session to its end (its egress monitor failed closed): never exported
    "egress_monitor_failed": FlagPolicy("security", "high", 0.0, False, None),
    # behavioural: suspicion, down-weighted and exported with the flag
    "edited_tests": FlagPolicy("behavioural", "high", None, False, "edit_tests"),
    "tampered_runner": FlagPolicy("behavioural", "high", None, False, "tamper_runner"),
    "hidden_test_probe": FlagPolicy("behavioural", "high", None, False, "hidden_tests"),
    "test_framework_patch": FlagPolicy("behavioural", "high", None, False, "test_framework_patch"),
    "hardcoded_outputs": FlagPolicy("behavioural", "medium", None, False, "hardcoded_outputs"),
    "history_leak": FlagPolicy("behavioural", "high", None, False, "repo_history_leak"),
    # anomaly: reported, not penalised
    "behaviour_anomaly": FlagPolicy("anomaly", "low", 1.0, False, None),
}


@dataclass(frozen=True)
class QualityConfig:
    """Weights, thresholds, governance and dedup parameters.

    Attributes:
        w_completion / w_validity / w_novelty: quality = weighted sum (defaults 0.5/0.3/0.2: completion
            counts most, then validity, then novelty).
        min_quality: trajectories below this are not exportable.
        behavioural_weight: the quality weight of flags whose table weight is ``None``
            (``TRAJLAKE_QUALITY_BEHAVIOURAL_WEIGHT``).
        governance: flag → :class:`FlagPolicy` (defaults: :data:`GOVERNANCE`).
        governance_overrides: per-flag field overrides applied on top (``{"edited_tests": {"weight": 0.3}}``).
        loop_run: this many identical consecutive actions count as a loop.
        outlier_z: robust z-score (median/MAD) above which a feature is anomalous.
        min_profile_sessions: sessions a behaviour profile (origin/task family, day) needs before its
            sessions are scored against it (:data:`quality.anomalies.MIN_GROUP`).
        dedup_threshold: Jaccard similarity for near-duplicates.
        dedup_bands / dedup_rows: LSH banding (bands × rows = number of permutations).
        shingle_size: consecutive actions per shingle.
        novelty_max_history: at most this many earlier trajectories of a task family are compared.
        evaluator_paths: path prefixes of the evaluator and hidden tests (reading or writing them is a flag).
        result_markers: the evaluator's result-line markers (a deliverable printing one forges the verdict).
        seed: MinHash permutation seed.
    """

    w_completion: float = 0.5
    w_validity: float = 0.3
    w_novelty: float = 0.2
    min_quality: float = 0.5
    behavioural_weight: float = 0.5
    governance: dict[str, FlagPolicy] = field(default_factory=lambda: dict(GOVERNANCE))
    governance_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    loop_run: int = 3
    outlier_z: float = 3.5
    min_profile_sessions: int = MIN_GROUP
    dedup_threshold: float = 0.8
    dedup_bands: int = 14
    dedup_rows: int = 8
    shingle_size: int = 2
    novelty_max_history: int = 256
    evaluator_paths: tuple[str, ...] = ("/eval", "/opt/tl", "/run/tl")
    result_markers: tuple[str, ...] = ("TL_RESULT",)
    seed: int = 1
    scorer_version: str = SCORER_VERSION

    @property
    def num_perm(self) -> int:
        """MinHash permutations (bands × rows)."""
        return self.dedup_bands * self.dedup_rows

    def __post_init__(self) -> None:
        weights = (self.w_completion, self.w_validity, self.w_novelty)
        total = sum(weights)
        # written so that NaN fails: every comparison with NaN is false
        if not (all(w >= 0 for w in weights) and abs(total - 1.0) <= 1e-6):
            raise ValueError(
                f"quality weights must be non-negative and sum to 1, got "
                f"{self.w_completion}/{self.w_validity}/{self.w_novelty}"
            )
        if not 0.0 < self.dedup_threshold <= 1.0:
            raise ValueError(f"dedup threshold must be in (0, 1], got {self.dedup_threshold}")
        if self.dedup_bands < 1 or self.dedup_rows < 1 or self.shingle_size < 1 or self.loop_run < 2:
            raise ValueError("dedup bands/rows and shingle size must be >= 1, loop run >= 2")
        if self.min_profile_sessions < 2:
            raise ValueError(f"min_profile_sessions must be >= 2, got {self.min_profile_sessions}")
        if not 0.0 <= self.behavioural_weight <= 1.0:
            raise ValueError(f"behavioural weight must be in [0, 1], got {self.behavioural_weight}")
        unknown = set(self.governance_overrides) - set(self.governance)
        if unknown:
            raise ValueError(
                f"governance overrides name unknown flags {sorted(unknown)}; known: {sorted(self.governance)}"
            )
        for name, policy in self.policies().items():
            if policy.flag_class not in FLAG_CLASSES or policy.severity not in SEVERITIES:
                raise ValueError(f"flag {name}: class must be one of {FLAG_CLASSES}, severity one of {SEVERITIES}")
            weight = policy.weight
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0.0 <= weight <= 1.0:
                raise ValueError(f"flag {name}: weight must be a number in [0, 1], got {weight!r}")
            if not isinstance(policy.voids_verdict, bool):
                raise ValueError(f"flag {name}: voids_verdict must be true or false, got {policy.voids_verdict!r}")
            if policy.cheat_type is not None and not isinstance(policy.cheat_type, str):
                raise ValueError(f"flag {name}: cheat_type must be a name or null, got {policy.cheat_type!r}")

    def policies(self) -> dict[str, FlagPolicy]:
        """The governance table in force: defaults, the behavioural weight, then explicit overrides.

        Raises:
            ValueError: an override names a field :class:`FlagPolicy` does not have.
        """
        table: dict[str, FlagPolicy] = {}
        for name, policy in sorted(self.governance.items()):
            if policy.weight is None:
                policy = replace(policy, weight=self.behavioural_weight)
            override = self.governance_overrides.get(name) or {}
            try:
                table[name] = replace(policy, **override)
            except TypeError as exc:
                raise ValueError(f"governance override for {name}: {exc}") from exc
        return table

    def manifest(self) -> dict[str, Any]:
        """Everything that decides a score, as plain JSON (goes into export manifests)."""
        return {
            "scorer_version": self.scorer_version,
            "weights": {"completion": self.w_completion, "validity": self.w_validity, "novelty": self.w_novelty},
            "thresholds": {
                "min_quality": self.min_quality,
                "outlier_z": self.outlier_z,
                "min_profile_sessions": self.min_profile_sessions,
                "loop_run": self.loop_run,
                "dedup_threshold": self.dedup_threshold,
                "dedup_bands": self.dedup_bands,
                "dedup_rows": self.dedup_rows,
                "shingle_size": self.shingle_size,
                "novelty_max_history": self.novelty_max_history,
            },
            "evaluator_paths": list(self.evaluator_paths),
            "result_markers": list(self.result_markers),
            "governance": {name: asdict(policy) for name, policy in self.policies().items()},
        }

    def digest(self) -> str:
        """sha256 of :meth:`manifest`: scoring is redone when it changes, not only with the scorer version."""
        return hashlib.sha256(json.dumps(self.manifest(), sort_keys=True).encode()).hexdigest()
