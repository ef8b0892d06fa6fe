"""How many events a sandbox can make its host emit: bounds per command and per session, with summaries.

A sandbox decides how much its host records: every file it changes is a ``file_op``, every
connection it tries a ``network_request``. Unbounded, 250,000 empty files made one session emit
400,002 events. So:

- per command at most ``file_ops_per_command`` ``file_op`` events; the changes to files the task
  shipped (tests, runner, sources) and to test-framework files come first, so a flood of junk
  cannot hide an edited test; what is left out is summarised in one ``annotation``
  (``file_ops_not_emitted``: counts per operation and their bytes);
- per session at most ``events_per_session`` events (``BoundedEmitter``); beyond, events are
  counted instead of emitted, except ``session_start``, ``evaluation``, ``session_end`` and the
  fleet's annotations, and one ``annotation`` (``events_not_emitted``: counts per event type) is
  emitted before ``session_end``.

Sequence numbers stay gapless: an event that is not emitted takes no ``seq``.
"""

from __future__ import annotations

import json
import posixpath
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from producers.emitter import SessionEmitter
from producers.fleet.planted import is_framework_file

#: Event types a session always emits, whatever its budget: its frame and the fleet's own notes.
ALWAYS_EMITTED = frozenset({"session_start", "evaluation", "session_end", "annotation"})


@dataclass(frozen=True)
class EventBounds:
    """Bounds on the events of one session.

    Attributes:
        file_ops_per_command: ``file_op`` events one command may cause (the rest summarised).
        events_per_session: events one session may emit (the rest counted, summarised once).
    """

    file_ops_per_command: int = 200
    events_per_session: int = 20_000


class BoundedEmitter(SessionEmitter):
    """A ``SessionEmitter`` that emits at most ``max_events`` events, then counts them (see the module docstring).

    Args:
        sink: receives every complete event.
        max_events: events emitted at most (``ALWAYS_EMITTED`` types are emitted beyond it).
        **kwargs: ``SessionEmitter``'s arguments.
    """

    def __init__(self, sink: Callable[[dict[str, Any]], Any], max_events: int, **kwargs: Any) -> None:
        super().__init__(sink, **kwargs)
        self.max_events = max_events
        self.not_emitted: Counter[str] = Counter()

    def _admit(self, event_type: str) -> bool:
        """Emit the event unless the session's budget is spent (``ALWAYS_EMITTED`` types are emitted regardless)."""
        if event_type in ALWAYS_EMITTED or self.seq < self.max_events:
            return True
        self.not_emitted[event_type] += 1
        return False

    def summarise(self) -> str | None:
        """Emit the ``events_not_emitted`` annotation when any event was left out; its id, else ``None``."""
        if not self.not_emitted:
            return None
        counts = dict(sorted(self.not_emitted.items()))
        value = json.dumps({"limit": self.max_events, "not_emitted": counts, "total": sum(counts.values())})
        return self.emit("annotation", {"key": "events_not_emitted", "value": value, "author": "fleet"}, "system")


def emission_order(paths: Iterable[str], watched: frozenset[str]) -> list[str]:
    """``paths`` with the ones detectors look at first: files the task shipped, then test-framework files.

    Args:
        paths: workspace-relative paths of changes.
        watched: paths the task shipped (its pristine files).
    """

    def rank(path: str) -> tuple[int, str]:
        if path in watched:
            return 0, path
        if is_framework_file(path) or posixpath.basename(path).startswith("test"):
            return 1, path
        return 2, path

    return sorted(paths, key=rank)
