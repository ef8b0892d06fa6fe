"""Named crash points: a crash test makes a process die where the code is, not after a timed sleep.

Code that must survive being killed calls :func:`crash_point` at the moments worth dying at (between two
commits, just before an Iceberg commit). Unless ``TRAJLAKE_FAULT`` is set the call is one dictionary
lookup. A test arms it in the child process's environment:

- ``TRAJLAKE_FAULT=NAME``: SIGKILL at the first time the process reaches the point ``NAME``;
- ``TRAJLAKE_FAULT=NAME@N``: at the ``N``-th time it reaches ``NAME`` (1-based);
- ``TRAJLAKE_FAULT=*@N``: at the ``N``-th crash point reached, whatever its name (a random ``N`` is a
  random moment of the run, the same one on a quiet machine and a loaded one).

The points and where they are: ``docs/testing.md`` (crash tests).
"""

from __future__ import annotations

import os
import signal
from collections import Counter

#: The environment variable that arms a crash point (read at each call: a test sets it in a child's env).
FAULT_ENV = "TRAJLAKE_FAULT"

_reached: Counter[str] = Counter()


def _armed(spec: str) -> tuple[str, int]:
    """``(name, n)`` of a ``TRAJLAKE_FAULT`` value; a malformed count arms nothing (``n`` = 0)."""
    name, _, count = spec.partition("@")
    if not count:
        return name, 1
    return (name, int(count)) if count.isdigit() and int(count) > 0 else (name, 0)


def crash_point(name: str) -> None:
    """Die abruptly (SIGKILL, no cleanup, no flush) here when ``TRAJLAKE_FAULT`` names this point.

    Args:
        name: the point's name, unique in the code base (``tier_after_copy_steps``, ``before_iceberg_commit``).
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    target, n = _armed(spec)
    if target not in (name, "*"):
        return
    _reached[target] += 1
    if _reached[target] == n:
        os.kill(os.getpid(), signal.SIGKILL)
