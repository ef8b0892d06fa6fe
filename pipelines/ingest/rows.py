"""The rows ingest writes: raw events from decoded events, dead letters from undecodable records."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pipelines.decode.results import TS_MAX_US
from pipelines.ingest.batch import Batch
from producers.redact import redact_bytes, redact_text
from schemas.registry import HEADER_LEN, latest

#: Envelope columns of a raw-events row: every non-payload field of the latest schema (v3 adds
#: group_id, attempt, retry_of) and the writer's version, so a new envelope field is never dropped.
ENVELOPE = tuple(f["name"] for f in latest().raw["fields"] if f["name"] != "payload") + ("schema_version",)


def event_row(event: dict[str, Any], topic: str, partition: int, offset: int, ingested_at: datetime) -> dict[str, Any]:
    """The raw-events row of a decoded event: envelope, its payload struct, Kafka coordinates."""
    row = {name: event[name] for name in ENVELOPE}
    row[event["event_type"]] = event["payload"]
    row.update(kafka_topic=topic, kafka_partition=partition, kafka_offset=offset, ingested_at=ingested_at)
    return row


def dead_letter_row(batch: Batch, index: int, topic: str, reason: str, error: str, now: datetime) -> dict[str, Any]:
    """The dead-letters row of the ``index``-th record of ``batch``: its raw bytes, coordinates and why.

    Args:
        batch: the batch holding the record.
        index: the record's position in the batch.
        topic: Kafka topic of the batch.
        reason: the dead-letter reason (``DecodeError.reason``).
        error: the error text (cut to 2,000 characters).
        now: ingest time stamped on the row.
    """
    ts_ms = batch.timestamps[index]
    value = batch.value(index)
    return {
        "kafka_topic": topic,
        "kafka_partition": batch.partitions[index],
        "kafka_offset": batch.offsets[index],
        # set by the producer: one past year 9999 is no time a datetime holds
        "kafka_timestamp": datetime.fromtimestamp(ts_ms / 1000, UTC) if 0 < ts_ms <= TS_MAX_US // 1000 else None,
        # what no admission pass saw: its secrets redacted (a sender that did not redact, a session id that is
        # a token); the size and fingerprint stay those of the record as received
        "raw_key": redact_bytes(batch.keys[index]),
        "raw_value": redact_bytes(value),
        "value_bytes": len(value),
        "reason": reason,
        "error": redact_text(error[:2000]),
        "schema_fingerprint": value[2:HEADER_LEN].hex() if value[:2] == b"\xc3\x01" else None,
        "ingested_at": now,
    }
