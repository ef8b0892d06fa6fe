"""One measured run for the ingest A/B (`benchmarks.ingest_ab`), started as ``python -P <this file> MODE``.

It runs under whichever checkout ``PYTHONPATH`` names (the baseline commit or the current tree), so
it imports only what every checkout since 2026-12-01 has: ``pipelines.ingest.IngestWorker``,
``pipelines.ingest.consumer_config``, ``warehouse.catalog.open_catalog`` and ``load_settings`` (in
``common.settings`` now, ``pipelines.settings`` before). Settings come from the ``TRAJLAKE_*``
environment the driver sets. It prints one JSON line:

* ``cpu_s``: CPU time (rusage) of the measured part — ingest: the worker process from the start of
  ``run()`` to its return, plus its decoder process after start-up; consume: the loop;
* ``cpu_before_s``: CPU time spent before that — this process's imports, settings and the worker's
  construction, and the decoder process's start-up (waited for, so it is not counted twice);
* ``first_at`` / ``last_at``: wall clock (``time.time()``) of the first record received and the
  end of the work (ingest: the last ``raw_events`` snapshot; consume: the last record);
* ``events``: records ingested (or consumed);
* ingest only: ``worker_cpu_s`` and ``decoder_cpu_s``, the CPU of each of the two processes after
  set-up, the worker's phase timings where the checkout records them, and ``worker_gc_s`` /
  ``worker_gc_collections``: the CPU the worker process's cyclic garbage collector took over
  ``run()`` (thread CPU of the collecting thread, from ``gc.callbacks``), and how many collections;
* ``kafka_threads_cpu_s``: the part of the measured CPU that librdkafka's own threads took
  (read from ``/proc`` while they run: they have no Python stack for a profiler to sample);
* ingest only, for ``bench scaleout``: ``commit_retries`` and ``skipped`` from the worker's stats
  (``None`` where the checkout has no such count), ``assignments`` / ``revocations``: how often the
  group handed the worker partitions and took them back, ``worker_switches`` / ``decoder_switches``:
  voluntary and involuntary context switches of each process over the measured span (all
  threads; the decoder's from ``/proc`` at the start and its reaped rusage at the end), and
  ``cpus`` / ``decoder_cpus``: the CPUs each process may run on.

``INGEST_CHILD_CPUS`` (e.g. ``0`` or ``0,1``) pins this process to those CPUs before the worker
is built, so its decoder process, spawned from it, and every thread inherit the pin
(``decoder_cpus`` shows that they did).

Modes: ``ingest`` (one worker, ``--until-idle``) and ``consume`` (a plain consumer with the
worker's own consumer settings that reads every record's value and drops it: the floor any
ingest on this client pays).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import resource
import sys
import threading
import time
from typing import Any


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _settings() -> Any:
    for module in ("common.settings", "pipelines.settings"):
        try:
            return importlib.import_module(module).load_settings()
        except ModuleNotFoundError:
            continue
    raise RuntimeError("no load_settings in this checkout")


class _FirstRecord:
    """The worker's consumer, noting when the first record arrives (every other call passes through)."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self.first_at: float | None = None

    def consume(self, *args: Any, **kwargs: Any) -> Any:
        messages = self._consumer.consume(*args, **kwargs)
        if messages and self.first_at is None:
            self.first_at = time.time()
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a running process has used, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_faults(pid: int) -> tuple[float, int]:
    """System CPU seconds and minor page faults of a running process, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK"), int(fields[7])


CPUS_ENV = "INGEST_CHILD_CPUS"


def pin_from_env() -> None:
    """Pin this process to the CPUs ``INGEST_CHILD_CPUS`` lists (comma-separated), if it is set."""
    text = os.environ.get(CPUS_ENV, "").strip()
    if text:
        os.sched_setaffinity(0, {int(cpu) for cpu in text.split(",")})


def _thread_switches(pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches so far of a running process's live threads."""
    voluntary = involuntary = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        involuntary += int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            continue
    return voluntary, involuntary


