"""How a long stage tells whoever runs it how far it got: items done out of a total.

A stage takes an optional :class:`Progress` and calls it once per unit of work (a session run,
a file imported, a batch ingested, a session scored, a record exported) with the count done so
far and the total when it is known. What becomes of the calls is the caller's business: the
command line draws a bar with rate and ETA on a terminal and nothing in logs or pipes; Dagster
and library callers pass nothing. A stage never depends on the call doing anything.
"""

from __future__ import annotations

import threading
from typing import Protocol


class Progress(Protocol):
    """Told how far a stage got; must be cheap and may be called from several threads."""

    def __call__(self, done: int, total: int | None = None, unit: str = "items") -> None:
        """``done`` units out of ``total`` (``None``: unknown yet); ``unit`` names them (``sessions``)."""
        ...


def no_progress(done: int, total: int | None = None, unit: str = "items") -> None:
    """The :class:`Progress` that ignores every call (the default of every stage)."""


class ProgressCounter:
    """Counts units of work finished on any thread and reports the running count.

    Args:
        progress: where counts go (``None``: nowhere).
        total: the number of units, when known.
        unit: what a unit is, e.g. ``"sessions"``.
    """

    def __init__(self, progress: Progress | None, total: int | None, unit: str) -> None:
        self.progress = progress or no_progress
        self.total = total
        self.unit = unit
        self.done = 0
        self._lock = threading.Lock()
        self.progress(0, total, unit)

    def add(self, n: int = 1) -> None:
        """``n`` more units are done."""
        with self._lock:
            self.done += n
            done = self.done
        self.progress(done, self.total, self.unit)
