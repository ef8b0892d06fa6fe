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
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from producers.fleet.perturb import Perturbation
from producers.fleet.sandbox import BubblewrapMissing, bwrap_available

if TYPE_CHECKING:
    from common.settings import Settings

BACKENDS = ("local", "synthetic")


class EventSink(Protocol):
    """Where a fleet's events go: ``EventProducer`` satisfies it, so does ``ListSink``."""

    def emit(self, event: dict[str, Any]) -> str:
        """Encode and deliver one event dict; returns its id."""
        ...

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Deliver one already-encoded event."""
        ...


def _decoded(value: bytes) -> dict[str, Any]:
    """Decode wire bytes back into an emitted-style event dict (``ts`` as epoch micros)."""
    from datetime import UTC, datetime, timedelta

    from schemas.registry import decode_event

    event = decode_event(value)
    event.pop("schema_version", None)
    if isinstance(event["ts"], datetime):
        event["ts"] = (event["ts"] - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return event


class ListSink:
    """An in-memory sink for tests and benchmarks (no Kafka).

    Args:
        decode: decode ``send``'s bytes back into event dicts (else keep raw bytes in ``raw``).
    """

    def __init__(self, decode: bool = True) -> None:
        self.events: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.decode = decode
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> str:
        """Keep one event dict."""
        with self._lock:
            self.events.append(event)
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Keep one encoded event (decoded when ``decode``)."""
        if self.decode:
            self.emit(_decoded(value))
        else:
            with self._lock:
                self.raw.append(value)