class _Rebalances:
    """Counts the group's assignments and revocations by wrapping the worker's callbacks before ``run()``."""

    def __init__(self, worker: Any) -> None:
        self.assignments = self.revocations = 0
        on_assign, on_revoke = getattr(worker, "_on_assign", None), getattr(worker, "_on_revoke", None)
        if on_assign is None or on_revoke is None:
            return

        def assign(consumer: Any, partitions: Any) -> None:
            self.assignments += 1
            on_assign(consumer, partitions)

        def revoke(consumer: Any, partitions: Any) -> None:
            self.revocations += 1
            on_revoke(consumer, partitions)

        worker._on_assign, worker._on_revoke = assign, revoke


def _decoder_pid(worker: Any) -> int | None:
    child = getattr(getattr(getattr(worker, "decoder", None), "_decoder", None), "_process", None)
    return getattr(child, "pid", None)


def _decoder_started(worker: Any) -> float:
    """Wait until the worker's decoder process has finished starting; its CPU so far (0 if none is found).

    Every checkout since 2026-12-01 starts the decoder process in the worker's constructor and has it
    send a ready message once its imports are done; the message is left in the pipe for the worker.
    """
    process = getattr(getattr(worker, "decoder", None), "_decoder", None)
    conn, child = getattr(process, "_conn", None), getattr(process, "_process", None)
    if conn is None or child is None or child.pid is None:
        return 0.0
    conn.poll(120)
    return _process_cpu(child.pid)


