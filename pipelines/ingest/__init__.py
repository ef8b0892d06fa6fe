"""Ingest: Kafka → Iceberg ``raw_events`` and ``dead_letters``, exactly once.

A consumer-group worker collects a batch (bounded by rows, bytes and time),
decodes it, and appends good events to ``raw_events`` and undecodable records
(raw bytes, coordinates, reason) to ``dead_letters``. The snapshot that adds a
batch records, in its summary properties and in the table properties of the
same commit, the next offset per partition of the topic, max-merged so it never
moves backwards. Every table tracks its own offsets.

Exactly once follows from three rules:

* on assignment a partition is positioned at the offset recorded in Iceberg
  (the lower of the two tables), never at Kafka's committed offset;
* before committing, the worker re-reads the recorded offsets and drops rows
  below them (a zombie or a replay after a crash), inside the commit retry loop,
  so a concurrent commit that wins the race is seen;
* the Iceberg commit is atomic: rows and offsets land together or not at all
  (and never replayed by pyiceberg's own retry, which would skip the re-read).

Kafka offsets are still committed afterwards, for lag monitoring only.

Topic resets. Offsets only mean something within one incarnation of a topic: a
deleted and recreated topic, or a restarted memory-only broker, numbers its
records from 0 again. Every commit therefore also records the topic's Kafka
topic id and an epoch (``trajlake.topic.<topic>``). When the broker reports
another topic id, the worker starts that table's partitions from the beginning
of the new incarnation under epoch + 1, records ``trajlake.reset.<topic>``
(previous topic id and offsets, kept for audit) and counts the reset. Records
of the new incarnation below the previous offsets of their partition plus
``TRAJLAKE_RESET_DEDUPE_RECORDS`` (a bounded window) are checked against the
``event_id``s already ingested for their sessions, so a producer re-sending
history after the reset adds no duplicates.
An offset below the partition's low watermark (records deleted by retention
before ingest read them) is logged and counted as a gap, never skipped silently.

One module per concern: :mod:`~pipelines.ingest.offsets` (the offsets and incarnation a
table records, and pure functions on offsets), :mod:`~pipelines.ingest.commit` (one table's
exactly-once commit), :mod:`~pipelines.ingest.recent_ids` (the re-send window),
:mod:`~pipelines.ingest.stats`, :mod:`~pipelines.ingest.batch` (the batch buffer),
:mod:`~pipelines.ingest.rows`, :mod:`~pipelines.ingest.consumer` (Kafka settings) and
:mod:`~pipelines.ingest.worker` (the consume → decode → commit loop).
"""

from __future__ import annotations

from pipelines.ingest.batch import Batch
from pipelines.ingest.commit import Written, commit_rows, disable_library_retries
from pipelines.ingest.consumer import consumer_config
from pipelines.ingest.offsets import (
    INCARNATION_PREFIX,
    OFFSETS_PREFIX,
    RESET_PREFIX,
    Incarnation,
    advanced_offsets,
    batch_next_offsets,
    dumps_offsets,
    incarnation_key,
    loads_offsets,
    merge_offsets,
    offsets_key,
    recorded_incarnation,
    recorded_offsets,
    recorded_reset,
    reset_key,
    start_offsets,
    unrecorded_rows,
)
from pipelines.ingest.recent_ids import RecentIds
from pipelines.ingest.rows import dead_letter_row, event_row
from pipelines.ingest.stats import IngestStats, IngestTimings
from pipelines.ingest.worker import IngestWorker, run_ingest

__all__ = [
    "INCARNATION_PREFIX",
    "OFFSETS_PREFIX",
    "RESET_PREFIX",
    "Batch",
    "Incarnation",
    "IngestStats",
    "IngestTimings",
    "IngestWorker",
    "RecentIds",
    "Written",
    "advanced_offsets",
    "batch_next_offsets",
    "commit_rows",
    "consumer_config",
    "dead_letter_row",
    "disable_library_retries",
    "dumps_offsets",
    "event_row",
    "incarnation_key",
    "loads_offsets",
    "merge_offsets",
    "offsets_key",
    "recorded_incarnation",
    "recorded_offsets",
    "recorded_reset",
    "reset_key",
    "run_ingest",
    "start_offsets",
    "unrecorded_rows",
]
