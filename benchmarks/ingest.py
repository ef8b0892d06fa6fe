"""Ingest benchmarks: throughput against the per-record baseline, batch decoding, memory, scale-out, freshness."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer

from benchmarks.harness import (
    Figure,
    bench_home,
    child_peak_rss,
    cli_child,
    cli_env,
    encoded_events,
    print_figures,
    produce_encoded,
)
from benchmarks.ingest_ab import against_consume_only
from common.broker import ensure_topic, resolve_bootstrap
from common.settings import Settings
from pipelines.decode import BatchDecoder, with_coordinates
from pipelines.ingest import IngestWorker, consumer_config, event_row
from producers.sdk import EventProducer
from schemas.errors import DecodeError
from schemas.registry import decode_event
from warehouse.catalog import open_catalog
from warehouse.snapshots import live_files
from warehouse.tables import RAW_EVENTS, ensure_table


def consume_all(
    settings: Settings, expected: int, on_batch: Callable[[list[Any]], None], group: str
) -> tuple[float, int]:
    """Consume ``expected`` records in a new group, handing each poll's messages to ``on_batch``.

    Returns seconds from the first record received to the last batch handled, and bytes.
    """
    config = consumer_config(settings.model_copy(update={"consumer_group": group}), resolve_bootstrap(settings))
    consumer = Consumer(config)
    consumer.subscribe([settings.topic])
    seen = n_bytes = 0
    first: float | None = None
    deadline = time.monotonic() + 120 + expected / 1000
    try:
        while seen < expected and time.monotonic() < deadline:
            messages = [m for m in consumer.consume(num_messages=10_000, timeout=0.5) if delivered(m)]
            if not messages:
                continue
            first = first or time.perf_counter()
            on_batch(messages)
            seen += len(messages)
            n_bytes += sum(len(m.value() or b"") for m in messages)
    finally:
        consumer.close()
    if seen < expected:
        raise RuntimeError(f"consumed {seen} of {expected} records from {settings.topic} before the deadline")
    return time.perf_counter() - (first or time.perf_counter()), n_bytes


def delivered(message: Any) -> bool:
    # Partition EOF and transient errors carry no record; librdkafka retries on its own.
    return message.error() is None


def bench_ingest(
    events: int = 200_000, home: Path | None = None, naive: bool = True, cpu_rounds: int = 3
) -> dict[str, Any]:
    """Kafka → Iceberg raw events: ingest vs consume-only (CPU per event), the consume+decode floor, a naive baseline.

    Args:
        events: records in the backlog.
        home: TRAJLAKE_HOME to use (a temporary directory by default).
        naive: also run the naive baseline (per-record dicts appended with pyiceberg).
        cpu_rounds: rounds of ingest against the consume-only loop (``benchmarks.ingest_ab``); the
            printed ratio ``ingest_over_consume_only`` is consume-only CPU per event ÷ ingest's (medians).
    """
    records = encoded_events(events)
    with bench_home(home) as settings:
        produce_seconds = produce_encoded(settings, records)
        max_bytes = settings.max_event_bytes

        def floor_batch(messages: list[Any]) -> None:
            for message in messages:
                with contextlib.suppress(DecodeError):
                    decode_event(message.value() or b"", max_bytes=max_bytes)

        floor_seconds, n_bytes = consume_all(settings, events, floor_batch, f"floor-{uuid.uuid4().hex[:6]}")

        result: dict[str, Any] = {
            "events": events,
            "mb": n_bytes / 1e6,
            "produce_events_per_s": events / produce_seconds,
        }
        if naive:
            naive_settings = settings.model_copy(update={"namespace": "naive"})
            catalog = open_catalog(naive_settings)
            table = ensure_table(catalog, naive_settings, RAW_EVENTS.name)
            schema = RAW_EVENTS.arrow_schema()

            def naive_batch(messages: list[Any]) -> None:
                now = datetime.now(UTC)
                rows = []
                for m in messages:
                    with contextlib.suppress(DecodeError):
                        event = decode_event(m.value() or b"", max_bytes=max_bytes)
                        rows.append(event_row(event, m.topic(), m.partition(), m.offset(), now))
                table.append(pa.Table.from_pylist(rows, schema=schema))

            naive_seconds, _ = consume_all(settings, events, naive_batch, f"naive-{uuid.uuid4().hex[:6]}")
            result["naive_events_per_s"] = events / naive_seconds

        # The figure: ingest's events per CPU-second against a consume-only loop's (the Kafka
        # client alone, every value read), each a child process measured after its start-up, same backlog.
        ingest_runs, consume_runs = against_consume_only(settings, events, cpu_rounds)
        ingest_cpu = statistics.median(r.cpu_us_per_event for r in ingest_runs)
        consume_cpu = statistics.median(r.cpu_us_per_event for r in consume_runs)
        ratios = [c.cpu_us_per_event / i.cpu_us_per_event for i, c in zip(ingest_runs, consume_runs, strict=True)]
        stats = IngestWorker(settings).run(until_idle=2.0)
        if stats.events != events:
            raise RuntimeError(f"ingest landed {stats.events} of {events} events ({stats.as_dict()})")
        # The worker's own timings: from its first received record to the end of its last batch commit.
        ingest_seconds = stats.timings.first_record_to_last_commit_s
        rate = events / ingest_seconds
        figures = [
            Figure("ingest vs floor (consume+per-record decode, no sink)", rate, events / floor_seconds, "events/s"),
        ]
        if naive:
            figures.append(
                Figure("ingest vs naive (dicts + pyiceberg append)", rate, result["naive_events_per_s"], "events/s")
            )
        result.update(
            events_per_s=rate,
            mb_per_s=n_bytes / 1e6 / ingest_seconds,
            floor_events_per_s=events / floor_seconds,
            ingest_cpu_us_per_event=ingest_cpu,
            consume_only_cpu_us_per_event=consume_cpu,
            ingest_over_consume_only=consume_cpu / ingest_cpu,
            ingest_over_consume_only_rounds=ratios,
            batches=stats.batches,
            consume_s=stats.timings.consume_s,
            decode_s=stats.timings.decode_s,
            commit_s=stats.timings.commit_s,
            figures=[f.as_dict() for f in figures],
        )
    print_figures("ingest", figures, result)
    rounds_text = ", ".join(f"{r:.3f}" for r in ratios)
    print(
        f"  ingest ÷ consume-only, events per CPU-second: {consume_cpu:.2f} / {ingest_cpu:.2f} µs per event = "
        f"{consume_cpu / ingest_cpu:.3f}× (rounds {rounds_text}; target ≥ 0.7×)"
    )
    return result


def bench_decode(events: int = 50_000) -> dict[str, Any]:
    """Batch decoding vs per-record ``decode_event`` + ``from_pylist`` on the same bytes (no Kafka)."""
    values = [value for _, _, value in encoded_events(events)]
    schema = RAW_EVENTS.arrow_schema()
    now = datetime.now(UTC)
    started = time.perf_counter()
    rows = [event_row(decode_event(v), "t", 0, i, now) for i, v in enumerate(values)]
    pa.Table.from_pylist(rows, schema=schema)
    baseline = events / (time.perf_counter() - started)
    with BatchDecoder(schema, isolate=True) as decoder:
        decoder.decode(values[:10])  # start the decoder process outside the timing
        started = time.perf_counter()
        decoded = decoder.decode(values)
        n = len(values)
        with_coordinates(decoded.events, schema, "t", pa.array([0] * n, pa.int32()), pa.array(range(n)), now)
        rate = events / (time.perf_counter() - started)
    figures = [Figure("batch decode vs per-record decode_event", rate, baseline, "events/s")]
    result = {
        "events": events,
        "events_per_s": rate,
        "baseline_events_per_s": baseline,
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("decode", figures, result)
    return result


def ingest_peak_rss(settings: Settings, topic: str, group: str) -> tuple[int, float]:
    """Run ``trajlake ingest --until-idle`` as a child on ``topic``; returns its peak tree RSS and seconds."""
    env = cli_env(settings, TRAJLAKE_TOPIC=topic, TRAJLAKE_CONSUMER_GROUP=group)
    return child_peak_rss(["ingest", "--until-idle", "2"], env)


def bench_memory(events: int = 1_000_000, home: Path | None = None) -> dict[str, Any]:
    """Ingest peak RSS (process tree) with a backlog of ``events`` vs a backlog ten times smaller.

    A ratio near 1 means memory does not grow with the backlog (batches are bounded).
    """
    small = max(events // 10, 1)
    with bench_home(home) as settings:
        topics = {}
        for size in (small, events):
            topic = f"{settings.topic}-{size}"
            ensure_topic(resolve_bootstrap(settings), topic, settings.topic_partitions)
            produce_encoded(settings.model_copy(update={"topic": topic}), encoded_events(size))
            topics[size] = topic
        small_rss, _ = ingest_peak_rss(settings, topics[small], f"mem-{small}")
        big_rss, big_s = ingest_peak_rss(settings, topics[events], f"mem-{events}")
    figures = [
        Figure(
            f"ingest peak RSS, backlog {events:,} vs {small:,}",
            big_rss / 2**20,
            small_rss / 2**20,
            "MiB",
            higher_is_better=False,
        )
    ]
    result = {
        "events": events,
        "peak_rss_mib": big_rss / 2**20,
        "baseline_peak_rss_mib": small_rss / 2**20,
        "ingest_s": big_s,
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("memory", figures, result)
    return result


_SCALEOUT_CONFIGS = ("one", "two", "one pinned", "two pinned", "two apart pinned")


def _scaleout_cpus(config: str, round_: int) -> list[set[int]] | None:
    """Pins for a configuration: none unpinned; one CPU per child pinned (the lone child alternates CPUs)."""
    if "pinned" not in config:
        return None
    available = sorted(os.sched_getaffinity(0))
    if config == "one pinned":
        return [{available[round_ % 2]}]
    return [{available[0]}, {available[1]}]


def _scaleout_child_line(index: int, run: Any) -> str:
    """One child's coordination and CPU split: what tells ingest's own costs from the scheduler's."""
    extra, events = run.extra, max(run.events, 1)
    per_event = {k: extra.get(f"{k}_cpu_s", 0.0) / events * 1e6 for k in ("worker", "decoder")}
    switches = ", ".join(
        f"{k} {v[0] / events * 1e3:.1f} + {v[1] / events * 1e3:.1f}"
        for k in ("worker", "decoder")
        if (v := extra.get(f"{k}_switches"))
    )
    return (
        f"      child {index}: {run.events:,} events, {extra.get('batches')} batches, "
        f"{extra.get('commit_retries')} commit retries, {extra.get('skipped')} skipped, "
        f"{extra.get('assignments')} assignments / {extra.get('revocations')} revocations; "
        f"worker {per_event['worker']:.2f} + decoder {per_event['decoder']:.2f} µs/event; "
        f"context switches per 1k events (voluntary + involuntary): {switches}; "
        f"CPUs {extra.get('cpus')} (decoder {extra.get('decoder_cpus')})"
    )


