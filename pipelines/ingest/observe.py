"""What a long-running ingest looks like from outside: consumer lag, throughput, dead-letter rate.

``trajlake ingest --follow`` (one or many processes in one consumer group) is the streaming
consumer; Dagster only observes it. An observation reads two things, neither of which
ingest has to cooperate for: the topic's high watermarks from Kafka, and the next offset
per partition that the newest ``raw_events`` and ``dead_letters`` snapshots recorded (the
exactly-once bookkeeping, not Kafka's committed offsets, which ingest does not rely on).
Lag is the difference. Rates come from two observations (``rates``), so the observer keeps
the previous one (a Dagster sensor keeps it in its cursor).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from pyiceberg.table.snapshots import Snapshot

from common.broker import resolve_bootstrap
from common.errors import KafkaUnavailable
from common.settings import Settings
from pipelines.ingest.offsets import recorded_offsets
from warehouse.catalog import open_catalog
from warehouse.tables import DEAD_LETTERS, RAW_EVENTS, ensure_table


@dataclass
class IngestObservation:
    """One look at the topic and the lakehouse's position in it.

    Attributes:
        observed_at: wall-clock seconds.
        high_watermarks: partition → Kafka's high watermark.
        committed: partition → next offset recorded by the newest ``raw_events`` commit.
        raw_events_snapshot: id of ``raw_events``' current snapshot (``None`` before the first).
        events: rows in ``raw_events`` (from snapshot summaries, no scan).
        dead_letters: rows in ``dead_letters``.
    """

    observed_at: float
    high_watermarks: dict[int, int]
    committed: dict[int, int]
    raw_events_snapshot: int | None
    events: int
    dead_letters: int
    lag: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.lag = {p: max(0, hw - self.committed.get(p, 0)) for p, hw in self.high_watermarks.items()}

    @property
    def total_lag(self) -> int:
        """Records in the topic not yet in the lakehouse (an upper bound: the broker's watermark may lag)."""
        return sum(self.lag.values())

    def to_json(self) -> str:
        """Serialized form (a sensor cursor)."""
        return json.dumps({k: v for k, v in asdict(self).items() if k != "lag"})

    @classmethod
    def from_json(cls, text: str | None) -> IngestObservation | None:
        """The observation serialized by :meth:`to_json`, or ``None`` for a missing or foreign cursor."""
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(
                observed_at=float(data["observed_at"]),
                high_watermarks={int(k): int(v) for k, v in data["high_watermarks"].items()},
                committed={int(k): int(v) for k, v in data["committed"].items()},
                raw_events_snapshot=data["raw_events_snapshot"],
                events=int(data["events"]),
                dead_letters=int(data["dead_letters"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class IngestRates:
    """Rates between two observations."""

    seconds: float
    events_per_s: float
    dead_letters_per_s: float
    dead_letter_rate: float


def rates(previous: IngestObservation | None, current: IngestObservation) -> IngestRates | None:
    """Events/s, dead letters/s and the dead-letter share since ``previous`` (``None`` without one)."""
    if previous is None or current.observed_at <= previous.observed_at:
        return None
    seconds = current.observed_at - previous.observed_at
    events = max(0, current.events - previous.events)
    dead = max(0, current.dead_letters - previous.dead_letters)
    return IngestRates(
        seconds=seconds,
        events_per_s=events / seconds,
        dead_letters_per_s=dead / seconds,
        dead_letter_rate=dead / (events + dead) if events + dead else 0.0,
    )


def _total_records(snapshot: Snapshot | None) -> int:
    """Rows in the table as of ``snapshot``, from its summary (no scan)."""
    return int(snapshot.summary.get("total-records", 0)) if snapshot is not None and snapshot.summary else 0


def high_watermarks(settings: Settings, timeout: float = 10.0) -> dict[int, int]:
    """Kafka's high watermark per partition of the event topic.

    Raises:
        KafkaUnavailable: the broker did not answer within ``timeout``.
        BrokerNotRunning: no broker configured or running.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": resolve_bootstrap(settings),
            "group.id": f"{settings.consumer_group}-observer",
            "enable.auto.commit": False,
            **settings.kafka_extra,
        }
    )
    try:
        metadata = consumer.list_topics(settings.topic, timeout=timeout)
        topic = metadata.topics.get(settings.topic)
        if topic is None or topic.error is not None:
            return {}
        marks = {}
        for partition in sorted(topic.partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(settings.topic, partition), timeout=timeout)
            marks[partition] = int(high)
        return marks
    except Exception as exc:  # librdkafka raises KafkaException for timeouts and transport errors
        raise KafkaUnavailable(f"topic {settings.topic}: no watermarks within {timeout:.0f} s ({exc})") from exc
    finally:
        consumer.close()


def observe_ingest(settings: Settings) -> IngestObservation:
    """Observe the event topic and the lakehouse's position in it now.

    Raises:
        KafkaUnavailable: Kafka did not answer.
    """
    catalog = open_catalog(settings)
    raw = ensure_table(catalog, settings, RAW_EVENTS.name)
    dead = ensure_table(catalog, settings, DEAD_LETTERS.name)
    raw_snapshot, dead_snapshot = raw.current_snapshot(), dead.current_snapshot()
    return IngestObservation(
        observed_at=time.time(),
        high_watermarks=high_watermarks(settings),
        committed=recorded_offsets(raw, settings.topic),
        raw_events_snapshot=raw_snapshot.snapshot_id if raw_snapshot else None,
        events=_total_records(raw_snapshot),
        dead_letters=_total_records(dead_snapshot),
    )


def observation_metadata(current: IngestObservation, change: IngestRates | None) -> dict[str, Any]:
    """Flat numbers and per-partition maps, as a person would plot them."""
    values: dict[str, Any] = {
        "consumer_lag": current.total_lag,
        "lag_by_partition": {str(p): n for p, n in sorted(current.lag.items())},
        "committed_offsets": {str(p): n for p, n in sorted(current.committed.items())},
        "high_watermarks": {str(p): n for p, n in sorted(current.high_watermarks.items())},
        "events_total": current.events,
        "dead_letters_total": current.dead_letters,
    }
    if change is not None:
        values.update(
            events_per_s=round(change.events_per_s, 2),
            dead_letters_per_s=round(change.dead_letters_per_s, 3),
            dead_letter_rate=round(change.dead_letter_rate, 5),
        )
    return values


@dataclass(frozen=True)
class Uningested:
    """Records of the event topic that the lakehouse does not hold yet, per partition.

    Attributes:
        by_partition: partition → records at or past the lakehouse's next offset (only partitions with some).
        committed: partition → next offset the newest ``raw_events`` commit recorded for this topic incarnation.
        high_watermarks: partition → the broker's high watermark when looked at.
    """

    by_partition: dict[int, int]
    committed: dict[int, int]
    high_watermarks: dict[int, int]

    @property
    def total(self) -> int:
        """Records not yet in the lakehouse."""
        return sum(self.by_partition.values())


def _lakehouse_offsets(settings: Settings, topic_id: str | None) -> dict[int, int]:
    """What ``raw_events`` recorded for the topic's current incarnation; {} without a lakehouse or table."""
    from pyiceberg.exceptions import NoSuchTableError

    from pipelines.ingest.offsets import recorded_incarnation
    from warehouse.tables import table_identifier

    if not settings.catalog_is_external and not settings.catalog_file.exists():
        return {}  # no lakehouse here: nothing was ingested (and none is created by looking)
    try:
        raw = open_catalog(settings).load_table(table_identifier(settings, RAW_EVENTS.name))
    except NoSuchTableError:
        return {}
    incarnation = recorded_incarnation(raw, settings.topic)
    if topic_id and incarnation.topic_id and incarnation.topic_id != topic_id:
        return {}  # the offsets belong to an earlier life of the topic: none of this one is ingested
    return recorded_offsets(raw, settings.topic)


def uningested(settings: Settings, bootstrap: str, idle_s: float = 1.5, timeout: float = 10.0) -> Uningested:
    """Count the records of the event topic at ``bootstrap`` that are not in the lakehouse yet.

    Below the high watermark the count is arithmetic (watermark − next recorded offset); past it
    the records are read, up to ``idle_s`` without a new one, because a broker's watermark may lag
    its log (tansu reports the last batch's base offset + 1, so the rest of that batch is beyond it).

    Raises:
        KafkaUnavailable: the broker did not answer within ``timeout``.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    base: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, **settings.kafka_extra}
    try:
        admin = AdminClient(base)  # kept referenced until the answer came: a collected client cancels its futures
        info = admin.describe_topics(TopicCollection([settings.topic]))[settings.topic].result(timeout=timeout)
    except KafkaException as exc:
        if "UNKNOWN_TOPIC" in str(exc).upper():
            return Uningested({}, {}, {})  # no topic: nothing was ever produced
        raise KafkaUnavailable(f"topic {settings.topic}: not described within {timeout:.0f} s ({exc})") from exc
    topic_id = str(info.topic_id) if info.topic_id is not None else ""
    committed = _lakehouse_offsets(settings, topic_id if topic_id.strip("A=") else None)
    consumer = Consumer(
        {
            **base,
            "group.id": f"{settings.consumer_group}-stop-check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        marks: dict[int, int] = {}
        counts: dict[int, int] = {}
        starts: list[TopicPartition] = []
        for partition in sorted(p.id for p in info.partitions):
            tp = TopicPartition(settings.topic, partition)
            _, high = consumer.get_watermark_offsets(tp, timeout=timeout, cached=False)
            marks[partition] = int(high)
            start = committed.get(partition, 0)
            counts[partition] = max(0, int(high) - start)
            starts.append(TopicPartition(settings.topic, partition, max(start, int(high))))
        consumer.assign(starts)
        # Read until every partition answered (a record or its end) and then nothing came for idle_s.
        answered: set[int] = set()
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while len(answered) < len(marks) or time.monotonic() - last < idle_s:
            if time.monotonic() > deadline:
                raise KafkaUnavailable(
                    f"topic {settings.topic}: partitions {sorted(set(marks) - answered)} did not answer"
                )
            message = consumer.poll(0.2)
            if message is None:
                continue
            partition = message.partition()
            if partition is None:
                continue
            answered.add(partition)
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                continue
            counts[partition] = counts.get(partition, 0) + 1
            last = time.monotonic()
    except KafkaException as exc:
        raise KafkaUnavailable(f"topic {settings.topic}: no watermarks within {timeout:.0f} s ({exc})") from exc
    finally:
        consumer.close()
    return Uningested({p: n for p, n in counts.items() if n}, committed, marks)
