"""Ingest: Kafka → Iceberg ``raw_events`` and ``dead_letters``, exactly once (see :mod:`pipelines.ingest.worker`)."""

from __future__ import annotations

from pipelines.ingest.worker import (
    INCARNATION_PREFIX,
    OFFSETS_PREFIX,
    RESET_PREFIX,
    Incarnation,
    IngestStats,
    IngestWorker,
    RecentIds,
    _Written,
    consumer_config,
    disable_library_retries,
    event_row,
    incarnation_key,
    offsets_key,
    recorded_incarnation,
    recorded_offsets,
    recorded_reset,
    reset_key,
    run_ingest,
)

__all__ = [
    "INCARNATION_PREFIX",
    "OFFSETS_PREFIX",
    "RESET_PREFIX",
    "Incarnation",
    "IngestStats",
    "IngestWorker",
    "RecentIds",
    "_Written",
    "consumer_config",
    "disable_library_retries",
    "event_row",
    "incarnation_key",
    "offsets_key",
    "recorded_incarnation",
    "recorded_offsets",
    "recorded_reset",
    "reset_key",
    "run_ingest",
]
