"""The recent-id window: event ids written lately, to drop events a producer sent twice."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table

from warehouse.snapshots import current_files
from warehouse.sql import connect, parquet_source


def recent_keys(session_ids: pa.Array | pa.ChunkedArray, event_ids: pa.Array | pa.ChunkedArray) -> list[str]:
    """The window's keys: an event id within its session (joined in Arrow: one Python string per row, no loop).

    A re-send is the same event of the same session. Another session's copy of an event id (ids a second
    host can know in advance: an import's derive from a public file, a late verdict's from the session and
    the report) is no re-send: keyed by the id alone, it would make ingest drop the owner's event.
    """
    if event_ids.type != session_ids.type:
        event_ids = event_ids.cast(session_ids.type)
    joined = pc.binary_join_element_wise(
        pc.fill_null(session_ids, ""), pc.fill_null(event_ids, ""), pa.scalar("\x1f", session_ids.type)
    )
    return joined.to_pylist()


class RecentIds:
    """The most recent ``capacity`` event ids written to raw_events (:func:`recent_keys`), oldest evicted first.

    Kafka-level exactly-once cannot see an event that a producer sends twice (a spool
    replay of an event whose acknowledgement was lost, a re-import of a recorded run):
    each copy is a new record. Events of one session share a partition and a re-send
    follows its original closely, so a bounded window of recent ids, warmed from the
    newest raw events at start, catches them without an index over the whole table.
    Assembly deduplicates by ``event_id`` regardless, so the window bounds cost, not
    correctness of trajectories.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: set[str] = set()
        # The same ids in arrival order, one list per batch, oldest first; a batch is a few
        # thousand ids, so lookups and evictions are set operations in C, not a loop per id.
        self._order: deque[list[str]] = deque()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def warm(self, table: Table) -> None:
        """Load the newest ``capacity`` event ids of ``table`` (by ``ingested_at``)."""
        files = current_files(table).paths
        if not self.capacity or not files:
            return
        rows = (
            connect()
            .sql(
                f"SELECT coalesce(session_id, '') || chr(31) || coalesce(event_id, '') FROM {parquet_source(files)} "
                "ORDER BY ingested_at DESC, kafka_offset DESC "
                f"LIMIT {int(self.capacity)}"
            )
            .fetchall()
        )
        self._remember_ids([event_id for (event_id,) in reversed(rows)])

    def unseen(self, event_ids: Sequence[str]) -> list[bool]:
        """Per id: True when it is neither in the window nor earlier in ``event_ids``."""
        if not self.capacity:
            return [True] * len(event_ids)
        ids = self._ids
        if ids.isdisjoint(event_ids) and len(set(event_ids)) == len(event_ids):
            return [True] * len(event_ids)  # the usual batch: nothing re-sent
        seen: set[str] = set()
        keep = []
        for event_id in event_ids:
            keep.append(event_id not in ids and event_id not in seen)
            seen.add(event_id)
        return keep

    def remember(self, event_ids: Sequence[str], unseen: bool = False) -> None:
        """Add the ids of committed events; ``unseen``: they are what :meth:`unseen` let through since the
        window last changed (distinct, none in the window), so they are not checked again."""
        if self.capacity:
            self._remember_ids(list(event_ids), unseen)

    def _remember_ids(self, event_ids: list[str], unseen: bool = False) -> None:
        ids = self._ids
        if not unseen and (not ids.isdisjoint(event_ids) or len(set(event_ids)) != len(event_ids)):
            event_ids = [event_id for event_id in dict.fromkeys(event_ids) if event_id not in ids]
        if not event_ids:
            return
        ids.update(event_ids)
        self._order.append(event_ids)
        excess = len(ids) - self.capacity
        while excess > 0:
            oldest = self._order[0]
            if len(oldest) <= excess:
                self._order.popleft()
                ids.difference_update(oldest)
                excess -= len(oldest)
            else:
                ids.difference_update(oldest[:excess])
                self._order[0] = oldest[excess:]
                excess = 0