class _KafkaThreads:
    """CPU of librdkafka's own threads (named ``rdk:…``) in this process, read from ``/proc`` every 0.25 s.

    They have no Python frame, so a sampling profiler of Python stacks never sees them; they end
    when the consumer closes, so they are read while they run and the last reading of each counts.
    """

    def __init__(self) -> None:
        self._seen: dict[int, float] = {}
        self._start: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> dict[int, float]:
        out: dict[int, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as stat:
                    text = stat.read()
            except OSError:
                continue
            name, rest = text.split("(", 1)[1].rsplit(")", 1)
            if name.startswith("rdk:"):
                fields = rest.split()
                out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self._seen.update(self._read())

    def start(self) -> None:
        self._start = self._read()
        self._seen.update(self._start)
        self._thread.start()

    def stop(self) -> float:
        """CPU seconds the threads used since :meth:`start`."""
        self._stop.set()
        self._thread.join()
        self._seen.update(self._read())
        return sum(self._seen.values()) - sum(self._start.values())


class _CollectorTimer:
    """Thread CPU taken by the cyclic garbage collector's collections in this process, while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        elif self._started is not None:  # a collection runs to its end in the thread that started it
            self.seconds += time.thread_time() - self._started
            self.collections += 1
            self._started = None


def run_ingest(until_idle: float) -> dict[str, Any]:
    """Drain the topic with one ingest worker into a fresh lakehouse."""
    settings = _settings()
    worker = importlib.import_module("pipelines.ingest").IngestWorker(settings)
    probe = _FirstRecord(worker.consumer)
    worker.consumer = probe
    decoder_before = _decoder_started(worker)
    collector = _CollectorTimer()
    gc.callbacks.append(collector)
    decoder_pid = _decoder_pid(worker)
    decoder_sys_before, decoder_faults_before = _process_faults(decoder_pid) if decoder_pid else (0.0, 0)
    decoder_switches_before = _thread_switches(decoder_pid) if decoder_pid else (0, 0)
    decoder_cpus = sorted(os.sched_getaffinity(decoder_pid)) if decoder_pid else None
    rebalances = _Rebalances(worker)
    kafka_threads = _KafkaThreads()
    kafka_threads.start()
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = _cpu_self()
    stats = worker.run(until_idle=until_idle)  # returns once the decoder process has exited (and is reaped)
    gc.callbacks.remove(collector)
    kafka_threads_cpu = kafka_threads.stop()
    worker_cpu, decoder = _cpu_self() - cpu_before, resource.getrusage(resource.RUSAGE_CHILDREN)
    self_after = resource.getrusage(resource.RUSAGE_SELF)
    decoder_cpu = decoder.ru_utime + decoder.ru_stime - decoder_before
    catalog = importlib.import_module("warehouse.catalog").open_catalog(settings)
    table = catalog.load_table((settings.namespace, "raw_events"))
    last_ms = max((s.timestamp_ms for s in table.snapshots()), default=0)
    timings = getattr(stats, "timings", None)
    return {
        "events": stats.events,
        "dead_letters": stats.dead_letters,
        "batches": stats.batches,
        "cpu_before_s": cpu_before + decoder_before,
        "cpu_s": worker_cpu + decoder_cpu,
        # the split: this process after set-up, and its decoder process after its start-up
        "worker_cpu_s": worker_cpu,
        "decoder_cpu_s": decoder_cpu,
        "worker_gc_s": collector.seconds,
        "kafka_threads_cpu_s": kafka_threads_cpu,
        "worker_gc_collections": collector.collections,
        # system time and minor page faults of each process over the same span
        "worker_sys_s": self_after.ru_stime - self_before.ru_stime,
        "worker_faults": self_after.ru_minflt - self_before.ru_minflt,
        "decoder_sys_s": decoder.ru_stime - decoder_sys_before,
        "decoder_faults": decoder.ru_minflt - decoder_faults_before,
        "commit_retries": getattr(stats, "commit_retries", None),
        "skipped": getattr(stats, "skipped", None),
        "assignments": rebalances.assignments,
        "revocations": rebalances.revocations,
        "worker_switches": [
            self_after.ru_nvcsw - self_before.ru_nvcsw,
            self_after.ru_nivcsw - self_before.ru_nivcsw,
        ],
        "decoder_switches": [
            decoder.ru_nvcsw - decoder_switches_before[0],
            decoder.ru_nivcsw - decoder_switches_before[1],
        ],
        "cpus": sorted(os.sched_getaffinity(0)),
        "decoder_cpus": decoder_cpus,
        "first_at": probe.first_at,
        "last_at": last_ms / 1000,
        "phases": None
        if timings is None
        else {"consume_s": timings.consume_s, "decode_s": timings.decode_s, "commit_s": timings.commit_s},
    }


def run_consume(expected: int) -> dict[str, Any]:
    """Read ``expected`` records in a new group with the worker's consumer settings; touch each value."""
    from confluent_kafka import Consumer

    settings = _settings()
    config = importlib.import_module("pipelines.ingest").consumer_config(settings, settings.kafka_bootstrap)
    consumer = Consumer(config)
    consumer.subscribe([settings.topic])
    seen = n_bytes = 0
    first_at: float | None = None
    kafka_threads = _KafkaThreads()
    kafka_threads.start()
    cpu_before = _cpu_self()
    deadline = time.monotonic() + 120 + expected / 2000
    try:
        while seen < expected and time.monotonic() < deadline:
            messages = consumer.consume(num_messages=10_000, timeout=0.5)
            if messages and first_at is None:
                first_at = time.time()
            for message in messages:
                if message.error() is None:
                    n_bytes += len(message.value() or b"")
                    seen += 1
        last_at, cpu = time.time(), _cpu_self() - cpu_before
        kafka_threads_cpu = kafka_threads.stop()
    finally:
        consumer.close()
    return {
        "events": seen,
        "bytes": n_bytes,
        "cpu_before_s": cpu_before,
        "cpu_s": cpu,
        "kafka_threads_cpu_s": kafka_threads_cpu,
        "first_at": first_at,
        "last_at": last_at,
    }


def main() -> None:
    mode, argument = sys.argv[1], float(sys.argv[2])
    pin_from_env()
    result = run_ingest(argument) if mode == "ingest" else run_consume(int(argument))
    result["pid"] = os.getpid()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
