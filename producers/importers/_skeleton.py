"""The one shape of every importer's conversion: begin the run, hand each record to its handler, end it.

Every format's ``convert`` reads as the same three steps, named alike in each module:

- ``_begin``: the run's header (task, agent, model, tools, the instruction) read into a started
  :class:`~producers.importers._builder.RunBuilder` and the importer's ``_Run`` (its state while records are read);
- the records in order, each to the handler of its kind (``_on_<kind>``; a table ``_HANDLERS`` or a
  function choosing one): :func:`replay` where records carry their own times;
- ``_end``: the exit (outcome, runtime, reason, the event holding the submission), the verdict, and
  ``RunBuilder.finish``.

mini-swe-agent, OpenHands V0 and V1 replay timestamped records through :func:`replay` (V1 groups one
response's actions first, then moves the clock past each with :func:`passed`); ATIF, SWE-agent and OTel
steps carry no clock to follow and are walked directly; Harbor trials are ATIF trajectories with a
trial's context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class Clocked(Protocol):
    """A run whose records carry times: ``stamps[i]`` of record ``i`` (``None`` when unknown)."""

    stamps: list[int | None]
    previous_ts: int | None


R = TypeVar("R", bound=Clocked)
T = TypeVar("T")
Handler = Callable[[R, int, T], None]


def passed(run: Clocked, index: int) -> None:
    """The run's clock after record ``index``: that record's time, when it has one."""
    ts = run.stamps[index]
    if ts is not None:
        run.previous_ts = ts


def replay(run: R, records: Sequence[T], handler_of: Callable[[R, T], Handler[R, T] | None]) -> None:
    """Each record, in order, to the handler ``handler_of`` chooses (none: the record is not a step), then the clock."""
    for index, record in enumerate(records):
        handler = handler_of(run, record)
        if handler is not None:
            handler(run, index, record)
        passed(run, index)


def wall_seconds(stamps: list[int | None]) -> float:
    """Seconds from the first to the last known time (microseconds) of a run's records; 0 when none is known."""
    known = [s for s in stamps if s is not None]
    return (max(known) - min(known)) / 1e6 if known else 0.0
