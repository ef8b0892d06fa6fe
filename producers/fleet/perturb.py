"""Environment perturbation: latency and jitter, transient failures, format drift.

A sandbox that always answers instantly, never fails and always prints the same format trains
agents that break on real systems. ``Perturbation`` injects, per command, a delay (latency plus
uniform jitter), a transient failure (the command is not run; exit code 75, EX_TEMPFAIL, with a
``failure_reason``), and per session an output-format variant of the test runner (plain, pytest,
TAP, JSON) and of line endings. Decisions come from a seeded ``random.Random``: reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

TRANSIENT_EXIT = 75
TRANSIENT_MESSAGES = (
    "sh: fork: retry: Resource temporarily unavailable",
    "error: connection reset by peer (transient)",
    "OSError: [Errno 11] Resource temporarily unavailable",
)
OUTPUT_STYLES = ("plain", "pytest", "tap", "json")


@dataclass(frozen=True)
class Perturbation:
    """What to inject.

    Attributes:
        latency_ms: added delay per command.
        jitter_ms: extra uniform random delay in [0, jitter_ms].
        failure_rate: probability that a command fails transiently without running.
        format_variation: vary the test runner's output style and line endings per session.
    """

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    failure_rate: float = 0.0
    format_variation: bool = False

    @property
    def active(self) -> bool:
        """Whether anything is injected."""
        return bool(self.latency_ms or self.jitter_ms or self.failure_rate or self.format_variation)

    @classmethod
    def parse(cls, spec: str | None) -> Perturbation:
        """From ``"latency=50,jitter=20,fail=0.05,formats"`` (any subset; ``"default"`` = moderate all).

        Raises:
            ValueError: an unknown key or a bad number.
        """
        if not spec:
            return cls()
        if spec.strip() == "default":
            return cls(latency_ms=30.0, jitter_ms=40.0, failure_rate=0.05, format_variation=True)
        parsed = cls()
        for part in spec.split(","):
            key, _, value = part.strip().partition("=")
            if key in ("latency", "latency_ms"):
                parsed = replace(parsed, latency_ms=float(value))
            elif key in ("jitter", "jitter_ms"):
                parsed = replace(parsed, jitter_ms=float(value))
            elif key in ("fail", "failure_rate"):
                parsed = replace(parsed, failure_rate=float(value))
            elif key in ("formats", "format_variation"):
                formats = value.lower() not in ("0", "false", "no") if value else True
                parsed = replace(parsed, format_variation=formats)
            else:
                raise ValueError(f"unknown perturbation {key!r} (latency=, jitter=, fail=, formats)")
        return parsed

    def delay_s(self, rng: random.Random) -> float:
        """Delay to inject before answering one command."""
        if not (self.latency_ms or self.jitter_ms):
            return 0.0
        return (self.latency_ms + rng.uniform(0, self.jitter_ms)) / 1000.0

    def transient_failure(self, rng: random.Random) -> str | None:
        """A transient error message to answer with instead of running, or ``None``."""
        if self.failure_rate and rng.random() < self.failure_rate:
            return rng.choice(TRANSIENT_MESSAGES)
        return None

    def session_env(self, rng: random.Random) -> dict[str, str]:
        """Per-session environment: the runner's output style."""
        if not self.format_variation:
            return {}
        return {"TL_OUTPUT_STYLE": rng.choice(OUTPUT_STYLES)}

    def vary_output(self, output: str, rng: random.Random) -> str:
        """Line-ending variation of a command's output."""
        if self.format_variation and rng.random() < 0.2:
            return output.replace("\n", "\r\n")
        return output
