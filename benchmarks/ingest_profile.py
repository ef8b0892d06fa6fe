"""Ingest's CPU per event by stage, from the raw stacks ``trajlake bench ingest-ab --profile DIR`` records.

py-spy (``record --subprocesses --format raw``) writes one line per distinct stack: the process
(the worker, then its spawned decoder process), its Python frames outermost first, and how many
samples saw it. Idle threads are not sampled, so a thread waiting on the decoder's pipe or on a
condition costs nothing here. Each sample is put in one stage by the innermost frame that names
one (:data:`STAGES`, tried in order); samples of start-up (imports, the worker's construction, the
decoder's warm-up) and of the bench's own reading of the table afterwards are left out, as the
A/B's CPU figure leaves them out. A stage's share of a process's busy samples times that
process's measured CPU per event is the stage's CPU per event.

What py-spy cannot see: threads with no Python frame, i.e. librdkafka's own broker threads
(fetching, parsing, building the message queue). The bench's child reads their CPU from ``/proc``
(``kafka_threads_cpu_s``), and :func:`stage_table` gives it its own row.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

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
