"""Ingest cost per event, compared in one run: two checkouts (A/B), or this tree against a consume-only loop (guard).

Every measured run is a child process (``benchmarks/ingest_child.py`` under ``PYTHONPATH`` of
its checkout, the same interpreter and venv) that drains one pre-produced backlog on the same
embedded broker into a fresh lakehouse (its own ``TRAJLAKE_HOME``, a new consumer group). Its CPU
time is rusage of the worker process over ``run()`` plus its decoder process after start-up:
imports and start-up are a fixed cost per process, not a cost per event, and would otherwise
weigh on short runs more than on long ones. The machine has two cores shared with other work, so
CPU µs per event is the primary figure and events/s (first record received → last ``raw_events``
snapshot) is reported beside it.

``bench_ingest_ab`` alternates the checkouts (A B, then B A, ...: the order is balanced across
rounds, so a drift in the machine's speed falls on both) and a consume-only run per round, and
prints the medians and their ratios. ``bench_ingest_guard`` measures this tree only, against the
consume-only loop in the same run, and fails when the ratio drops below ``GUARD_FLOOR``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import bench_home, cli_env, encoded_events, produce_encoded
from common.settings import Settings

CHILD = Path(__file__).with_name("ingest_child.py")
#: This tree (the checkout the benchmarks run from).
HERE = Path(__file__).resolve().parents[1]

#: The guard's floor for ``consume-only CPU per event ÷ ingest CPU per event`` (median of the guard's
#: rounds). docs/performance.md ("Ingest cost per event") gives the measured values and spread it comes from.
GUARD_FLOOR = 0.165
GUARD_EVENTS = 200_000
GUARD_ROUNDS = 5
#: The child's CPU figures a profile's stages are laid over (``<name>_cpu_s``).
MEASURED = ("worker", "decoder", "kafka_threads")
#: py-spy's sampling rate for ``--profile`` (samples per second).
PROFILE_RATE = 250


@dataclass
class Run:
    """One child's measurement."""

    label: str
    events: int
    cpu_s: float  # CPU of the measured part (see ``benchmarks/ingest_child.py``)
    setup_cpu_s: float  # before it: imports, the worker's construction, the decoder process's start-up
    total_cpu_s: float  # the child's whole life and its reaped children's (wait4)
    wall_s: float  # first record received → end of the work
    extra: dict[str, Any]

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s / self.events * 1e6

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else 0.0


def _child_env(settings: Settings, checkout: Path, home: Path, group: str, **extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_") and k != "PYTHONPATH"},
        **cli_env(settings),
        "TRAJLAKE_HOME": str(home),
        "TRAJLAKE_CONSUMER_GROUP": group,
        "PYTHONPATH": str(checkout),
        **extra,
    }


def _start_child(
    env: dict[str, str], mode: str, argument: float, stderr_path: Path, profile: Path | None = None
) -> tuple[subprocess.Popen[bytes], Any]:
    command = [sys.executable, "-P", str(CHILD), mode, str(argument)]
    if profile is not None:
        # py-spy samples the worker and (--subprocesses) its decoder; its own CPU is not the child's.
        py_spy = Path(sys.executable).with_name("py-spy")
        command = [str(py_spy), "record", "--subprocesses", "--format", "raw", "--rate", str(PROFILE_RATE)]
        command += ["-o", str(profile), "--", sys.executable, "-P", str(CHILD), mode, str(argument)]
    stderr = stderr_path.open("wb")
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=stderr), stderr


def _finish_child(child: subprocess.Popen[bytes], stderr: Any, stderr_path: Path, label: str, mode: str) -> Run:
    assert child.stdout is not None
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    stderr.close()
    if child.returncode != 0:
        tail = stderr_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{label} {mode} child exited {child.returncode}: {tail}")
    result = json.loads([line for line in out.decode().splitlines() if line.startswith("{")][-1])
    # What the child logged (a batch decoded record by record after a timeout, commit retries):
    # kept with the run, since it explains an outlier.
    notes = [line for line in stderr_path.read_text(errors="replace").splitlines() if line.strip()]
    events = int(result["events"])
    if result.get("dead_letters"):
        raise RuntimeError(f"{label}: {result['dead_letters']} dead letters on a clean backlog")
    return Run(
        label=label,
        events=events,
        cpu_s=float(result["cpu_s"]),
        setup_cpu_s=float(result["cpu_before_s"]),
        total_cpu_s=usage.ru_utime + usage.ru_stime,
        wall_s=float(result["last_at"]) - float(result["first_at"]),
        extra={
            **{
                k: v
                for k, v in result.items()
                if k
                in (
                    "batches",
                    "phases",
                    "worker_cpu_s",
                    "decoder_cpu_s",
                    "worker_gc_s",
                    "worker_gc_collections",
                    "kafka_threads_cpu_s",
                    "worker_sys_s",
                    "worker_faults",
                    "decoder_sys_s",
                    "decoder_faults",
                    *("commit_retries", "skipped", "assignments", "revocations", "worker_switches"),
                    *("decoder_switches", "cpus", "decoder_cpus"),
                    "first_at",
                    "last_at",
                )
            },
            "notes": notes[-5:],
        },
    )


