"""Offset bookkeeping: what each Iceberg table records about the Kafka records it holds.

The snapshot that adds a batch records, in its summary properties and in the table
properties of the same commit, the next offset per partition of the topic, max-merged so
it never moves backwards, and the topic incarnation (Kafka topic id and epoch) those
offsets belong to. Every table tracks its own offsets.

The arithmetic on offsets (merging, which rows of a batch are already recorded, a batch's
next offsets, where a restart begins) is pure functions of plain mappings and arrays, so it
is testable without Kafka or a catalog; reading the recorded values from a table is the rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyiceberg.table import Table

OFFSETS_PREFIX = "trajlake.offsets."
INCARNATION_PREFIX = "trajlake.topic."
RESET_PREFIX = "trajlake.reset."


def merge_offsets(*sources: Mapping[int, int]) -> dict[int, int]:
    """Max-merge next offsets per partition: no partition of the result lies below any source.

    Args:
        sources: next offset per partition, each from one place (a property, a summary, a batch).

    Returns:
        Every partition of any source, at its highest next offset (at least 0).
    """
    merged: dict[int, int] = {}
    for source in sources:
        for partition, offset in source.items():
            merged[partition] = max(merged.get(partition, 0), offset)
    return merged


def advanced_offsets(next_offsets: Mapping[int, int], recorded: Mapping[int, int]) -> dict[int, int]:
    """The partitions whose ``next_offsets`` lie beyond what is ``recorded`` (absent counts as 0).

    Empty means the batch holds nothing new: it was committed already (by this worker before a
    crash, or by a peer).
    """
    return {p: o for p, o in next_offsets.items() if o > recorded.get(p, 0)}


def per_row(by_partition: Mapping[int, int], partitions: np.ndarray) -> np.ndarray:
    """``by_partition[p]`` (0 when absent) for the partition ``p`` of every row, as int64."""
    if not len(partitions):
        return np.zeros(0, dtype=np.int64)
    lookup = np.zeros(max(int(partitions.max()), *by_partition, 0) + 1, dtype=np.int64)
    for partition, value in by_partition.items():
        lookup[partition] = value
    return lookup[partitions]


def unrecorded_rows(partitions: np.ndarray, offsets: np.ndarray, recorded: Mapping[int, int]) -> np.ndarray:
    """Mask of the rows at or beyond their partition's recorded next offset: the rows not yet ingested.

    Rows below it were committed already (a replay after a crash, a zombie's stale batch)
    and are dropped.

    Args:
        partitions: Kafka partition of every row.
        offsets: Kafka offset of every row.
        recorded: the table's next offset per partition.
    """
    return np.asarray(offsets >= per_row(recorded, partitions), dtype=bool)


def batch_next_offsets(partitions: np.ndarray, offsets: np.ndarray) -> dict[int, int]:
    """Next offset per partition after a batch: one past the highest offset of each of its partitions."""
    return {int(p): int(offsets[partitions == p].max()) + 1 for p in np.unique(partitions)}


def start_offsets(*tables: Mapping[int, int]) -> dict[int, int]:
    """Where a worker starts reading each partition: the lowest next offset any table records.

    A partition absent from one table starts at 0 (that table holds none of it yet);
    the rows a table already holds are dropped again when it commits (:func:`unrecorded_rows`).
    """
    partitions: set[int] = set().union(*tables)
    return {p: min(offsets.get(p, 0) for offsets in tables) for p in partitions}


def dumps_offsets(offsets: Mapping[int, int]) -> str:
    """The JSON property value of next offsets (``{"partition": offset}``, partitions in order)."""
    return json.dumps({str(p): o for p, o in sorted(offsets.items())})


def loads_offsets(text: str) -> dict[int, int]:
    """Next offsets from their JSON property value (see :func:`dumps_offsets`)."""
    return {int(p): int(o) for p, o in json.loads(text).items()}


def offsets_key(topic: str) -> str:
    """Property key under which a table records its next offsets for ``topic``."""
    return OFFSETS_PREFIX + topic


def incarnation_key(topic: str) -> str:
    """Property key of the topic incarnation (``{"epoch", "topic_id"}``) the offsets belong to."""
    return INCARNATION_PREFIX + topic


def reset_key(topic: str) -> str:
    """Property key describing the latest detected reset of ``topic``."""
    return RESET_PREFIX + topic


@dataclass(frozen=True)
class Incarnation:
    """Which life of a topic recorded offsets refer to; epoch 0 and no id for tables older than this field."""

    epoch: int = 0
    topic_id: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Incarnation:
        """Read the JSON property value; missing means epoch 0 of an unknown topic id."""
        if not text:
            return cls()
        value = json.loads(text)
        return cls(int(value.get("epoch", 0)), value.get("topic_id"))

    def dumps(self) -> str:
        """JSON property value."""
        return json.dumps({"epoch": self.epoch, "topic_id": self.topic_id})


def _newest_summary_with(table: Table, key: str) -> dict[str, str] | None:
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        if key in summary:
            return summary
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return None


def recorded_incarnation(table: Table, topic: str) -> Incarnation:
    """The topic incarnation of the offsets ``table`` records for ``topic`` (highest epoch wins)."""
    summary = _newest_summary_with(table, offsets_key(topic)) or {}
    candidates = [
        Incarnation.parse(table.properties.get(incarnation_key(topic))),
        Incarnation.parse(summary.get(incarnation_key(topic))),
    ]
    return max(candidates, key=lambda inc: (inc.epoch, inc.topic_id is not None))


def recorded_offsets(table: Table, topic: str) -> dict[int, int]:
    """Next offset per partition that ``table`` has ingested from the current incarnation of ``topic``.

    Max-merges the table property with the newest snapshot summary carrying the
    key, so neither snapshot expiry nor a foreign commit (compaction) loses it;
    a source recorded under an older epoch (before a topic reset) is ignored.
    """
    key, inc_key = offsets_key(topic), incarnation_key(topic)
    epoch = recorded_incarnation(table, topic).epoch

    def current(source: Mapping[str, str]) -> dict[int, int]:
        text = source.get(key)
        if text and Incarnation.parse(source.get(inc_key)).epoch == epoch:
            return loads_offsets(text)
        return {}

    return merge_offsets(current(table.properties), current(_newest_summary_with(table, key) or {}))


def recorded_reset(table: Table, topic: str) -> dict[str, Any] | None:
    """The latest reset of ``topic`` that ``table`` recorded, or None."""
    text = table.properties.get(reset_key(topic))
    return json.loads(text) if text else None