class CallableSink:
    """Adapts a plain callable (``list.append``, ``EventProducer.emit``) to ``EventSink``."""

    def __init__(self, func: Callable[[dict[str, Any]], Any]) -> None:
        self.func = func

    def emit(self, event: dict[str, Any]) -> str:
        """Pass one event dict to the callable."""
        self.func(event)
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Decode and pass on (slow; only for tests)."""
        self.func(_decoded(value))


class CountingSink:
    """Counts events on their way to another sink (thread-safe)."""

    def __init__(self, inner: EventSink) -> None:
        self.inner = inner
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> str:
        return self.emit(event)

    def emit(self, event: dict[str, Any]) -> str:
        """Forward one event dict."""
        self.inner.emit(event)
        with self._lock:
            self.count += 1
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Forward one encoded event."""
        self.inner.send(session_id, event_id, value)
        with self._lock:
            self.count += 1


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
        """A few human-readable lines."""
        lines = [
            f"fleet[{self.backend}]: {self.sessions} sessions, {self.events} events in {self.wall_s:.1f} s "
            f"({self.sessions_per_min:.1f} sessions/min)",
            "  status: " + ", ".join(f"{k}={v}" for k, v in sorted(self.by_status.items())),
            f"  evaluation passed: {self.eval_passed}; cheaters: {self.cheaters}; "
            f"timeouts reaped: {self.timeouts_reaped} (survivors {self.reaper_survivors})",
        ]
        if self.latency_ms:
            lines.append("  latency ms: " + ", ".join(f"{k}={v:g}" for k, v in sorted(self.latency_ms.items())))
        if self.labels_path:
            lines.append(f"  labels: {self.labels_written} lines → {self.labels_path}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


class Fleet(Protocol):
    """A sandbox fleet backend."""

    name: str

    def run(
        self,
        sessions: int,
        *,
        seed: int,
        cheat_rate: float,
        sink: EventSink,
        labels: LabelWriter,
        concurrency: int = 4,
    ) -> FleetReport:
        """Run ``sessions`` sessions, emitting every event to ``sink`` and labels to ``labels``."""
        ...


def make_fleet(
    backend: str,
    settings: Settings,
    *,
    perturb: Perturbation | None = None,
    timeout_s: float | None = None,
    policy_mix: dict[str, float] | None = None,
    rate_per_s: float = 35.0,
    time_compression: float | None = None,
    start_us: int | None = None,
    host_id: str | None = None,
    agent: str | None = None,
    llm: Any = None,
    caps: Any = None,
    group_size: int = 1,
) -> Fleet:
    """Construct a backend by name (``agent``, ``llm``, ``caps``, ``group_size``: see ``run_fleet``).

    Raises:
        ValueError: unknown backend, or live-agent options for the synthetic backend.
        BubblewrapMissing: ``local`` without ``bwrap`` installed.
        AgentSpecError: an ``agent`` that does not resolve.
    """
    if backend == "local":
        from producers.fleet.local import LocalFleet

        return LocalFleet(
            settings.home_dir / "fleet",
            perturb=perturb,
            timeout_s=timeout_s,
            policy_mix=policy_mix,
            host_id=host_id,
            agent=agent,
            llm=llm,
            caps=caps,
            group_size=group_size,
        )
    if agent is not None or group_size != 1:
        raise ValueError("--agent and --group-size need --backend local (the synthetic fleet simulates its agents)")
    if backend == "synthetic":
        from producers.fleet.synthetic import SyntheticFleet

        return SyntheticFleet(
            rate_per_s=rate_per_s,
            time_compression=time_compression,
            start_us=start_us,
            perturb=perturb,
            host_id=host_id,
        )
    raise ValueError(f"unknown fleet backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def run_fleet(
    settings: Settings,
    backend: str = "local",
    sessions: int = 10,
    concurrency: int = 4,
    seed: int = 0,
    cheat_rate: float = 0.1,
    labels_path: Path | str | None = None,
    perturb: Perturbation | str | None = None,
    *,
    sink: EventSink | Callable[[dict[str, Any]], Any] | None = None,
    fallback: bool = False,
    timeout_s: float | None = None,
    policy_mix: dict[str, float] | None = None,
    rate_per_s: float = 35.0,
    time_compression: float | None = None,
    start_us: int | None = None,
    host_id: str | None = None,
    workers: int = 1,
    agent: str | None = None,
    llm: Any = None,
    caps: Any = None,
    group_size: int = 1,
    plans: Any = None,
) -> FleetReport:
    """Run a fleet; events go to Kafka (or ``sink``), labels to ``labels_path``.

    Args:
        settings: trajlake settings (``TRAJLAKE_HOME`` holds images and sandbox layers; Kafka).
        backend: ``local`` or ``synthetic``.
        sessions: number of sessions.
        concurrency: sandboxes at once (local).
        seed: task instances, policies and the synthetic stream derive from it.
        cheat_rate: share of cheating sessions.
        labels_path: JSONL ground truth; ``None`` writes none.
        perturb: ``Perturbation`` or its spec string (``"latency=50,jitter=20,fail=0.05,formats"``).
        sink: an ``EventSink`` or a callable taking event dicts; default: Kafka via ``EventProducer``.
        fallback: when ``backend='local'`` and bubblewrap is unusable, run the synthetic fleet
            instead (the report's ``notes`` says so) rather than raising.
        timeout_s: per-session deadline override (local).
        policy_mix: explicit policy weights (local), e.g. ``{"hang": 1}``.
        rate_per_s: synthetic arrival rate.
        time_compression: synthetic pacing (simulated seconds per wall second); ``None`` = flat out.
        start_us: synthetic stream start (event time); default: now minus the simulated span.
        host_id: recorded in every event.
        workers: synthetic generator processes, each producing its shard of the stream with its
            own Kafka producer (``sink`` must be None); labels are merged in shard order.
        agent: the local fleet's agent: a built-in policy, ``llm``, ``module:callable`` or
            ``path/file.py:callable`` (``producers.fleet.agent_api``); ``None`` draws scripted policies.
        llm: ``producers.fleet.llm.LLMConfig`` for ``agent='llm'``.
        caps: ``producers.fleet.agent_caps.Caps`` (steps, model tokens, cost) for every session.
        group_size: attempts of each of the ``sessions`` task instances (rollout groups).
        plans: explicit ``producers.fleet.local.SessionPlan`` list (retries); overrides ``sessions``.

    Raises:
        BubblewrapMissing: ``local`` requested, bubblewrap unusable, and not ``fallback``.
        ValueError: bad backend, cheat rate or perturbation spec.
    """
    import time

    if not 0.0 <= cheat_rate <= 1.0:
        raise ValueError(f"cheat rate must be in [0, 1], got {cheat_rate}")
    if isinstance(perturb, str) or perturb is None:
        perturb = Perturbation.parse(perturb)
    notes: list[str] = []
    if backend == "local" and not bwrap_available():
        if not fallback:
            from producers.fleet.sandbox import find_bwrap

            find_bwrap()  # raises with the package name when missing
            raise BubblewrapMissing("bubblewrap is installed but cannot create sandboxes (user namespaces?)")
        notes.append("bubblewrap (Debian package `bubblewrap`) unavailable: ran the synthetic fleet instead")
        backend = "synthetic"
    if backend == "synthetic" and workers > 1:
        if sink is not None:
            raise ValueError("workers > 1 sends to Kafka from each worker; it cannot take a sink")
        if start_us is None:  # fixed here so that every shard walks the same arrivals
            start_us = time.time_ns() // 1000 - int(sessions / rate_per_s * 1e6)
        kwargs = {
            "rate_per_s": rate_per_s,
            "time_compression": time_compression,
            "host_id": host_id,
            "start_us": start_us,
            "perturb": perturb,
        }
        report = run_synthetic_workers(settings, sessions, seed, cheat_rate, labels_path, workers, kwargs)
        report.notes = notes + report.notes
        return report
    fleet = make_fleet(
        backend,
        settings,
        perturb=perturb,
        timeout_s=timeout_s,
        policy_mix=policy_mix,
        rate_per_s=rate_per_s,
        time_compression=time_compression,
        start_us=start_us,
        host_id=host_id,
        agent=agent,
        llm=llm,
        caps=caps,
        group_size=group_size,
    )
    producer = None
    if sink is None:
        from common.broker import resolve_bootstrap
        from producers.sdk import EventProducer

        producer = EventProducer(
            resolve_bootstrap(settings),
            settings.topic,
            host_id or f"fleet-{backend}",
            extra_config=settings.kafka_extra,
        )
        target: EventSink = producer
    elif hasattr(sink, "emit") and hasattr(sink, "send"):
        target = sink
    else:
        target = CallableSink(sink)
    labels = LabelWriter(labels_path)
    started = time.monotonic()
    try:
        run_kwargs: dict[str, Any] = {"plans": plans} if plans is not None else {}
        report = fleet.run(
            sessions,
            seed=seed,
            cheat_rate=cheat_rate,
            sink=target,
            labels=labels,
            concurrency=concurrency,
            **run_kwargs,
        )
        if producer is not None:
            producer.flush()
    finally:
        labels.close()
    report.wall_s = report.wall_s or time.monotonic() - started
    report.labels_path = str(labels.path) if labels.path else None
    report.labels_written = labels.count
    report.notes = notes + report.notes
    return report


def _synthetic_shard(args: tuple) -> tuple[dict[str, Any], float]:
    """One generator process of ``run_synthetic_workers``: its shard of the stream, to Kafka or counted."""
    settings, sessions, seed, cheat_rate, labels_path, shard, kwargs, to_kafka = args
    from producers.fleet.synthetic import SyntheticFleet

    fleet = SyntheticFleet(**kwargs)
    producer = None
    if to_kafka:
        from common.broker import resolve_bootstrap
        from producers.sdk import EventProducer

        producer = EventProducer(
            resolve_bootstrap(settings),
            settings.topic,
            kwargs.get("host_id") or f"fleet-synthetic-{shard[0]}",
            extra_config=settings.kafka_extra,
        )
        sink: EventSink = producer
    else:
        sink = _DiscardSink()
    labels = LabelWriter(labels_path)
    try:
        report = fleet.run(sessions, seed=seed, cheat_rate=cheat_rate, sink=sink, labels=labels, shard=shard)
        if producer is not None:
            producer.flush()
    finally:
        labels.close()
    return {
        k: getattr(report, k)
        for k in ("sessions", "events", "by_status", "by_policy", "cheaters", "timeouts_reaped", "figures")
    }, report.wall_s


class _DiscardSink:
    """Drops encoded events (generation benchmarks)."""

    def emit(self, event: dict[str, Any]) -> str:
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        pass


def run_synthetic_workers(
    settings: Settings,
    sessions: int,
    seed: int,
    cheat_rate: float,
    labels_path: Path | str | None,
    workers: int,
    fleet_kwargs: dict[str, Any],
    to_kafka: bool = True,
) -> FleetReport:
    """The synthetic fleet on ``workers`` processes: each generates and sends one shard of the stream.

    ``fleet_kwargs`` are ``SyntheticFleet`` arguments and must fix ``start_us`` so every
    shard walks the same arrivals. Per-session event order holds (a session lives in one
    shard); labels are concatenated in shard order.
    """
    import multiprocessing
    import time

    parts = [Path(f"{labels_path}.part{i}") if labels_path else None for i in range(workers)]
    started = time.monotonic()
    jobs = [
        (settings, sessions, seed, cheat_rate, parts[i], (i, workers), fleet_kwargs, to_kafka) for i in range(workers)
    ]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = pool.map(_synthetic_shard, jobs)
    wall = time.monotonic() - started
    report = FleetReport(backend="synthetic", sessions=0, wall_s=wall)
    for shard, _ in results:
        report.sessions += shard["sessions"]
        report.events += shard["events"]
        report.cheaters += shard["cheaters"]
        report.timeouts_reaped += shard["timeouts_reaped"]
        for key in ("by_status", "by_policy"):
            merged = getattr(report, key)
            for name, count in shard[key].items():
                merged[name] = merged.get(name, 0) + count
    report.figures["events_per_s"] = round(report.events / wall, 1) if wall else 0.0
    report.figures["workers"] = workers
    firsts = [shard["figures"]["first_event_us"] for shard, _ in results if "first_event_us" in shard["figures"]]
    lasts = [shard["figures"]["last_event_us"] for shard, _ in results if "last_event_us" in shard["figures"]]
    if firsts:
        report.figures["first_event_us"], report.figures["last_event_us"] = min(firsts), max(lasts)
        report.figures["simulated_span_s"] = round((max(lasts) - min(firsts)) / 1e6, 1)
    report.figures["generation_events_per_s"] = round(report.events / max(seconds for _, seconds in results), 1)
    if labels_path:
        with Path(labels_path).open("w") as out:
            for part in parts:
                assert part is not None
                with part.open() as handle:
                    for line in handle:
                        out.write(line)
                        report.labels_written += 1
                part.unlink()
        report.labels_path = str(labels_path)
    return report


__all__ = [
    "BACKENDS",
    "BubblewrapMissing",
    "EventSink",
    "Fleet",
    "FleetReport",
    "LabelWriter",
    "ListSink",
    "Perturbation",
    "bwrap_available",
    "make_fleet",
    "run_fleet",
]
