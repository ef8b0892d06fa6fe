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
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import signal
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import In
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from common.broker import resolve_bootstrap
from common.errors import KafkaUnavailable
from common.settings import Settings
from pipelines.decode import BatchDecoder, FileTarget, binary_array_over, with_coordinates
from pipelines.memory import bound_allocator, release_free_memory
from schemas.registry import HEADER_LEN
from warehouse.catalog import open_catalog
from warehouse.errors import CommitConflict
from warehouse.snapshots import current_files
from warehouse.sql import connect, parquet_source
from warehouse.tables import DEAD_LETTERS, RAW_EVENTS, ensure_table
from warehouse.transactions import transaction

log = logging.getLogger("trajlake.ingest")

OFFSETS_PREFIX = "trajlake.offsets."
INCARNATION_PREFIX = "trajlake.topic."
RESET_PREFIX = "trajlake.reset."
_ENVELOPE = (
    "event_id", "session_id", "seq", "ts", "event_type", "source", "sandbox_id", "task_id", "task_type",
    "host_id", "image_name", "image_version", "agent_name", "agent_version", "agent_model", "policy_version",
    "agent_message_id", "parent_event_id", "extra", "schema_version",
)  # fmt: skip


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
    merged: dict[int, int] = {}

    def merge(source: dict[str, str]) -> None:
        text = source.get(key)
        if text and Incarnation.parse(source.get(inc_key)).epoch == epoch:
            for partition, offset in json.loads(text).items():
                merged[int(partition)] = max(merged.get(int(partition), 0), int(offset))

    merge(dict(table.properties))
    merge(_newest_summary_with(table, key) or {})
    return merged


def recorded_reset(table: Table, topic: str) -> dict[str, Any] | None:
    """The latest reset of ``topic`` that ``table`` recorded, or None."""
    text = table.properties.get(reset_key(topic))
    return json.loads(text) if text else None


# pyiceberg >= 0.12 retries a conflicting append itself by re-applying it to the new
# table state; for ingest that replay would bypass the offset filter (a zombie's
# stale rows would land after all), so ingest's tables turn it off and the
# worker's own loop re-reads the offsets on every attempt.
_NO_LIBRARY_RETRY = {"commit.retry.num-retries": "0"}


def disable_library_retries(table: Table) -> Table:
    """Make ``table`` surface commit conflicts to the caller instead of re-applying the append.

    Raises:
        CommitConflict: the property could not be set (the table keeps changing under us).
    """
    for _ in range(10):
        if all(table.properties.get(k) == v for k, v in _NO_LIBRARY_RETRY.items()):
            return table
        try:
            with transaction(table) as tx:
                tx.set_properties(_NO_LIBRARY_RETRY)
        except CommitFailedException:
            time.sleep(0.05 * (1 + random.random()))
        table = table.refresh()
    raise CommitConflict(f"could not set {_NO_LIBRARY_RETRY} on {table.name()}")


def event_row(event: dict[str, Any], topic: str, partition: int, offset: int, ingested_at: datetime) -> dict:
    """The raw-events row of a decoded event: envelope, its payload struct, Kafka coordinates."""
    row = {name: event[name] for name in _ENVELOPE}
    row[event["event_type"]] = event["payload"]
    row.update(kafka_topic=topic, kafka_partition=partition, kafka_offset=offset, ingested_at=ingested_at)
    return row


