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
* the Iceberg commit is atomic: rows and offsets land together or not at all.

Kafka offsets are still committed afterwards, for lag monitoring only.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from pipelines.broker import resolve_bootstrap
from pipelines.errors import CommitConflict, KafkaUnavailable
from pipelines.settings import Settings
from schemas.errors import DecodeError
from schemas.registry import HEADER_LEN, decode_event
from warehouse.catalog import open_catalog
from warehouse.tables import DEAD_LETTERS, RAW_EVENTS, ensure_table

log = logging.getLogger("trajlake.ingest")

OFFSETS_PREFIX = "trajlake.offsets."
_ENVELOPE = (
    "event_id", "session_id", "seq", "ts", "event_type", "source", "sandbox_id", "task_id", "task_type",
    "host_id", "image_name", "image_version", "agent_name", "agent_version", "agent_model", "policy_version",
    "agent_message_id", "parent_event_id", "extra", "schema_version",
)  # fmt: skip


def offsets_key(topic: str) -> str:
    """Property key under which a table records its next offsets for ``topic``."""
    return OFFSETS_PREFIX + topic


def recorded_offsets(table: Table, topic: str) -> dict[int, int]:
    """Next offset per partition that ``table`` has ingested from ``topic``.

    Max-merges the table property with the newest snapshot summary carrying the
    key, so neither snapshot expiry nor a foreign commit (compaction) loses it.
    """
    key = offsets_key(topic)
    merged: dict[int, int] = {}

    def merge(text: str | None) -> None:
        if text:
            for partition, offset in json.loads(text).items():
                merged[int(partition)] = max(merged.get(int(partition), 0), int(offset))

    merge(table.properties.get(key))
    snapshot = table.current_snapshot()
    while snapshot is not None:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        if key in summary:
            merge(summary[key])
            break
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return merged


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


@dataclass
class IngestStats:
    """What one ingest run did."""

    events: int = 0
    dead_letters: int = 0
    skipped: int = 0  # records below the recorded offsets (replays, zombies)
    batches: int = 0
    commit_retries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)


@dataclass
class _Batch:
    records: list[Message] = field(default_factory=list)
    bytes: int = 0
    started: float = 0.0


def consumer_config(settings: Settings, bootstrap: str) -> dict[str, Any]:
    """librdkafka consumer settings: manual offsets, fast group join."""
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
        "fetch.max.bytes": 64 << 20,
        "max.partition.fetch.bytes": 8 << 20,
        "queued.max.messages.kbytes": 256 << 10,
        **settings.kafka_extra,
    }