def run_child(
    settings: Settings, checkout: Path, mode: str, argument: float, label: str, profile: Path | None = None
) -> Run:
    """Run one child under ``checkout`` on ``settings``' broker and topic, in a fresh home and a new group."""
    home = Path(tempfile.mkdtemp(prefix=f"trajlake-ab-{label}-"))
    try:
        env = _child_env(settings, checkout, home, f"ab-{label}-{uuid.uuid4().hex[:8]}")
        child, stderr = _start_child(env, mode, argument, home / "stderr.log", profile)
        return _finish_child(child, stderr, home / "stderr.log", label, mode)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_group(
    settings: Settings,
    workers: int,
    namespace: str,
    until_idle: float = 1.0,
    cpus: list[set[int]] | None = None,
    apart: bool = False,
) -> list[Run]:
    """``workers`` ingest children of this tree at once, in one consumer group, into ``settings``' home.

    They share the home (one catalog) and write ``namespace``, so what they landed together can be
    checked for duplicates and loss afterwards. ``cpus``, one set per child, pins each child (its
    worker, and so the decoder it spawns) to those CPUs. ``apart``: each child in a group of its
    own, writing ``<namespace>_<i>``, so each drains the whole topic alone while the others run.
    """
    group = f"scale-{namespace}-{uuid.uuid4().hex[:8]}"
    envs = [
        _child_env(
            settings,
            HERE,
            settings.home_dir,
            f"{group}-{i}" if apart else group,
            TRAJLAKE_NAMESPACE=f"{namespace}_{i}" if apart else namespace,
        )
        for i in range(workers)
    ]
    if cpus is not None:
        envs = [{**env, "INGEST_CHILD_CPUS": ",".join(map(str, sorted(cpus[i])))} for i, env in enumerate(envs)]
    logs = [settings.home_dir / f"{namespace}-{i}.log" for i in range(workers)]
    started = [_start_child(child_env, "ingest", until_idle, log) for child_env, log in zip(envs, logs, strict=True)]
    return [
        _finish_child(child, stderr, log, f"{namespace}-{i}", "ingest")
        for i, ((child, stderr), log) in enumerate(zip(started, logs, strict=True))
    ]


def _median(runs: list[Run], attribute: str) -> float:
    return statistics.median(getattr(r, attribute) for r in runs)


def _line(run: Run) -> str:
    line = (
        f"  {run.label:>12}: {run.events:,} events  {run.cpu_us_per_event:6.2f} µs CPU/event "
        f"({run.cpu_s:5.1f} s + set-up {run.setup_cpu_s:.1f} s)  {run.events_per_s / 1e3:6.1f}k events/s"
    )
    if "worker_cpu_s" in run.extra:
        per_event = {k: run.extra[f"{k}_cpu_s"] / run.events * 1e6 for k in ("worker", "decoder")}
        line += f"  (worker {per_event['worker']:.2f} + decoder {per_event['decoder']:.2f} µs"
        if "worker_gc_s" in run.extra:
            gc_us = run.extra["worker_gc_s"] / run.events * 1e6
            line += f"; worker's garbage collector {gc_us:.2f} µs in {run.extra['worker_gc_collections']} collections"
        if "worker_faults" in run.extra:
            line += "; system µs, page faults per event: " + ", ".join(
                f"{k} {run.extra[f'{k}_sys_s'] / run.events * 1e6:.2f}, {run.extra[f'{k}_faults'] / run.events:.2f}"
                for k in ("worker", "decoder")
            )
        if "kafka_threads_cpu_s" in run.extra:
            line += f"; librdkafka threads {run.extra['kafka_threads_cpu_s'] / run.events * 1e6:.2f} µs"
        line += ")"
    elif "kafka_threads_cpu_s" in run.extra:
        line += f"  (librdkafka threads {run.extra['kafka_threads_cpu_s'] / run.events * 1e6:.2f} µs)"
    for note in run.extra.get("notes", []):
        line += f"\n      {run.label} logged: {note[:200]}"
    return line


