"""The sandbox fleet: where agents work on tasks, upstream of everything else in trajlake.

One interface (``Fleet``), several backends:

- ``local`` (``producers.fleet.local``): real sandboxes under bubblewrap with a task pack,
  scripted agents, a reaper, telemetry and two-phase evaluation;
- ``synthetic`` (``producers.fleet.synthetic``): reference-scale traffic (Poisson arrivals,
  35 sessions/s by default) with the same event kinds and cheat signatures, time-compressed and
  deterministic per seed.

``run_fleet`` is what the CLI (``trajlake fleet run``) and the Dagster ``FleetResource`` call.
Ground-truth labels (policy, cheat type, expected outcome) go to a JSONL file, never into the
event stream.

Where things live: ``sinks`` (where events go), ``report`` (``FleetReport``, ``LabelWriter``),
``backends`` (the ``Fleet`` interface), ``factory`` (``make_fleet``), ``runner`` (``run_fleet``, sharded
synthetic runs). This module only re-exports them.
"""

from producers.fleet.backends import BACKENDS, Fleet
from producers.fleet.factory import make_fleet
from producers.fleet.perturb import Perturbation
from producers.fleet.report import FleetReport, LabelWriter, percentiles
from producers.fleet.runner import run_fleet, run_synthetic_workers
from producers.fleet.sandbox import BubblewrapMissing, bwrap_available
from producers.fleet.sinks import CallableSink, CountingSink, EventSink, ListSink

__all__ = [
    "BACKENDS",
    "BubblewrapMissing",
    "CallableSink",
    "CountingSink",
    "EventSink",
    "Fleet",
    "FleetReport",
    "LabelWriter",
    "ListSink",
    "Perturbation",
    "bwrap_available",
    "make_fleet",
    "percentiles",
    "run_fleet",
    "run_synthetic_workers",
]