class IngestWorker:
    """One ingest process: a member of the consumer group writing to Iceberg.

    Args:
        settings: trajlake settings.
        catalog: Iceberg catalog; opened from settings by default.
        bootstrap: Kafka bootstrap; resolved from settings by default.
    """

    def __init__(self, settings: Settings, catalog: Catalog | None = None, bootstrap: str | None = None) -> None:
        self.settings = settings
        self.topic = settings.topic
        self.catalog = catalog or open_catalog(settings)
        self.raw_table = ensure_table(self.catalog, settings, RAW_EVENTS.name)
        self.dead_table = ensure_table(self.catalog, settings, DEAD_LETTERS.name)
        self.raw_schema = RAW_EVENTS.arrow_schema()
        self.dead_schema = DEAD_LETTERS.arrow_schema()
        self.bootstrap = bootstrap or resolve_bootstrap(settings)
        self.consumer = Consumer(consumer_config(settings, self.bootstrap), logger=log)
        self.stats = IngestStats()
        self.assigned: set[int] = set()
        self.positions: dict[int, int] = {}  # next offset to read, per assigned partition
        self._batch = _Batch()
        self._stop = False

    # -- offsets -----------------------------------------------------------------

    def _start_offsets(self) -> dict[int, int]:
        raw = recorded_offsets(self.raw_table, self.topic)
        dead = recorded_offsets(self.dead_table, self.topic)
        return {p: min(raw.get(p, 0), dead.get(p, 0)) for p in set(raw) | set(dead)}

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._refresh_tables()
        start = self._start_offsets()
        for tp in partitions:
            tp.offset = start.get(tp.partition, OFFSET_BEGINNING)
            self.assigned.add(tp.partition)
            self.positions[tp.partition] = max(tp.offset, 0)
        log.info("assigned %s", {tp.partition: tp.offset for tp in partitions})
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Finish what we hold before the partitions move; the offset check makes this safe either way.
        self.flush()
        self.assigned -= {tp.partition for tp in partitions}

    # -- batching ----------------------------------------------------------------

    def _batch_full(self) -> bool:
        batch = self._batch
        return bool(batch.records) and (
            len(batch.records) >= self.settings.ingest_max_rows
            or batch.bytes >= self.settings.ingest_max_bytes
            or time.monotonic() - batch.started >= self.settings.ingest_max_seconds
        )

    def _add(self, message: Message) -> None:
        if not self._batch.records:
            self._batch.started = time.monotonic()
        self._batch.records.append(message)
        self.positions[message.partition()] = message.offset() + 1
        self._batch.bytes += len(message.value() or b"")

    def _refresh_tables(self) -> None:
        self.raw_table = self.raw_table.refresh()
        self.dead_table = self.dead_table.refresh()

    def decode_batch(
        self, messages: Iterable[Message]
    ) -> tuple[list[tuple[int, int, dict]], list[tuple[int, int, dict]]]:
        """Split messages into (partition, offset, row) lists of raw events and dead letters."""
        now = datetime.now(UTC)
        good: list[tuple[int, int, dict]] = []
        dead: list[tuple[int, int, dict]] = []
        max_bytes = self.settings.max_event_bytes
        for message in messages:
            value = message.value() or b""
            partition, offset = message.partition(), message.offset()
            try:
                event = decode_event(value, max_bytes=max_bytes)
            except DecodeError as exc:
                dead.append((partition, offset, self._dead_row(message, value, exc.reason, str(exc), now)))
                continue
            good.append((partition, offset, event_row(event, message.topic(), partition, offset, now)))
        return good, dead

    def _dead_row(self, message: Message, value: bytes, reason: str, error: str, now: datetime) -> dict:
        ts_type, ts_ms = message.timestamp()
        return {
            "kafka_topic": message.topic(),
            "kafka_partition": message.partition(),
            "kafka_offset": message.offset(),
            "kafka_timestamp": datetime.fromtimestamp(ts_ms / 1000, UTC) if ts_ms and ts_ms > 0 else None,
            "raw_key": message.key(),
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
        rows: list[tuple[int, int, dict]],
        next_offsets: dict[int, int],
        schema: pa.Schema,
        sort_keys: list[tuple[str, str]],
    ) -> tuple[Table, int, int]:
        """Append rows not yet recorded, with offsets, retrying commit conflicts."""
        delay = 0.05
        for attempt in range(12):
            table = load()
            recorded = recorded_offsets(table, self.topic)
            fresh = [row for partition, offset, row in rows if offset >= recorded.get(partition, 0)]
            advanced = {p: o for p, o in next_offsets.items() if o > recorded.get(p, 0)}
            if not advanced:  # everything here was committed already (by us before a crash, or a peer)
                return table, 0, len(rows)
            merged = {**recorded, **advanced}
            value = json.dumps({str(p): o for p, o in sorted(merged.items())})
            key = offsets_key(self.topic)
            arrow = pa.Table.from_pylist(fresh, schema=schema)
            if sort_keys and arrow.num_rows:
                arrow = arrow.sort_by(sort_keys)
            try:
                with table.transaction() as tx:
                    tx.append(arrow, snapshot_properties={key: value})
                    tx.set_properties({key: value})
                return table, len(fresh), len(rows) - len(fresh)
            except CommitFailedException as exc:
                self.stats.commit_retries += 1
                log.info("commit conflict on %s (attempt %d): %s", table.name(), attempt + 1, exc)
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
        raise CommitConflict(f"could not commit to {table.name()} after 12 attempts")

    def flush(self) -> None:
        """Decode and commit the current batch; no-op when empty."""
        messages = self._batch.records
        if not messages:
            return
        self._batch = _Batch()
        next_offsets: dict[int, int] = {}
        for message in messages:
            next_offsets[message.partition()] = max(next_offsets.get(message.partition(), 0), message.offset() + 1)
        good, dead = self.decode_batch(messages)
        _fault("before_commit")
        # Dead letters first: if we die between the two commits, raw events' lower offsets
        # make the replay start early, and the dead-letter offsets drop the repeats.
        self.dead_table, n_dead, _ = self._commit_table(
            self.dead_table.refresh, dead, next_offsets, self.dead_schema,
            [("kafka_partition", "ascending"), ("kafka_offset", "ascending")],
        )  # fmt: skip
        _fault("between_table_commits")
        self.raw_table, n_good, skipped = self._commit_table(
            self.raw_table.refresh, good, next_offsets, self.raw_schema,
            [("session_id", "ascending"), ("seq", "ascending")],
        )  # fmt: skip
        _fault("after_iceberg_commit")
        self.consumer.commit(
            offsets=[TopicPartition(self.topic, p, o) for p, o in next_offsets.items()], asynchronous=True
        )
        self.stats.events += n_good
        self.stats.dead_letters += n_dead
        self.stats.skipped += skipped
        self.stats.batches += 1
        self.stats.bytes += sum(len(m.value() or b"") for m in messages)
        for _, _, row in dead:
            self.stats.reasons[row["reason"]] = self.stats.reasons.get(row["reason"], 0) + 1
        log.info("batch %d: %d events, %d dead letters, %d skipped", self.stats.batches, n_good, n_dead, skipped)

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
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            log.warning("consumer error: %s", error)
                        continue
                    self._add(message)
                if messages:
                    last_message = time.monotonic()
                if self._batch_full() or (not messages and self._batch.records):
                    self.flush()
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
            self.consumer.close()
            self.stats.seconds = time.monotonic() - started
        return self.stats


def run_ingest(settings: Settings, until_idle: float | None = None, follow: bool = False) -> IngestStats:
    """Run one ingest worker; ``follow`` runs until SIGTERM/SIGINT finishes the batch."""
    worker = IngestWorker(settings)
    if follow:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        return worker.run()
    return worker.run(until_idle=until_idle if until_idle is not None else 5.0)
