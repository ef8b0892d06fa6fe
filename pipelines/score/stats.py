"""What one scoring run did: its counters and where its wall time went."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class ScoreStats:
    """What one scoring run did."""

    sessions: int = 0
    flagged_sessions: int = 0
    flags_by_type: dict[str, int] = field(default_factory=dict)
    duplicate_sessions: int = 0
    clusters: int = 0
    exportable: int = 0
    mean_quality: float | None = None
    scorer_version: str = ""
    config_digest: str = ""
    skipped: bool = False
    trajectories_snapshot_id: int | None = None
    seconds: float = 0.0
    mode: str = "incremental"  # "incremental", "full" (a changed configuration or force) or "skipped"
    changed_sessions: int = 0  # whose own facts were recomputed (level 1)
    rescored_sessions: int = 0  # whose scores were recomputed (level 2: every session of the affected days)
    affected_days: int = 0
    #: level-2 chunks whose clusters were recomputed from a closed set of sessions (the others grew from their
    #: fresh sessions' links alone: see :func:`pipelines.score.growth.grown_clusters`)
    closed_sets: int = 0
    #: wall seconds by phase (changed, level1, affected, level2, profiles, summary): where a run's time went
    phases: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``phases[name]``."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.monotonic() - started, 3)

    def laps(self, prefix: str) -> Callable[[str], None]:
        """A stopwatch: ``lap(name)`` adds the time since the previous lap to ``phases[prefix + name]``."""
        last = time.monotonic()

        def lap(name: str) -> None:
            nonlocal last
            now = time.monotonic()
            key = prefix + name
            self.phases[key] = round(self.phases.get(key, 0.0) + now - last, 3)
            last = now

        return lap

    def as_dict(self) -> dict[str, object]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)