def _summary(label: str, runs: list[Run]) -> dict[str, Any]:
    cpu = [r.cpu_us_per_event for r in runs]
    return {
        "label": label,
        "runs": len(runs),
        "cpu_us_per_event": statistics.median(cpu),
        "cpu_us_per_event_range": [min(cpu), max(cpu)],
        "events_per_s": _median(runs, "events_per_s"),
        "events_per_cpu_s": 1e6 / statistics.median(cpu),
        # the worker process's garbage collector over run(), per event (ingest runs only)
        "worker_gc_us_per_event": statistics.median(gc)
        if (gc := [r.extra["worker_gc_s"] / r.events * 1e6 for r in runs if "worker_gc_s" in r.extra])
        else None,
    }


def bench_ingest_ab(
    checkouts: dict[str, Path],
    events: int = 947_050,
    rounds: int = 3,
    until_idle: float = 1.0,
    consume: bool = True,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    """Alternate the checkouts' ingest on one backlog; medians of CPU µs/event and events/s, and B/A.

    Args:
        checkouts: label → checkout directory, in A, B order (two or more).
        events: records in the backlog (the issue's run used 947,050).
        rounds: rounds; each runs every checkout once (order alternating) and one consume-only loop.
        until_idle: the workers' idle window before exiting (not in the measured wall time).
        consume: also run the consume-only loop each round (this tree's consumer settings).
        profile_dir: after the timed rounds, one py-spy run per checkout, raw stacks written here.
    """
    labels = list(checkouts)
    runs: dict[str, list[Run]] = {label: [] for label in [*labels, "consume-only"]}
    with bench_home() as settings:
        produce_encoded(settings, encoded_events(events))
        for round_ in range(rounds):
            order = labels if round_ % 2 == 0 else labels[::-1]
            for label in order:
                run = run_child(settings, checkouts[label], "ingest", until_idle, label)
                if run.events != events:
                    raise RuntimeError(f"{label} ingested {run.events} of {events} events")
                runs[label].append(run)
                print(_line(run), flush=True)
            if consume:
                run = run_child(settings, HERE, "consume", events, "consume-only")
                runs["consume-only"].append(run)
                print(_line(run), flush=True)
        if profile_dir is not None:
            profile_dir.mkdir(parents=True, exist_ok=True)
            for label in labels:
                stacks = profile_dir / f"{label}.txt"
                run = run_child(settings, checkout := checkouts[label], "ingest", until_idle, label, stacks)
                print(_line(run), flush=True)
                # py-spy stops the process for every sample, which inflates what it measures (librdkafka's
                # threads most): the stacks' shares are laid over the timed rounds' CPU (medians).
                timed = runs[label] or [run]
                measured = {
                    k: statistics.median(r.extra.get(f"{k}_cpu_s", 0.0) / r.events * 1e6 for r in timed)
                    for k in MEASURED
                }
                print_stage_table(stage_table(stacks, run.events, measured), f"{label} ({checkout})")
    summaries = {label: _summary(label, rs) for label, rs in runs.items() if rs}
    a, b = labels[0], labels[1]
    result: dict[str, Any] = {"events": events, "rounds": rounds, "summaries": summaries}
    result["b_over_a_cpu_us_per_event"] = summaries[b]["cpu_us_per_event"] / summaries[a]["cpu_us_per_event"]
    result["b_over_a_events_per_s"] = summaries[b]["events_per_s"] / summaries[a]["events_per_s"]
    print(f"== bench ingest-ab: {events:,} events, {rounds} rounds (medians) ==")
    for label, s in summaries.items():
        low, high = s["cpu_us_per_event_range"]
        line = (
            f"  {label:>12}: {s['cpu_us_per_event']:.2f} µs CPU/event ({low:.2f}–{high:.2f}), "
            f"{s['events_per_cpu_s'] / 1e3:.1f}k events per CPU-second, {s['events_per_s'] / 1e3:.1f}k events/s"
        )
        if consume and label != "consume-only":
            c = summaries["consume-only"]
            line += (
                f"; vs consume-only: CPU {c['cpu_us_per_event'] / s['cpu_us_per_event']:.3f}×, "
                f"events/s {s['events_per_s'] / c['events_per_s']:.2f}×"
            )
        print(line)
    print(
        f"  {b} / {a}: CPU per event {result['b_over_a_cpu_us_per_event']:.3f}×, "
        f"events/s {result['b_over_a_events_per_s']:.3f}×"
    )
    return result


def against_consume_only(
    settings: Settings, events: int, rounds: int, until_idle: float = 1.0
) -> tuple[list[Run], list[Run]]:
    """``rounds`` pairs of this tree's ingest and the consume-only loop on ``settings``' backlog (order alternating)."""
    ingest: list[Run] = []
    consume: list[Run] = []
    for round_ in range(rounds):
        pair = ("ingest", "consume") if round_ % 2 == 0 else ("consume", "ingest")
        for mode in pair:
            if mode == "ingest":
                run = run_child(settings, HERE, "ingest", until_idle, "ingest")
                if run.events != events:
                    raise RuntimeError(f"ingest landed {run.events} of {events} events")
                ingest.append(run)
            else:
                run = run_child(settings, HERE, "consume", events, "consume-only")
                consume.append(run)
            print(_line(run), flush=True)
    return ingest, consume


def bench_ingest_guard(
    events: int = GUARD_EVENTS, rounds: int = GUARD_ROUNDS, floor: float = GUARD_FLOOR, until_idle: float = 1.0
) -> dict[str, Any]:
    """This tree's ingest against the consume-only loop in the same run; fails below ``floor``.

    The figure is ``consume-only CPU µs/event ÷ ingest CPU µs/event`` (median over ``rounds``,
    each round one ingest and one consume-only run on the same backlog): what share of ingest's
    CPU per event the Kafka client alone costs. The machine's speed cancels; ingest's own cost
    per event does not.
    """
    with bench_home() as settings:
        produce_encoded(settings, encoded_events(events))
        ingest, consume = against_consume_only(settings, events, rounds, until_idle)
    ratios = [c.cpu_us_per_event / i.cpu_us_per_event for i, c in zip(ingest, consume, strict=True)]
    ratio = statistics.median(ratios)
    result = {
        "events": events,
        "rounds": rounds,
        "ingest_cpu_us_per_event": _median(ingest, "cpu_us_per_event"),
        "consume_cpu_us_per_event": _median(consume, "cpu_us_per_event"),
        "ingest_events_per_s": _median(ingest, "events_per_s"),
        "consume_events_per_s": _median(consume, "events_per_s"),
        "ratios": ratios,
        "ratio": ratio,
        "floor": floor,
        "passed": ratio >= floor,
    }
    print(f"== bench ingest --guard: {events:,} events, {rounds} rounds ==")
    rounds_text = ", ".join(f"{r:.3f}" for r in ratios)
    print(
        f"  ingest {result['ingest_cpu_us_per_event']:.2f} µs CPU/event, consume-only "
        f"{result['consume_cpu_us_per_event']:.2f}: ratio {ratio:.3f} (rounds {rounds_text}), "
        f"floor {floor:.3f}: {'ok' if result['passed'] else 'FAILED'}"
    )
    return result


# -- the profile: CPU per event by stage ------------------------------------------------
#
# Ingest's CPU per event by stage, from the raw stacks ``trajlake bench ingest-ab --profile DIR`` records.
#
# py-spy (``record --subprocesses --format raw``) writes one line per distinct stack: the process
# (the worker, then its spawned decoder process), its Python frames outermost first, and how many
# samples saw it. Idle threads are not sampled, so a thread waiting on the decoder's pipe or on a
# condition costs nothing here. Each sample is put in one stage by the innermost frame that names
# one (:data:`STAGES`, tried in order); samples of start-up (imports, the worker's construction, the
# decoder's warm-up) and of the bench's own reading of the table afterwards are left out, as the
# A/B's CPU figure leaves them out. A stage's share of a process's busy samples times that
# process's measured CPU per event is the stage's CPU per event.
#
# What py-spy cannot see: threads with no Python frame, i.e. librdkafka's own broker threads
# (fetching, parsing, building the message queue). The bench's child reads their CPU from ``/proc``
# (``kafka_threads_cpu_s``), and :func:`stage_table` gives it its own row.

#: (stage, process, frame patterns): a sample belongs to the first stage one of whose patterns
#: matches a frame of its stack, frames tried innermost first. ``process`` is ``worker`` or ``decoder``.
STAGES: list[tuple[str, str, tuple[str, ...]]] = [
    # start-up and the bench's own work: left out
    ("set-up", "any", ("_find_and_load", "_warm_up (", "__init__ (pipelines/ingest/worker.py", "open_catalog (")),
    ("set-up", "any", ("_decoder_started (", "<module> (benchmarks/ingest_child.py:16")),
    # a thread that the scheduler had not put to sleep yet (py-spy counts a runnable thread as busy)
    ("waiting", "any", ("Condition.wait (", "select (selectors.py", "(concurrent/futures/thread.py:81)")),
    ("waiting", "any", ("resource_tracker.py", "Popen.wait (", "serve (pipelines/decode/server.py")),
    # worker process
    ("poll", "worker", ("consume (benchmarks/ingest_child.py", "_run (pipelines/ingest/worker.py")),
    ("framing", "worker", ("add (pipelines/ingest/batch.py", "add_each (pipelines/ingest/batch.py")),
    ("framing", "worker", ("values (pipelines/ingest/batch.py", "binary_array_over (")),
    ("pipe", "any", ("_send (pipelines/decode/process.py", "call (pipelines/decode/process.py", "read_ipc (")),
    ("commit", "worker", ("_process (pipelines/ingest/worker.py", "_commit_dead (", "_wait_inflight (")),
    ("decode", "worker", ("_decode (pipelines/ingest/worker.py",)),
    # decoder process
    ("Parquet encoding", "decoder", ("write_files (pipelines/decode/files.py", "write_data_file (pyiceberg/")),
    ("reply", "decoder", ("_slices (pipelines/decode/server.py", "ipc_bytes (")),
    ("decode", "decoder", ("read_container (pipelines/decode/framing.py",)),
    ("framing", "decoder", ("object_container (", "concatenated_buffer (")),
    ("Arrow building", "decoder", ("_to_columns (", "_finish (", "_decode_group (", "with_coordinates (")),
    ("framing", "decoder", ("decode_here (pipelines/decode/batch.py",)),
]

#: Stages in the order a batch meets them (the table's rows).
ORDER = ["poll", "framing", "pipe", "decode", "Arrow building", "Parquet encoding", "reply", "commit", "other"]

#: A Python frame as py-spy writes it: ``function (file:line)``.
_FRAME = re.compile(r"^\S.* \([^()]*:\d+\)$")


def classify(frames: list[str]) -> tuple[str, str]:
    """(process, stage) of one raw stack (``process …`` entries, then frames outermost first)."""
    # The decoder's command line holds a ";" (``-c from multiprocessing.spawn import spawn_main; …``).
    process = "decoder" if any("--multiprocessing-fork" in f for f in frames) else "worker"
    code = [f for f in frames if _FRAME.match(f) and not f.startswith(("process ", "thread "))]
    for frame in reversed(code):
        for stage, owner, patterns in STAGES:
            if owner in ("any", process) and any(p in frame for p in patterns):
                return process, stage
    return process, "set-up" if not code else "other"


def stage_samples(lines: Iterable[str]) -> Counter[tuple[str, str]]:
    """Samples per (process, stage) of a py-spy raw file's lines."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        counts[classify(stack.split(";"))] += int(count)
    return counts


def stage_table(path: Path, events: int, measured: dict[str, float]) -> list[tuple[str, float, float]]:
    """Rows (stage, worker µs/event, decoder µs/event) of one profile, set-up and waiting left out.

    Sampled stacks give each stage's share of its process's busy samples; the shares are applied to
    the same run's measured CPU (rusage, µs per event): ``measured["worker"]`` less
    ``measured["kafka_threads"]`` (librdkafka's threads, read from ``/proc``: their own row, part of
    polling) for the worker's stages, ``measured["decoder"]`` for the decoder's. Sampling wall time
    on a loaded machine counts a runnable thread as busy, so raw sample counts overstate CPU; their
    shares within a process hold up better.
    """
    with path.open() as lines:
        counts = stage_samples(lines)
    busy = {key: n for key, n in counts.items() if key[1] not in ("set-up", "waiting")}
    total = {p: sum(n for (q, _), n in busy.items() if q == p) or 1 for p in ("worker", "decoder")}
    kafka = measured.get("kafka_threads", 0.0)
    budget = {"worker": measured["worker"] - kafka, "decoder": measured["decoder"]}
    rows = [("poll: librdkafka's threads", kafka, 0.0)]
    for stage in ORDER:
        worker = budget["worker"] * busy.get(("worker", stage), 0) / total["worker"]
        decoder = budget["decoder"] * busy.get(("decoder", stage), 0) / total["decoder"]
        rows.append((stage if stage != "poll" else "poll: Python (consume, Message objects)", worker, decoder))
    return rows


def print_stage_table(rows: list[tuple[str, float, float]], label: str) -> None:
    """The rows as the table docs/performance.md shows."""
    print(f"  {label}: CPU µs per event by stage (py-spy shares of the run's measured CPU; set-up left out)")
    print(f"    {'stage':<42} {'worker':>7} {'decoder':>8} {'both':>7}")
    for stage, worker, decoder in rows:
        print(f"    {stage:<42} {worker:7.2f} {decoder:8.2f} {worker + decoder:7.2f}")
    total_w, total_d = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"    {'total':<42} {total_w:7.2f} {total_d:8.2f} {total_w + total_d:7.2f}")
