"""What a fleet run reports: the run's ``FleetReport`` and its ground-truth ``LabelWriter``."""

from __future__ import annotations

import json
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class LabelWriter:
    """Ground truth as JSONL, outside the event stream (thread-safe; ``None`` path = discard).

    Only an evaluation command may read this file; nothing in the pipeline does.
    """

    def __init__(self, path: Path | str | None) -> None:
        self.path = Path(path) if path else None
        self.count = 0
        self._lock = threading.Lock()
        self._handle = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("w")

    def write(self, **label: Any) -> None:
        """Write one label line."""
        with self._lock:
            self.count += 1
            if self._handle is not None:
                self._handle.write(json.dumps(label, sort_keys=True) + "\n")

    def close(self) -> None:
        """Flush and close the file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def percentiles(values: list[float], name: str) -> dict[str, float]:
    """``{name}_p50``, ``_p95`` and ``_max`` of ``values`` (empty dict when there are none)."""
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {
        f"{name}_p50": round(statistics.median(ordered), 3),
        f"{name}_p95": round(p95, 3),
        f"{name}_max": round(ordered[-1], 3),
    }


@dataclass
class FleetReport:
    """What a fleet run did; ``metadata()`` is what the ``sandbox_runs`` asset records."""

    backend: str
    sessions: int
    events: int = 0
    wall_s: float = 0.0
    by_status: dict[str, int] = field(default_factory=dict)
    by_policy: dict[str, int] = field(default_factory=dict)
    cheaters: int = 0
    timeouts_reaped: int = 0
    reaper_survivors: int = 0
    eval_passed: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    labels_path: str | None = None
    labels_written: int = 0
    notes: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def sessions_per_min(self) -> float:
        """Sessions completed per wall-clock minute."""
        return self.sessions / self.wall_s * 60 if self.wall_s else 0.0

    def metadata(self) -> dict[str, Any]:
        """Flat metadata (numbers and strings) for Dagster."""
        meta: dict[str, Any] = {
            "backend": self.backend,
            "sessions": self.sessions,
            "events": self.events,
            "wall_s": round(self.wall_s, 3),
            "sessions_per_min": round(self.sessions_per_min, 2),
            "cheaters": self.cheaters,
            "timeouts_reaped": self.timeouts_reaped,
            "reaper_survivors": self.reaper_survivors,
            "eval_passed": self.eval_passed,
            "labels_written": self.labels_written,
        }
        meta.update({f"status_{k}": v for k, v in sorted(self.by_status.items())})
        meta.update({f"latency_{k}": v for k, v in sorted(self.latency_ms.items())})
        meta.update({k: v for k, v in sorted(self.figures.items())})
        if self.notes:
            meta["notes"] = "; ".join(self.notes)
        return meta

    def summary(self) -> str:
        """A small table: how sessions ended, how many passed evaluation, cheaters planted, latencies."""
        total = self.sessions
        rows: list[tuple[str, str, str]] = [("sessions", str(total), "")]
        for status, count in sorted(self.by_status.items(), key=lambda item: (-item[1], item[0])):
            label, note = _STATUS_LABELS.get(status, (status.replace("_", " "), f"status {status}"))
            rows.append((f"  {label}", str(count), note))
        rows += [
            ("passed evaluation", f"{self.eval_passed} of {total}", "the evaluator's verdict"),
            ("planted cheaters", str(self.cheaters), "run on purpose (--cheat-rate)"),
            ("timeouts reaped", str(self.timeouts_reaped), f"{self.reaper_survivors} processes survived"),
        ]
        width = max(len(label) for label, _, _ in rows) + 2
        value_width = max(len(value) for _, value, _ in rows)
        lines = [
            f"fleet[{self.backend}]: {total} sessions, {self.events} events in {self.wall_s:.1f} s "
            f"({self.sessions_per_min:.1f} sessions/min)"
        ]
        lines += [f"  {label:<{width}}{value:>{value_width}}  {note}".rstrip() for label, value, note in rows]
        lines += _latency_table(self.latency_ms, width + 2)
        if self.labels_path:
            lines.append(f"  labels: {self.labels_written} lines → {self.labels_path}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


#: How a session status reads in the summary: (label, what it means).
_STATUS_LABELS = {
    "completed": ("finished", "status completed, passed or not"),
    "timeout": ("timed out", "status timeout"),
    "gave_up": ("gave up", "status gave_up: no submission"),
    "error": ("error", "status error (see exit_reason)"),
    "capped": ("capped", "status capped: a cap ended it"),
}


def _latency_table(latency_ms: dict[str, float], label_width: int) -> list[str]:
    """``{name}_p50/_p95/_max`` figures as rows of one table, a row per name, in milliseconds."""
    stats = ("p50", "p95", "max")
    names: dict[str, dict[str, float]] = {}
    for key, value in latency_ms.items():
        name, _, stat = key.rpartition("_")
        if name and stat in stats:
            names.setdefault(name, {})[stat] = value
    if not names:
        return []
    lines = [f"  {'latency (ms)':<{label_width}}" + "".join(f"{stat:>10}" for stat in stats)]
    for name in sorted(names):
        figures = "".join(f"{names[name][stat]:>10.0f}" if stat in names[name] else f"{'':>10}" for stat in stats)
        lines.append(f"    {name.replace('_', ' '):<{label_width - 2}}{figures}".rstrip())
    return lines