def _fault(point: str) -> None:
    """Die abruptly at a named point when ``TRAJLAKE_FAULT`` says so (fault-injection tests)."""
    if os.environ.get("TRAJLAKE_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


class RecentIds:
    """The most recent ``capacity`` event ids written to raw_events, oldest evicted first.

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
                f"SELECT event_id FROM {parquet_source(files)} ORDER BY ingested_at DESC, kafka_offset DESC "
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

    def remember(self, event_ids: Sequence[str]) -> None:
        """Add the ids of committed events."""
        if self.capacity:
            self._remember_ids(list(event_ids))

    def _remember_ids(self, event_ids: list[str]) -> None:
        ids = self._ids
        if not ids.isdisjoint(event_ids) or len(set(event_ids)) != len(event_ids):
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


@dataclass
class IngestStats:
    """What one ingest run did."""

    events: int = 0
    dead_letters: int = 0
    skipped: int = 0  # records below the recorded offsets (replays, zombies)
    batches: int = 0
    commit_retries: int = 0
    resets: int = 0  # table commits that started a new topic incarnation
    reset_duplicates: int = 0  # re-sent events dropped after a reset (already ingested before it)
    resent_duplicates: int = 0  # records whose event_id was already ingested (recent-id window)
    gaps: int = 0  # partitions whose recorded offset fell below the low watermark (records lost to retention)
    truncations: int = 0  # recorded offset past the high watermark on a broker without topic ids
    reset_details: list[dict[str, Any]] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)

    def describe_resets(self) -> list[str]:
        """One human line per detected reset or gap."""
        lines = []
        for detail in self.reset_details:
            if detail.get("kind") == "truncated":
                lines.append(
                    f"suspected truncation: {detail['topic']} partition {detail['partition']} recorded offset "
                    f"{detail['recorded']} > high watermark {detail['high']}, and the broker gives no topic id "
                    "to confirm a reset; records below the recorded offset will be skipped"
                )
            elif detail.get("kind") == "gap":
                lines.append(
                    f"gap: {detail['topic']} partition {detail['partition']} recorded offset {detail['recorded']} "
                    f"< low watermark {detail['low']} ({detail['low'] - detail['recorded']} records never ingested)"
                )
            else:
                lines.append(
                    f"topic reset: {detail['table']} {detail['topic']} epoch {detail['epoch']} "
                    f"(topic id {detail['previous_topic_id']} -> {detail['topic_id']}; previous offsets "
                    f"{detail['previous_offsets']}); restarted from the beginning of the new topic"
                )
        return lines


@dataclass
class _Batch:
    """Records consumed for one commit, held as columns, not as ``Message`` objects.

    Values are appended to one buffer as they arrive (the decoder takes it as an Arrow
    binary array without another copy), and each message is released at once: a batch
    costs its bytes plus ~30 bytes of coordinates per record.
    """

    data: bytearray = field(default_factory=bytearray)
    ends: array = field(default_factory=lambda: array("q"))  # end of each value in ``data``
    partitions: array = field(default_factory=lambda: array("i"))
    offsets: array = field(default_factory=lambda: array("q"))
    timestamps: array = field(default_factory=lambda: array("q"))  # Kafka timestamp (ms, 0 if none)
    keys: list[bytes | None] = field(default_factory=list)
    bytes: int = 0
    started: float = 0.0

    def __len__(self) -> int:
        return len(self.ends)

    def values(self) -> pa.BinaryArray:
        """The record values as an Arrow binary array over the batch's buffer (no copy)."""
        return binary_array_over(self.data, np.frombuffer(self.ends, dtype=np.int64))

    def value(self, index: int) -> bytes:
        start = self.ends[index - 1] if index else 0
        return bytes(self.data[start : self.ends[index]])


def consumer_config(settings: Settings, bootstrap: str, follow: bool = False) -> dict[str, Any]:
    """librdkafka consumer settings: manual offsets, fast group join.

    ``follow``: for a consumer that tails the topic for good, next to the producers; it
    refetches politely once its prefetch is full (see below). ``TRAJLAKE_KAFKA_EXTRA`` wins.
    """
    return {
        "bootstrap.servers": bootstrap,
        "group.id": settings.consumer_group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Short timeouts make the group join take ~3 s instead of ~23 s on the embedded broker.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "max.poll.interval.ms": 300_000,
        "fetch.max.bytes": 16 << 20,
        # Fewer, fuller fetches: ~1.6x the consume rate on a backlog, at most 100 ms added latency.
        "fetch.min.bytes": 1 << 20,
        "fetch.wait.max.ms": 100,
        "max.partition.fetch.bytes": 8 << 20,
        # Prefetch bounded well below a batch: a deep backlog must not grow resident memory.
        "queued.max.messages.kbytes": 16 << 10,
        # Once the prefetch above is full, librdkafka waits fetch.queue.backoff.ms before fetching
        # again. Its default (1 s) idles a consumer that drains 16 MB in well under a second:
        # draining a 200k backlog, 37k events/s against 56k with 100 ms. A follower, which tails
        # the topic next to the producers, keeps the default: in the hour replay 10 ms made it
        # poll so eagerly that the replay took 695 s instead of 532 s (one session), and 100 ms gained
        # nothing there (715 s against 702 s with 1 s, same evening).
        **({} if follow else {"fetch.queue.backoff.ms": 100}),
        **settings.kafka_extra,
    }


_DEAD_SYNC_SECONDS = 30.0
_RAW_SORT = [("session_id", "ascending"), ("seq", "ascending")]


def _per_row(by_partition: dict[int, int], partitions: np.ndarray) -> np.ndarray:
    """``by_partition[p]`` (0 when absent) for the partition of every row."""
    if not len(partitions):
        return np.zeros(0, dtype=np.int64)
    lookup = np.zeros(max(int(partitions.max()), *by_partition, 0) + 1, dtype=np.int64)
    for partition, value in by_partition.items():
        lookup[partition] = value
    return lookup[partitions]


@dataclass
class _Written:
    """Raw events the decoder process already wrote as data files, not yet committed."""

    files: list[DataFile]
    keys: pa.Table  # KEY_COLUMNS of every row in the files


def _writer_metadata(metadata: TableMetadata) -> TableMetadata:
    """``metadata`` without its history: what writing data files needs, cheap to send to the decoder."""
    return metadata.model_copy(update={"snapshots": [], "snapshot_log": [], "metadata_log": [], "refs": {},
                                       "current_snapshot_id": None})  # fmt: skip


def _coordinates(rows: pa.Table) -> pa.Array:
    """One int64 per row identifying its Kafka record within a batch: partition and offset."""
    partitions = rows.column("kafka_partition").to_numpy().astype(np.int64)
    return pa.array((partitions << 48) | rows.column("kafka_offset").to_numpy())


def _delete_files(table: Table, files: Sequence[DataFile]) -> None:
    for data_file in files:
        try:
            table.io.delete(data_file.file_path)
        except OSError as exc:  # an orphan at worst: maintenance removes it
            log.warning("could not delete unused data file %s: %s", data_file.file_path, exc)


class IngestWorker:
    """One ingest process: a member of the consumer group writing to Iceberg.

    Args:
        settings: trajlake settings.
        catalog: Iceberg catalog; opened from settings by default.
        bootstrap: Kafka bootstrap; resolved from settings by default.
        follow: the worker will tail the topic for good (``run()`` without ``until_idle``),
            so its consumer fetches politely (:func:`consumer_config`).
    """

    def __init__(
        self, settings: Settings, catalog: Catalog | None = None, bootstrap: str | None = None, follow: bool = False
    ) -> None:
        self.settings = settings
        self.topic = settings.topic
        self.catalog = catalog or open_catalog(settings)
        self.raw_table = disable_library_retries(ensure_table(self.catalog, settings, RAW_EVENTS.name))
        self.dead_table = disable_library_retries(ensure_table(self.catalog, settings, DEAD_LETTERS.name))
        self.raw_schema = RAW_EVENTS.arrow_schema()
        self.decoder = BatchDecoder(self.raw_schema, settings.max_event_bytes)
        self.dead_schema = DEAD_LETTERS.arrow_schema()
        self.bootstrap = bootstrap or resolve_bootstrap(settings)
        bound_allocator()
        self.consumer = Consumer(consumer_config(settings, self.bootstrap, follow=follow), logger=log)
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, **settings.kafka_extra})
        self.topic_id: str | None = None  # Kafka topic id of the incarnation being read; None if unknown
        self.stats = IngestStats()
        self.assigned: set[int] = set()
        self.positions: dict[int, int] = {}  # next offset to read, per assigned partition
        self._batch = _Batch()
        self._stop = False
        self._closing = False
        self.recent_ids = RecentIds(settings.ingest_dedupe_window)
        self.recent_ids.warm(self.raw_table)
        self._decoding = ThreadPoolExecutor(1, thread_name_prefix="trajlake-decode")
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="trajlake-commit")
        self._inflight: Future[dict[int, int]] | None = None
        self._dead_pending: dict[int, int] = {}  # offsets committed to raw_events but not yet to dead_letters
        self._dead_synced = time.monotonic()

    # -- offsets -----------------------------------------------------------------

    def fetch_topic_id(self) -> str | None:
        """The broker's topic id of the current incarnation of the topic; None when it has none."""
        try:
            description = self.admin.describe_topics(TopicCollection([self.topic]))[self.topic].result(timeout=10)
        except KafkaException as exc:
            log.warning("cannot describe topic %s (reset detection by topic id is off): %s", self.topic, exc)
            return None
        topic_id = str(description.topic_id) if description.topic_id is not None else ""
        # An all-zero id (AAAAAAAAAAAAAAAAAAAAAA) is what brokers without topic ids return.
        return topic_id if topic_id.strip("A=") else None

    def _current_offsets(self, table: Table) -> dict[int, int]:
        """The table's offsets if they belong to the incarnation being read; {} (from the start) if not."""
        incarnation = recorded_incarnation(table, self.topic)
        if self.topic_id and incarnation.topic_id and incarnation.topic_id != self.topic_id:
            return {}
        return recorded_offsets(table, self.topic)

    def _start_offsets(self) -> dict[int, int]:
        raw = self._current_offsets(self.raw_table)
        dead = self._current_offsets(self.dead_table)
        return {p: min(raw.get(p, 0), dead.get(p, 0)) for p in set(raw) | set(dead)}

    def _check_gaps(self, consumer: Consumer, start: dict[int, int], partitions: list[TopicPartition]) -> None:
        """Report recorded offsets outside the partition's log: below the low watermark (records lost
        before ingest), or, on a broker without topic ids, past the high watermark (log truncated)."""
        for tp in partitions:
            recorded = start.get(tp.partition)
            if not recorded:
                continue
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, tp.partition), timeout=5)
            except KafkaException as exc:
                log.warning("watermarks of %s/%d unavailable: %s", self.topic, tp.partition, exc)
                continue
            if self.topic_id is None and recorded > high:
                # Without a topic id a reset cannot be told apart from tansu's lagging high
                # watermark with certainty, so it is reported, not acted on.
                detail = {"kind": "truncated", "topic": self.topic, "partition": tp.partition, "recorded": recorded}
                detail["high"] = high
                log.warning("%s", IngestStats(reset_details=[detail]).describe_resets()[0])
                self.stats.truncations += 1
                self.stats.reset_details.append(detail)
            if recorded < low:
                detail = {
                    "kind": "gap",
                    "topic": self.topic,
                    "partition": tp.partition,
                    "recorded": recorded,
                    "low": low,
                }
                log.warning("%s", IngestStats(reset_details=[detail]).describe_resets()[0])
                self.stats.gaps += 1
                self.stats.reset_details.append(detail)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._refresh_tables()
        # Re-read on every assignment: the topic may have been recreated since the last one.
        self.topic_id = self.fetch_topic_id()
        start = self._start_offsets()
        self._check_gaps(consumer, start, partitions)
        for tp in partitions:
            tp.offset = start.get(tp.partition, OFFSET_BEGINNING)
            self.assigned.add(tp.partition)
            self.positions[tp.partition] = max(tp.offset, 0)
        log.info("assigned %s (topic id %s)", {tp.partition: tp.offset for tp in partitions}, self.topic_id)
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Finish what we hold before the partitions move; the offset check makes this safe either way.
        # Not once the worker is closing (the consumer's close revokes too): after a failure that
        # would retry the failed commit and hide its error; the next owner re-reads from Iceberg.
        if not self._closing:
            self.flush()
        self.assigned -= {tp.partition for tp in partitions}

    # -- batching ----------------------------------------------------------------

    def _batch_full(self) -> bool:
        batch = self._batch
        return bool(batch.ends) and (
            len(batch.ends) >= self.settings.ingest_max_rows
            or batch.bytes >= self.settings.ingest_max_bytes
            or time.monotonic() - batch.started >= self.settings.ingest_max_seconds
        )

    def _add(self, message: Message) -> None:
        self._add_many([message])

    def _add_many(self, messages: list[Message]) -> None:
        """Add the records among ``messages`` to the batch (errors are logged, partition EOFs ignored)."""
        batch = self._batch
        if not batch.ends:
            batch.started = time.monotonic()
        positions, data = self.positions, batch.data
        ends, partitions, offsets, timestamps, keys = (
            batch.ends, batch.partitions, batch.offsets, batch.timestamps, batch.keys
        )  # fmt: skip
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", error)
                continue
            value = message.value()
            if value:
                data += value
            ends.append(len(data))
            partition, offset = message.partition(), message.offset()
            partitions.append(partition)
            offsets.append(offset)
            timestamps.append(message.timestamp()[1])
            keys.append(message.key())
            positions[partition] = offset + 1
        batch.bytes = len(data)

    def _refresh_tables(self) -> None:
        self.raw_table = self.raw_table.refresh()
        self.dead_table = self.dead_table.refresh()

    def decode_batch(self, batch: _Batch, write: bool = False) -> tuple[pa.Table | _Written, pa.Table]:
        """Decode a batch into raw-events rows and dead-letter rows (Arrow, table-shaped).

        Decodes the whole batch at once (pipelines.decode), events sorted by (session, seq);
        both tables carry the Kafka coordinates of every row in ``kafka_partition`` /
        ``kafka_offset``. With ``write``, the decoder process writes the events as
        ``raw_events`` data files, and only the files and the rows' keys come back
        (``_Written``), unless the batch had to be decoded here.
        """
        now = datetime.now(UTC)
        partitions = np.frombuffer(batch.partitions, dtype=np.int32)
        offsets = np.frombuffer(batch.offsets, dtype=np.int64)
        target = None
        if write:
            table = self.raw_table
            target = FileTarget(_writer_metadata(table.metadata), dict(table.io.properties), self.topic,
                                partitions, offsets, now)  # fmt: skip
        decoded = self.decoder.decode_array(batch.values(), sort_by=_RAW_SORT, write=target)
        if decoded.files is not None:
            events: pa.Table | _Written = _Written(decoded.files, decoded.events)
        else:
            events = with_coordinates(
                decoded.events, self.raw_schema, self.topic, pa.array(partitions), pa.array(offsets), now
            )
        dead_rows = [self._dead_row(batch, index, exc.reason, str(exc), now) for index, exc in decoded.dead]
        return events, pa.Table.from_pylist(dead_rows, schema=self.dead_schema)

    def _dead_row(self, batch: _Batch, index: int, reason: str, error: str, now: datetime) -> dict:
        ts_ms = batch.timestamps[index]
        value = batch.value(index)
        return {
            "kafka_topic": self.topic,
            "kafka_partition": batch.partitions[index],
            "kafka_offset": batch.offsets[index],
            "kafka_timestamp": datetime.fromtimestamp(ts_ms / 1000, UTC) if ts_ms and ts_ms > 0 else None,
            "raw_key": batch.keys[index],
            "raw_value": value,
            "value_bytes": len(value),
            "reason": reason,
            "error": error[:2000],
            "schema_fingerprint": value[2:HEADER_LEN].hex() if value[:2] == b"\xc3\x01" else None,
            "ingested_at": now,
        }

    # -- committing ----------------------------------------------------------------

    def _commit_table(
        self,
        load: Callable[[], Table],
        rows: pa.Table | _Written,
        next_offsets: dict[int, int],
        sort_keys: list[tuple[str, str]],
        recent: RecentIds | None = None,
    ) -> tuple[Table, int, int]:
        """Append the rows not yet recorded, with offsets, retrying commit conflicts.

        ``rows`` is shaped like the table and carries ``kafka_partition`` and
        ``kafka_offset``, or is already written as data files (``_Written``: the files
        and the key columns of their rows). Everything that decides what is new (offsets,
        incarnation, reset window) is re-read from the table inside the retry loop, so a
        peer's commit that wins the race is honoured. Written files are committed as they
        are when every row is new (the usual case); otherwise the new rows are read back
        and written again, and the files are deleted once that commit holds. Returns the
        table after the commit, rows written and rows dropped (already recorded or re-sent).
        """
        delay = 0.05
        key, inc_key = offsets_key(self.topic), incarnation_key(self.topic)
        if isinstance(rows, pa.Table) and sort_keys and rows.num_rows:
            rows = rows.sort_by(sort_keys)  # once: filtering below keeps the order
        keys = rows.keys if isinstance(rows, _Written) else rows
        partitions = keys.column("kafka_partition").to_numpy()
        offsets = keys.column("kafka_offset").to_numpy()
        for attempt in range(12):
            table = load()
            incarnation = recorded_incarnation(table, self.topic)
            reset: dict[str, Any] | None = None
            if self.topic_id and incarnation.topic_id and incarnation.topic_id != self.topic_id:
                # The table's offsets belong to another life of the topic: they mean nothing here.
                reset = {
                    "kind": "reset",
                    "table": ".".join(table.name()),
                    "topic": self.topic,
                    "epoch": incarnation.epoch + 1,
                    "previous_topic_id": incarnation.topic_id,
                    "topic_id": self.topic_id,
                    "previous_offsets": {str(p): o for p, o in sorted(recorded_offsets(table, self.topic).items())},
                    "detected_at": datetime.now(UTC).isoformat(),
                }
                recorded: dict[int, int] = {}
                incarnation = Incarnation(reset["epoch"], self.topic_id)
                window = reset
            else:
                recorded = recorded_offsets(table, self.topic)
                incarnation = Incarnation(incarnation.epoch, self.topic_id or incarnation.topic_id)
                window = recorded_reset(table, self.topic)
                if window is not None and window.get("epoch") != incarnation.epoch:
                    window = None
            advanced = {p: o for p, o in next_offsets.items() if o > recorded.get(p, 0)}
            if not advanced:  # everything here was committed already (by us before a crash, or a peer)
                if isinstance(rows, _Written):
                    _delete_files(table, rows.files)
                return table, 0, keys.num_rows
            keep = offsets >= _per_row(recorded, partitions)
            n_fresh = int(keep.sum())
            if window and n_fresh:
                keep[np.flatnonzero(keep)] &= ~self._resent_before_reset(table, keys.filter(pa.array(keep)), window)
            resent = 0
            kept_ids: list[str] = []
            if recent is not None and keep.any():
                kept_ids = keys.filter(pa.array(keep)).column("event_id").to_pylist()
                unseen = recent.unseen(kept_ids)
                resent = unseen.count(False)
                if resent:
                    keep[np.flatnonzero(keep)] &= np.array(unseen, dtype=bool)
                    kept_ids = list(itertools.compress(kept_ids, unseen))
            n_kept = int(keep.sum())
            merged = {**recorded, **advanced}
            properties = {
                key: json.dumps({str(p): o for p, o in sorted(merged.items())}),
                inc_key: incarnation.dumps(),
            }
            if reset is not None:
                properties[reset_key(self.topic)] = json.dumps(reset)
            try:
                with transaction(table) as tx:
                    if isinstance(rows, _Written) and n_kept == keys.num_rows:
                        tx.append_files(rows.files, snapshot_properties=properties)
                    else:
                        tx.append(self._kept_rows(table, rows, keep), snapshot_properties=properties)
                    tx.set_properties(properties)
            except CommitFailedException as exc:
                self.stats.commit_retries += 1
                log.info("commit conflict on %s (attempt %d): %s", table.name(), attempt + 1, exc)
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
                continue
            if isinstance(rows, _Written) and n_kept < keys.num_rows:
                _delete_files(table, rows.files)  # their new rows were written again and committed
            if reset is not None:
                self.stats.resets += 1
                self.stats.reset_details.append(reset)
                log.warning("%s", IngestStats(reset_details=[reset]).describe_resets()[0])
            if recent is not None:
                recent.remember(kept_ids)
            self.stats.resent_duplicates += resent
            self.stats.reset_duplicates += n_fresh - n_kept - resent
            return table, n_kept, keys.num_rows - n_kept
        raise CommitConflict(f"could not commit to {table.name()} after 12 attempts")

    @staticmethod
    def _kept_rows(table: Table, rows: pa.Table | _Written, keep: np.ndarray) -> pa.Table:
        """The rows that ``keep`` marks, as an Arrow table (read back from written files if need be)."""
        if isinstance(rows, pa.Table):
            return rows if keep.all() else rows.filter(pa.array(keep))
        if not keep.any() or not rows.files:
            return RAW_EVENTS.arrow_schema().empty_table()
        written = pa.concat_tables(pq.read_table(table.io.new_input(f.file_path).open()) for f in rows.files).cast(
            RAW_EVENTS.arrow_schema()
        )
        # Files group rows by partition value, so match rows by their Kafka coordinates.
        wanted = rows.keys.filter(pa.array(keep))
        mask = pc.is_in(_coordinates(written), value_set=_coordinates(wanted))
        return written.filter(mask)

    def _resent_before_reset(self, table: Table, rows: pa.Table, window: dict[str, Any]) -> np.ndarray:
        """Mask of ``rows`` inside the post-reset window whose event ids ``table`` already holds.

        The window is bounded: only the first records of each partition of the new
        incarnation (the previous incarnation's offset plus ``reset_dedupe_records``:
        room for a full re-send of the old history interleaved with new events) are
        checked, and only against the rows of their own sessions.
        """
        duplicate = np.zeros(rows.num_rows, dtype=bool)
        if "event_id" not in rows.column_names or table.current_snapshot() is None:
            return duplicate  # dead letters carry no event id
        previous = {int(p): int(o) + self.settings.reset_dedupe_records
                    for p, o in window.get("previous_offsets", {}).items()}  # fmt: skip
        partitions = rows.column("kafka_partition").to_numpy()
        candidate = rows.column("kafka_offset").to_numpy() < _per_row(previous, partitions)
        if not candidate.any():
            return duplicate
        candidates = rows.filter(pa.array(candidate))
        sessions = sorted(set(candidates.column("session_id").to_pylist()))
        present = table.scan(row_filter=In("session_id", sessions), selected_fields=("event_id",)).to_arrow()
        known = pc.is_in(rows.column("event_id"), value_set=present.column("event_id").combine_chunks())
        return candidate & known.to_numpy(zero_copy_only=False)

    def _decode(self, batch: _Batch) -> tuple[dict[int, int], pa.Table | _Written, pa.Table]:
        """Decode one batch: its next offsets, raw-events rows and dead-letter rows.

        Runs on the decode thread, which only waits for the decoder process, while the
        commit thread commits the batch before.
        """
        partitions = np.frombuffer(batch.partitions, dtype=np.int32)
        offsets = np.frombuffer(batch.offsets, dtype=np.int64)
        next_offsets = {int(p): int(offsets[partitions == p].max()) + 1 for p in np.unique(partitions)}
        good, dead = self.decode_batch(batch, write=self.decoder.isolate)
        batch.data, batch.keys = bytearray(), []  # the batch's bytes go as soon as it is decoded
        return next_offsets, good, dead

    def _process(
        self, batch: _Batch, decoding: Future[tuple[dict[int, int], pa.Table | _Written, pa.Table]]
    ) -> dict[int, int]:
        """Commit one decoded batch to dead_letters and raw_events; returns its next offsets.

        Runs on the commit thread while the main thread consumes the next batch and the
        decode thread decodes it. ``dead_letters`` is committed when the batch has dead
        letters, every ``_DEAD_SYNC_SECONDS`` and on a waiting flush (see :meth:`flush`):
        its offsets only bound where a restart begins reading (the lower of the two
        tables), and raw_events drops what it already holds, so a lagging dead-letter
        offset costs a bounded re-read, never a duplicate.
        """
        next_offsets, good, dead = decoding.result()
        _fault("before_commit")
        for partition, offset in next_offsets.items():
            self._dead_pending[partition] = max(self._dead_pending.get(partition, 0), offset)
        if dead.num_rows or time.monotonic() - self._dead_synced >= _DEAD_SYNC_SECONDS:
            # Dead letters first: if we die between the two commits, raw events' lower offsets
            # make the replay start early, and the dead-letter offsets drop the repeats.
            self._commit_dead(dead)
        _fault("between_table_commits")
        self.raw_table, n_good, skipped = self._commit_table(
            self.raw_table.refresh, good, next_offsets, [], self.recent_ids
        )
        _fault("after_iceberg_commit")
        self.stats.events += n_good
        self.stats.skipped += skipped
        self.stats.batches += 1
        self.stats.bytes += batch.bytes
        for reason in dead.column("reason").to_pylist():
            self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1
        log.info("batch %d: %d events, %d dead letters, %d skipped", self.stats.batches, n_good, dead.num_rows, skipped)
        del good, dead
        release_free_memory()
        return next_offsets

    def _commit_dead(self, dead: pa.Table) -> None:
        """Commit dead letters with the offsets of every batch processed since the last such commit."""
        self.dead_table, n_dead, _ = self._commit_table(
            self.dead_table.refresh, dead, dict(self._dead_pending),
            [("kafka_partition", "ascending"), ("kafka_offset", "ascending")],
        )  # fmt: skip
        self.stats.dead_letters += n_dead
        self._dead_pending.clear()
        self._dead_synced = time.monotonic()

    def flush(self, wait: bool = True) -> None:
        """Hand the current batch to the commit thread; with ``wait``, return once everything is committed.

        A full batch starts decoding at once (in the decoder process), while the batch
        before it is still being committed; at most one batch is being committed, one
        decoded and one read, so memory stays bounded at about three batches. A waiting
        flush (end of run, partitions revoked) also brings dead_letters' offsets up to date.
        """
        batch = self._batch
        if batch.ends:
            self._batch = _Batch()
            decoding = self._decoding.submit(self._decode, batch)
            self._wait_inflight()
            self._inflight = self._committer.submit(self._process, batch, decoding)
        if wait:
            self._wait_inflight()
            if self._dead_pending:
                self._committer.submit(self._commit_dead, self.dead_schema.empty_table()).result()

    def _wait_inflight(self) -> None:
        """Wait for the batch being committed (re-raising its error), then commit its offsets to Kafka."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        next_offsets = inflight.result()
        # For lag monitoring only: Iceberg holds the offsets that count.
        self.consumer.commit(
            offsets=[TopicPartition(self.topic, p, o) for p, o in next_offsets.items()], asynchronous=True
        )

    # -- running -------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish its current batch and exit."""
        self._stop = True

    def _caught_up(self) -> bool:
        if not self.assigned:
            return False
        for partition in self.assigned:
            tp = TopicPartition(self.topic, partition)
            low, high = self.consumer.get_watermark_offsets(tp, timeout=5, cached=False)
            if max(self.positions.get(partition, 0), low) < high:
                return False
        return True

    def run(self, until_idle: float | None = None, join_timeout: float = 60.0) -> IngestStats:
        """Consume until stopped, or until caught up and idle for ``until_idle`` seconds.

        Raises:
            KafkaUnavailable: no partition was assigned within ``join_timeout`` seconds.
        """
        started = time.monotonic()
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        last_message = time.monotonic()
        try:
            while not self._stop:
                messages = self.consumer.consume(num_messages=10_000, timeout=0.2)
                self._add_many(messages)
                if messages:
                    last_message = time.monotonic()
                if self._batch_full() or (not messages and self._batch.ends):
                    self.flush(wait=False)
                if until_idle is not None and not messages:
                    if not self.assigned:
                        if time.monotonic() - started > join_timeout:
                            raise KafkaUnavailable(
                                f"no partition of {self.topic} assigned within {join_timeout:.0f} s "
                                f"(group {self.settings.consumer_group} at {self.bootstrap})"
                            )
                        last_message = time.monotonic()
                    elif time.monotonic() - last_message >= until_idle and self._caught_up():
                        break
            self.flush()
        finally:
            self._closing = True
            self._decoding.shutdown(wait=True)
            self._committer.shutdown(wait=True)  # an in-flight commit finishes (or fails) before we close
            self.consumer.close()
            self.decoder.close()
            self.stats.seconds = time.monotonic() - started
        return self.stats


def run_ingest(settings: Settings, until_idle: float | None = None, follow: bool = False) -> IngestStats:
    """Run one ingest worker; ``follow`` runs until SIGTERM/SIGINT finishes the batch."""
    worker = IngestWorker(settings, follow=follow)
    if follow:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        return worker.run()
    return worker.run(until_idle=until_idle if until_idle is not None else 5.0)