def bench_scaleout(events: int = 300_000, home: Path | None = None, rounds: int = 2) -> dict[str, Any]:
    """Two ingest processes in one consumer group vs one, on the same backlog, with a duplicate check.

    Each run drains the same topic into its own namespace with ``benchmarks/ingest_child.py``
    children (one, or two at once in one group). The figure is CPU per event: each child's worker
    process over ``run()`` plus its decoder process after start-up (imports and start-up are per
    process, not per event), summed over the children. Two processes on two machines' worth of
    cores land ``2 × (one's CPU per event ÷ two's)`` as many events per second as one: the
    scale-out factor printed, which is 2.0 when sharing the partitions costs nothing per event
    (group rebalances, smaller batches, more commits, commit races).

    Unpinned, the lone process (worker + decoder) has both cores and the pair's four processes
    share them, so the pair's extra CPU mixes the scheduler's (caches, context switches) with
    ingest's own. The same two configurations are run pinned as well, one CPU per child (its
    worker and the decoder it spawns share that CPU), so that both have exactly one core per
    ingest: ``2 × one-pinned ÷ two-pinned`` is the scale-out factor without the oversubscription,
    and ``one-pinned ÷ one`` what squeezing one ingest onto one core costs by itself. A fifth
    configuration splits the pinned pair's extra CPU in two: two pinned children "apart", each in
    a consumer group of its own draining the whole backlog into its own namespace, share the
    machine as the pair does but no work: ``apart ÷ one-pinned`` is the cost of running beside
    another ingest (caches, memory bandwidth, the hypervisor), ``two-pinned ÷ apart`` the cost of
    sharing one group's partitions (rebalances, smaller shares, more commits, commit retries).
    The configurations rotate within each round (reversed in odd rounds). Per run it prints each
    child's batches, commit retries, skipped records, rebalances, worker and decoder CPU per
    event and context switches. Wall time is printed beside: on this 2-core machine two
    processes cannot run faster by the clock than one that already keeps both cores busy.
    """
    from benchmarks.ingest_ab import run_group
    from warehouse.query import run_query

    pinning = len(os.sched_getaffinity(0)) >= 2
    configs = _SCALEOUT_CONFIGS if pinning else _SCALEOUT_CONFIGS[:2]
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    wall: dict[str, list[float]] = {c: [] for c in configs}
    children: dict[str, list[list[dict[str, Any]]]] = {c: [] for c in configs}
    checks: list[tuple[int, int, int]] = []
    rows: dict[int, int] = {}
    with bench_home(home) as settings:
        produce_encoded(settings, encoded_events(events))
        for round_ in range(rounds):
            for config in configs if round_ % 2 == 0 else configs[::-1]:
                workers, apart = (2 if config.startswith("two") else 1), "apart" in config
                namespace = f"scale_{config.replace(' ', '_')}_{round_}"
                runs = run_group(settings, workers, namespace, cpus=_scaleout_cpus(config, round_), apart=apart)
                for written in [f"{namespace}_{i}" for i in range(workers)] if apart else [namespace]:
                    total, distinct, partitions = run_query(
                        settings.model_copy(update={"namespace": written}),
                        "SELECT count(*), count(DISTINCT event_id), count(DISTINCT kafka_partition) FROM events",
                    )[1][0]
                    if distinct != events:
                        raise RuntimeError(f"{config}: {written} holds {distinct} distinct of {events} events")
                if not apart:
                    rows[workers] = total
                if workers == 2 and not apart:
                    checks.append((total - distinct, events - distinct, partitions))
                landed = sum(r.events for r in runs)
                if landed != events * (workers if apart else 1):
                    raise RuntimeError(f"{config}: landed {landed} of {events} events per group")
                cpu[config].append(sum(r.cpu_s for r in runs) / landed * 1e6)
                first = min(r.extra["first_at"] for r in runs if r.extra.get("first_at"))
                wall[config].append(max(r.extra["last_at"] for r in runs) - first)
                children[config].append([{"events": r.events, "cpu_s": r.cpu_s, **r.extra} for r in runs])
                split = ", ".join(f"{r.events:,} events {r.cpu_s / max(r.events, 1) * 1e6:.2f} µs" for r in runs)
                print(
                    f"  {config} (round {round_}): {cpu[config][-1]:.2f} µs CPU/event, "
                    f"{landed / wall[config][-1] / 1e3:.1f}k events/s ({split})",
                    flush=True,
                )
                for index, run in enumerate(runs):
                    print(_scaleout_child_line(index, run), flush=True)
    median = {c: statistics.median(cpu[c]) for c in configs}
    one, two = median["one"], median["two"]
    one_wall, two_wall = statistics.median(wall["one"]), statistics.median(wall["two"])
    figures = [
        Figure("events per CPU-second, 2 processes vs 1 (medians)", 1e6 / two, 1e6 / one, "events/CPU-s"),
        Figure(
            "wall, first record → last commit, 2 processes vs 1 (2 cores shared)",
            events / two_wall,
            events / one_wall,
            "events/s",
        ),
    ]
    if pinning:
        figures.append(
            Figure(
                "events per CPU-second, 2 processes vs 1, one CPU per process (medians)",
                1e6 / median["two pinned"],
                1e6 / median["one pinned"],
                "events/CPU-s",
            )
        )
    result = {
        "events": events,
        "rounds": rounds,
        "one_cpu_us_per_event": cpu["one"],
        "two_cpu_us_per_event": cpu["two"],
        "scale_out_factor": 2 * one / two,
        "wall_ratio": one_wall / two_wall,
        "one_pinned_cpu_us_per_event": cpu.get("one pinned"),
        "two_pinned_cpu_us_per_event": cpu.get("two pinned"),
        "scale_out_factor_pinned": 2 * median["one pinned"] / median["two pinned"] if pinning else None,
        "lone_pinning_cost": median["one pinned"] / one if pinning else None,
        "two_apart_pinned_cpu_us_per_event": cpu.get("two apart pinned"),
        # two pinned ingests in groups of their own (each draining the whole backlog) against the lone
        # pinned one: what running beside another ingest costs by itself, without sharing any work
        "co_running_cost": median["two apart pinned"] / median["one pinned"] if pinning else None,
        # the pair in one group against the same two apart: ingest's own cost of sharing the partitions
        "coordination_cost": median["two pinned"] / median["two apart pinned"] if pinning else None,
        "one_worker_rows": rows[1],
        "two_workers_rows": rows[2],
        "two_workers_duplicates": max(c[0] for c in checks),
        "two_workers_lost": max(c[1] for c in checks),
        "partitions_covered": min(c[2] for c in checks),
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("scaleout", figures, result)
    result["children"] = children  # per run, per child: what the lines above printed (not printed again)
    print(
        f"  scale-out factor 2 × {one:.2f} / {two:.2f} µs = {result['scale_out_factor']:.2f}× one process "
        f"(target ≥ 1.8×); duplicates {result['two_workers_duplicates']}, lost {result['two_workers_lost']}, "
        f"partitions {result['partitions_covered']}"
    )
    if pinning:
        one_pinned, two_pinned = median["one pinned"], median["two pinned"]
        print(
            f"  one CPU per process: 2 × {one_pinned:.2f} / {two_pinned:.2f} µs = "
            f"{result['scale_out_factor_pinned']:.2f}× one process; the lone process pinned to one CPU "
            f"costs {result['lone_pinning_cost']:.2f}× its unpinned CPU per event "
            f"(so 2 × unpinned one / pinned two = {2 * one / two_pinned:.2f}×)"
        )
        print(
            f"  pinned pair {two_pinned:.2f} µs = lone pinned {one_pinned:.2f} µs × {result['co_running_cost']:.2f} "
            f"(two ingests apart, each its own group and whole backlog, {median['two apart pinned']:.2f} µs: "
            f"running beside another ingest) × {result['coordination_cost']:.2f} (sharing one group's partitions)"
        )
    return result


def _watch_events(settings: Settings, out: str, stop: Any, seen_count: Any, poll_s: float) -> None:
    """In a process of its own: read the ``events`` view as ``trajlake sql`` opens it, stamping new events.

    A thread reads the catalog's pointers every ``poll_s`` (one SQLite query) and notes when it
    first saw each table's metadata file. Whenever a table has moved, the loop opens the locked
    views the way a ``trajlake sql`` query does (the cached view plan while the catalog still
    points where it was made, else through the catalog, which saves a new plan) and reads the
    event ids it has not seen. An event is stamped (``time.monotonic()``, one clock for every
    process) with the moment the catalog was first seen pointing at the ``raw_events`` metadata
    file those views read (the plan names it): a query started then would have found the event.
    When the plan does not say, or the file was never seen, the end of the opening stands in,
    so the stamp is never earlier than the event became visible. Writes ``out`` (Parquet:
    event_id, visible_at) and, per round, how long opening the views took.
    """
    import json
    import os
    import threading

    import pyarrow.parquet as pq

    from warehouse.sql import open_views
    from warehouse.view_plan import catalog_pointers, open_planned_views, plan_path

    first_seen: dict[str, float] = {}
    pointers: dict[tuple[str, str], str] = {}

    def watch() -> None:
        nonlocal pointers
        while not stop.is_set():
            seen_at = time.monotonic()
            with contextlib.suppress(Exception):
                pointers = catalog_pointers(settings)
                for location in pointers.values():
                    first_seen.setdefault(location, seen_at)
            time.sleep(poll_s)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    visible: dict[str, float] = {}
    next_offset: dict[int, int] = {}
    opening: list[float] = []
    last: dict[tuple[str, str], str] | None = None
    raw_key = [settings.namespace, RAW_EVENTS.name]
    while not stop.is_set():
        if pointers == last:  # no table moved: a query now sees what the last round saw
            time.sleep(poll_s)
            continue
        last = pointers
        started, started_wall = time.monotonic(), time.time()
        con = open_planned_views(settings)
        replayed = con is not None
        if con is None:
            con = open_views(settings, locked=True, save_plan=True)
        opened = time.monotonic()
        opening.append(opened - started)
        stamp = opened
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            path = plan_path(settings)
            # The plan just replayed, or the one this opening saved: the metadata files these
            # views read (a plan older than the opening, when saving failed, says nothing).
            if replayed or os.stat(path).st_mtime >= started_wall:
                tables = json.loads(path.read_text())["body"]["tables"]
                read = [location for ns, name, location in tables if [ns, name] == raw_key]
                if read:
                    stamp = min(first_seen.get(read[0], opened), opened)
        # Visibility is a prefix of each partition (batches commit in offset order), so files
        # wholly below every partition's next unseen offset are skipped by their statistics.
        low = min(next_offset.get(p, 0) for p in range(settings.topic_partitions))
        rows = con.sql(f"SELECT event_id, kafka_partition, kafka_offset FROM events WHERE kafka_offset >= {low}")
        for event_id, partition, offset in rows.fetchall():
            if event_id not in visible:
                visible[event_id] = stamp
                next_offset[partition] = max(next_offset.get(partition, 0), offset + 1)
        con.close()
        seen_count.value = len(visible)
    watcher.join()
    table = pa.table({"event_id": list(visible), "visible_at": list(visible.values())})
    pq.write_table(table.replace_schema_metadata({"opening": ",".join(f"{x:.4f}" for x in opening)}), out)


def _consume_plain(settings: Settings, out: str, stop: Any, ready: Any) -> None:
    """In a process of its own: a plain consumer in a new group, stamping each event as it arrives."""
    import pyarrow.parquet as pq

    group = f"fresh-{uuid.uuid4().hex[:6]}"
    config = consumer_config(
        settings.model_copy(update={"consumer_group": group}), resolve_bootstrap(settings), follow=True
    )
    consumer = Consumer({**config, "fetch.min.bytes": 1, "fetch.wait.max.ms": 10})
    consumer.subscribe([settings.topic], on_assign=lambda *_: ready.set())
    delivered: dict[str, float] = {}
    while not stop.is_set():
        for message in consumer.consume(num_messages=1000, timeout=0.1):
            if message.error() is None:
                event_id = dict(message.headers() or []).get("event_id")
                if isinstance(event_id, bytes):
                    delivered.setdefault(event_id.decode(), time.monotonic())
    consumer.close()
    pq.write_table(pa.table({"event_id": list(delivered), "delivered_at": list(delivered.values())}), out)


def _freshness_run(rate: float, seconds: float, poll_s: float) -> dict[str, Any]:
    """One freshness run at ``rate`` events/s on a fresh lakehouse and broker (see :func:`bench_freshness`)."""
    import multiprocessing
    import signal
    import tempfile

    import numpy as np
    import pyarrow.parquet as pq

    warm_up = 20
    records = encoded_events(int(rate * seconds) + warm_up)
    mp = multiprocessing.get_context("spawn")
    with bench_home() as settings, tempfile.TemporaryDirectory(prefix="trajlake-fresh-") as scratch:
        stop, ready, seen = mp.Event(), mp.Event(), mp.Value("q", 0)
        visible_file, delivered_file = f"{scratch}/visible.parquet", f"{scratch}/delivered.parquet"
        ingest = cli_child(["ingest", "--follow"], cli_env(settings))
        table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
        children = [
            mp.Process(target=_watch_events, args=(settings, visible_file, stop, seen, poll_s)),
            mp.Process(target=_consume_plain, args=(settings, delivered_file, stop, ready)),
        ]
        for child in children:
            child.start()
        sent = np.zeros(len(records))
        try:
            producer = EventProducer(
                resolve_bootstrap(settings), settings.topic, "fresh-host", extra_config={"linger.ms": "5"}
            )
            # A few events first, not measured: traffic begins once the ingest process has
            # joined its group and they are visible, and the plain consumer has its partitions.
            for session_id, event_id, value in records[:warm_up]:
                producer.send(session_id, event_id, value)
            producer.flush(60)
            deadline = time.monotonic() + 180
            while (seen.value < warm_up or not ready.is_set()) and time.monotonic() < deadline:
                time.sleep(0.2)
            if seen.value < warm_up:
                raise RuntimeError("the warm-up events did not become visible within 180 s")
            start, wall_start = time.monotonic(), time.time()
            i = warm_up
            while i < len(records):
                # Send what is due, in steps of ~5 ms: one sleep per event cannot keep 20,000/s.
                due = min(len(records), warm_up + int((time.monotonic() - start) * rate) + 1)
                for j in range(i, due):
                    session_id, event_id, value = records[j]
                    sent[j] = time.monotonic()
                    producer.send(session_id, event_id, value)
                i = due
                time.sleep(0.005)
            send_seconds = time.monotonic() - start
            producer.flush(60)
            deadline = time.monotonic() + 60
            while seen.value < len(records) and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            stop.set()
            for child in children:
                child.join(60)
            ingest.send_signal(signal.SIGTERM)
            ingest.wait(60)
        table = table.refresh()
        # The commits while traffic was sent: the cadence, and the small files it leaves for maintenance.
        window = (wall_start * 1000, (wall_start + send_seconds) * 1000)
        commits = [s for s in table.snapshots() if s.summary is not None and window[0] <= s.timestamp_ms <= window[1]]
        data_files = sum(int(s.summary.get("added-data-files") or 0) for s in commits if s.summary is not None)
        # What the follower left: its upkeep (TRAJLAKE_INGEST_FOLLOW_UPKEEP_SECONDS) bounds these.
        left = {
            "raw_events_snapshots_at_end": len(table.snapshots()),
            "raw_events_metadata_bytes_at_end": len(table.io.new_input(table.metadata_location)),
            "raw_events_live_files_at_end": sum(1 for _ in live_files(table)),
        }
        visible_rows = pq.read_table(visible_file)
        delivered_rows = pq.read_table(delivered_file)
    index = {r[1]: j for j, r in enumerate(records) if j >= warm_up}
    opening = [float(x) for x in (visible_rows.schema.metadata or {}).get(b"opening", b"").decode().split(",") if x]
    lag = np.array(
        [
            t - sent[index[k]]
            for k, t in zip(
                visible_rows.column("event_id").to_pylist(), visible_rows.column("visible_at").to_pylist(), strict=True
            )
            if k in index
        ]
    )
    kafka = np.array(
        [
            t - sent[index[k]]
            for k, t in zip(
                delivered_rows.column("event_id").to_pylist(),
                delivered_rows.column("delivered_at").to_pylist(),
                strict=True,
            )
            if k in index
        ]
    )
    if len(lag) < len(index):
        raise RuntimeError(f"only {len(lag)} of {len(index)} events became visible within 60 s after the last send")
    return {
        "rate_per_s": rate,
        "events": len(index),
        "sent_per_s": len(index) / send_seconds,
        "visible_p50_s": float(np.percentile(lag, 50)),
        "visible_p95_s": float(np.percentile(lag, 95)),
        "visible_max_s": float(lag.max()),
        "kafka_p50_s": float(np.percentile(kafka, 50)),
        "kafka_p95_s": float(np.percentile(kafka, 95)),
        "kafka_max_s": float(kafka.max()),
        "raw_events_commits_per_s": len(commits) / send_seconds,
        "data_files_per_hour": data_files / send_seconds * 3600,
        "view_open_p50_s": float(np.percentile(opening, 50)) if opening else float("nan"),
        **left,
    }


def bench_freshness(
    rate: float = 2_000.0, seconds: float = 60.0, scale: float = 10.0, poll_s: float = 0.05
) -> dict[str, Any]:
    """``trajlake ingest --follow``: time from an event's send to its visibility through the ``events`` view.

    Events are sent at a steady ``rate`` (2,000/s ≈ the average of 3M sessions/day, the demo's
    rate) for ``seconds``, then again at ``scale`` times that rate, each run on a fresh lakehouse
    and broker. A process of its own watches the catalog every ``poll_s`` and reads the ``events``
    view as ``trajlake sql`` opens it whenever a table moved (:func:`_watch_events`). Baseline,
    in the same run: the broker's own delivery latency, send → received by a plain consumer in
    another group. The ratio says how much later than
    Kafka itself an event becomes queryable. Also reported per run: raw_events commits per second
    and data files added per hour at that rate (what ``trajlake maintain`` compacts).
    """
    rates = [rate] if scale == 1 else [rate, rate * scale]
    runs = [_freshness_run(r, seconds, poll_s) for r in rates]
    figures = [
        Figure(
            f"freshness p95 at {run['rate_per_s']:,.0f} events/s: send → visible in the events view"
            " vs send → Kafka consumer",
            run["visible_p95_s"],
            run["kafka_p95_s"],
            "s",
            higher_is_better=False,
        )
        for run in runs
    ]
    result: dict[str, Any] = {}
    for run in runs:
        tag = f"{run['rate_per_s']:.0f}/s"
        result.update({f"{key} @{tag}": value for key, value in run.items() if key != "rate_per_s"})
    result["figures"] = [f.as_dict() for f in figures]
    print_figures("freshness", figures, result)
    return result
