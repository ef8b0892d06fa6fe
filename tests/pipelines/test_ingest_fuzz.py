"""Fuzzing the Kafka record boundary: whatever bytes a record holds, ingest goes on.

Each example sends one batch of generated records to a topic of its own: schema-valid events
(any payload kind, any event time an Avro long holds), and the same encodings mutated (truncated,
a byte flipped, bytes appended, another schema fingerprint, a string grown past the event limit),
random bytes, and Kafka timestamps a datetime cannot hold. The oracle is ``decode_event`` record by
record: what it decodes lands in ``events`` once, what it refuses is in ``dead_letters`` with its
reason, and a second run adds nothing.

Each example costs a broker round trip and two ingest runs, so the budget is a tenth of the
profile's (6 examples under the ``ci`` profile; ``trajlake bench fuzz --examples 5000 -k ingest_fuzz``
runs 500).
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.broker import ensure_topic
from common.settings import Settings
from pipelines.ingest import IngestWorker
from schemas.errors import DecodeError
from schemas.registry import decode_event, encode_event
from tests.strategies import events
from warehouse.query import run_query

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]

MAX_EVENT_BYTES = 32 << 10
EXAMPLES = max(4, settings().max_examples // 10)  # the loaded profile's (ci: 60, fuzz: 5000)
EXTREME_TS = [-(2**63), -62_167_219_200_000_000, -1, 0, 253_402_300_800_000_000, 2**63 - 1]
KAFKA_TS = [0, 1, 253_402_300_799_999, 2**53, 2**62]  # ms; 0: the producer's clock


@st.composite
def records(draw: st.DrawFn, prefix: str) -> tuple[bytes, str, int]:
    """One record: (value, key, Kafka timestamp in ms)."""
    event: dict[str, Any] = draw(events())
    event["event_id"] = f"{prefix}-{draw(st.integers(0, 10**9))}-{event['event_id']}"
    event["ts"] = draw(st.sampled_from(EXTREME_TS) | st.integers(-(2**63), 2**63 - 1) | st.integers(0, 2**62))
    value = encode_event(event)
    how = draw(st.sampled_from(["valid", "valid", "truncated", "flipped", "trailing", "fingerprint", "huge", "random"]))
    if how == "truncated":
        value = value[: draw(st.integers(0, len(value) - 1))]
    elif how == "flipped":
        at = draw(st.integers(0, len(value) - 1))
        value = value[:at] + bytes([value[at] ^ draw(st.integers(1, 255))]) + value[at + 1 :]
    elif how == "trailing":
        value += draw(st.binary(min_size=1, max_size=16))
    elif how == "fingerprint":
        value = value[:2] + draw(st.binary(min_size=8, max_size=8)) + value[10:]
    elif how == "huge":
        event["extra"] = {"blob": "x" * draw(st.integers(MAX_EVENT_BYTES - 2048, MAX_EVENT_BYTES + 2048))}
        value = encode_event(event)
    elif how == "random":
        value = draw(st.binary(max_size=300))
    return value, str(event["session_id"]), draw(st.sampled_from(KAFKA_TS))


def _outcome(value: bytes) -> tuple[str, str]:
    """``("event", event_id)`` when ``decode_event`` decodes it, else ``("dead", reason)``."""
    try:
        return "event", decode_event(value, max_bytes=MAX_EVENT_BYTES, raw_timestamps=True)["event_id"]
    except DecodeError as exc:
        return "dead", exc.reason


#: What a broker refuses of a record itself, and librdkafka's code for the records of a batch that one refused record
#: failed with it.
BROKER_REFUSALS = {
    KafkaError.INVALID_TIMESTAMP,
    KafkaError.INVALID_RECORD,
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError._INVALID_DIFFERENT_RECORD,
}


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_record_bytes_are_ingested_or_dead_lettered_once(kafka_settings: Settings, data: st.DataObject) -> None:
    prefix = uuid.uuid4().hex[:8]
    settings_ = kafka_settings.model_copy(
        update={"topic": f"fuzz-{prefix}", "consumer_group": f"fuzz-{prefix}", "max_event_bytes": MAX_EVENT_BYTES}
    )
    bootstrap = str(kafka_settings.kafka_bootstrap)
    ensure_topic(bootstrap, settings_.topic, 2)
    sent = data.draw(st.lists(records(prefix), min_size=1, max_size=40), label="records")
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": str(4 << 20)})
    failed: list[str] = []
    refused_by_broker: set[int] = set()

    def delivered(index: int) -> Callable[[KafkaError | None, object], None]:
        def report(err: KafkaError | None, _msg: object) -> None:
            # Apache Kafka refuses some records itself (a timestamp past message.timestamp.after.max.ms,
            # an hour ahead by default; a record its validation rejects): they never enter the topic, so
            # ingest has nothing to account for. Any other delivery error fails the test.
            if err is not None and err.code() in BROKER_REFUSALS:
                refused_by_broker.add(index)
            elif err is not None:
                failed.append(str(err))

        return report

    for index, (value, key, timestamp) in enumerate(sent):
        producer.produce(settings_.topic, value, key.encode(), timestamp=timestamp, on_delivery=delivered(index))
    assert producer.flush(60) == 0 and not failed, failed
    sent = [record for index, record in enumerate(sent) if index not in refused_by_broker]

    stats = IngestWorker(settings_).run(until_idle=1)  # returns: nothing a record holds stops it

    topic = settings_.topic
    expected = [_outcome(value) for value, _, _ in sent]
    ids = [name for kind, name in expected if kind == "event"]
    landed = run_query(settings_, f"SELECT event_id FROM events WHERE kafka_topic = '{topic}'")[1]
    assert collections.Counter(e for (e,) in landed) == collections.Counter(set(ids))
    assert stats.resent_duplicates == len(ids) - len(set(ids))
    dead = run_query(settings_, f"SELECT raw_value, reason, error FROM dead_letters WHERE kafka_topic = '{topic}'")[1]
    dead_values = collections.Counter((bytes(v), reason) for v, reason, _ in dead)
    refused = [(value, name) for (value, _, _), (kind, name) in zip(sent, expected, strict=True) if kind == "dead"]
    assert dead_values == collections.Counter(refused)
    assert all(reason and error for _, reason, error in dead)
    again = IngestWorker(settings_).run(until_idle=1)
    assert (again.events, again.dead_letters) == (0, 0)
