"""``run_fleet``: one fleet run from options to report, the way the CLI and Dagster start one.

It picks the backend (falling back to the synthetic fleet when asked and bubblewrap is
unusable), connects the event sink (Kafka by default), writes ground-truth labels, and can
shard the synthetic fleet over several processes (``run_synthetic_workers``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from producers.fleet.factory import make_fleet
from producers.fleet.perturb import Perturbation
from producers.fleet.report import FleetReport, LabelWriter
from producers.fleet.sandbox import BubblewrapMissing, bwrap_available
from producers.fleet.sinks import CallableSink, DiscardSink, EventSink

if TYPE_CHECKING:
    from common.progress import Progress
    from common.settings import Settings


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
    progress: Progress | None = None,
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
        progress: told of each session done (not with ``workers`` > 1: the shards run in other processes).

    Raises:
        BubblewrapMissing: ``local`` requested, bubblewrap unusable, and not ``fallback``.
        ValueError: bad backend, cheat rate or perturbation spec.
    """
    if not 0.0 <= cheat_rate <= 1.0:
        raise ValueError(f"cheat rate must be in [0, 1], got {cheat_rate}")
    if isinstance(perturb, str) or perturb is None:
        perturb = Perturbation.parse(perturb)
    notes: list[str] = []
    backend = _usable_backend(backend, fallback, notes)
    if backend == "synthetic" and workers > 1:
        synthetic = {"rate_per_s": rate_per_s, "time_compression": time_compression, "host_id": host_id}
        report = _run_sharded(
            settings, sessions, seed, cheat_rate, labels_path, workers, sink, start_us, perturb, synthetic
        )
    else:
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
        target, producer = _event_target(settings, sink, host_id or f"fleet-{backend}")
        run_kwargs: dict[str, Any] = {"plans": plans} if plans is not None else {}
        report = _run_here(
            fleet, target, producer, labels_path, sessions, seed, cheat_rate, concurrency, progress, run_kwargs
        )
    report.notes = notes + report.notes
    return report


def _run_sharded(
    settings: Settings,
    sessions: int,
    seed: int,
    cheat_rate: float,
    labels_path: Path | str | None,
    workers: int,
    sink: object,
    start_us: int | None,
    perturb: Perturbation,
    synthetic: dict[str, Any],
) -> FleetReport:
    """The synthetic fleet in ``workers`` processes (``run_synthetic_workers``), each sending to Kafka.

    Raises:
        ValueError: a ``sink`` was given (each worker has its own Kafka producer).
    """
    import time

    if sink is not None:
        raise ValueError("workers > 1 sends to Kafka from each worker; it cannot take a sink")
    if start_us is None:  # fixed here so that every shard walks the same arrivals
        start_us = time.time_ns() // 1000 - int(sessions / synthetic["rate_per_s"] * 1e6)
    kwargs = {**synthetic, "start_us": start_us, "perturb": perturb}
    return run_synthetic_workers(settings, sessions, seed, cheat_rate, labels_path, workers, kwargs)


def _run_here(
    fleet: Any,
    target: EventSink,
    producer: Any,
    labels_path: Path | str | None,
    sessions: int,
    seed: int,
    cheat_rate: float,
    concurrency: int,
    progress: Progress | None,
    run_kwargs: dict[str, Any],
) -> FleetReport:
    """Run ``fleet`` in this process: events to ``target`` (``producer`` flushed after), labels to
    ``labels_path``; the report says where the labels went and how many."""
    import time

    labels = LabelWriter(labels_path)
    started = time.monotonic()
    try:
        report = fleet.run(
            sessions,
            seed=seed,
            cheat_rate=cheat_rate,
            sink=target,
            labels=labels,
            concurrency=concurrency,
            progress=progress,
            **run_kwargs,
        )
        if producer is not None:
            producer.flush()
    finally:
        labels.close()
    report.wall_s = report.wall_s or time.monotonic() - started
    report.labels_path = str(labels.path) if labels.path else None
    report.labels_written = labels.count
    return report


def _usable_backend(backend: str, fallback: bool, notes: list[str]) -> str:
    """``backend``, or ``synthetic`` (said in ``notes``) when the local fleet cannot sandbox and ``fallback`` allows.

    Raises:
        BubblewrapMissing: ``local`` requested, bubblewrap unusable, and not ``fallback``.
    """
    if backend != "local" or bwrap_available():
        return backend
    if not fallback:
        from producers.fleet.sandbox import find_bwrap

        find_bwrap()  # raises with the package name when missing
        raise BubblewrapMissing("bubblewrap is installed but cannot create sandboxes (user namespaces?)")
    notes.append("bubblewrap (Debian package `bubblewrap`) unavailable: ran the synthetic fleet instead")
    return "synthetic"


def _event_target(
    settings: Settings, sink: EventSink | Callable[[dict[str, Any]], Any] | None, host_id: str
) -> tuple[EventSink, Any]:
    """Where the fleet's events go: ``sink`` (a callable wrapped), or Kafka; with the Kafka producer to flush."""
    if sink is None:
        from common.broker import resolve_bootstrap
        from producers.sdk import EventProducer

        producer = EventProducer(
            resolve_bootstrap(settings), settings.topic, host_id, extra_config=settings.kafka_extra
        )
        return producer, producer
    if hasattr(sink, "emit") and hasattr(sink, "send"):
        return sink, None
    return CallableSink(sink), None


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
        sink = DiscardSink()
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
