"""Poison input interleaved with good events: every bad record is dead-lettered, the rest lands, ingest keeps going."""

from __future__ import annotations

import copy
import io

import fastavro
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from common.broker import admin_client, resolve_bootstrap
from common.settings import Settings, load_settings
from pipelines.ingest import IngestWorker
from producers.sdk import EventProducer
from schemas.registry import encode_event, latest
from tests.helpers import sample_events
from warehouse.query import run_query

pytestmark = pytest.mark.integration

MAX_EVENT_BYTES = 64 << 10  # small limit so the oversized record stays cheap


def with_arguments(event: dict, arguments: str) -> dict:
    """A copy of a tool-call event with other ``arguments`` (and its own ids)."""
    changed = copy.deepcopy(event)
    changed["payload"]["arguments"] = arguments
    changed["event_id"] = "poison-" + changed["event_id"][7:]
    return changed


def poison_records(events: list[dict]) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, expected dead-letter reason)."""
    good = encode_event(events[0])
    other = fastavro.parse_schema(
        {"type": "record", "name": "Other", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]}
    )
    body = io.BytesIO()
    fastavro.schemaless_writer(body, other, {"a": 7, "b": "not an event"})
    session = events[0]["session_id"].encode()
    bad_utf8 = good.replace(session, b"\xff\xfe" + session[2:], 1)
    assert bad_utf8 != good
    mismatched = dict(events[0], event_type="evaluation")  # envelope says one kind, payload is another
    schema = latest()
    record = dict(mismatched, payload=(schema.payload_kinds[events[0]["event_type"]], events[0]["payload"]))
    wrong_kind = io.BytesIO()
    wrong_kind.write(schema.header)
    fastavro.schemaless_writer(wrong_kind, schema.parsed, record)
    tool_call = next(e for e in events if "arguments" in (e["payload"] or {}))
    oversized = encode_event(with_arguments(tool_call, "x" * (MAX_EVENT_BYTES + 1)))
    return {
        "random_bytes": (bytes(range(256)) * 3, "bad_magic"),
        "unknown_fingerprint": (b"\xc3\x01" + b"\x13" * 8 + good[10:], "unknown_schema"),
        "foreign_record_body": (schema.header + body.getvalue(), "corrupt_payload"),
        "type_mismatch": (wrong_kind.getvalue(), "invalid_event"),
        "invalid_utf8": (bad_utf8, "corrupt_payload"),
        "oversized": (oversized, "oversized"),
        "empty": (b"", "bad_magic"),
    }


@pytest.mark.slow
def test_poison_is_dead_lettered_with_coordinates_and_good_events_land(
    kafka_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAJLAKE_MAX_EVENT_BYTES", str(MAX_EVENT_BYTES))
    settings = load_settings()
    events = sample_events(6, seed=21)
    tool_call = next(e for e in events if "arguments" in (e["payload"] or {}))
    # JSON nested 10k deep inside the arguments string: opaque text to ingest, kept verbatim.
    deep = with_arguments(tool_call, "[" * 10_000 + "]" * 10_000)
    poison = poison_records(events)
    producer = EventProducer(resolve_bootstrap(settings), settings.topic, "poison-host")
    step = len(events) // (len(poison) + 1)
    for i, (name, (value, _)) in enumerate(poison.items()):
        for event in events[i * step : (i + 1) * step]:
            producer.emit(event)
        producer.send(events[i * step]["session_id"], name, value)  # same partition as its neighbours
    for event in events[len(poison) * step :]:
        producer.emit(event)
    producer.emit(deep)
    producer.flush(60)

    stats = IngestWorker(settings).run(until_idle=1)
    good = len(events) + 1
    assert (stats.events, stats.dead_letters) == (good, len(poison))
    counts = run_query(settings, "SELECT count(*), count(DISTINCT event_id) FROM events")[1][0]
    assert counts == (good, good)
    kind = deep["event_type"]
    stored = run_query(
        settings,
        f"SELECT length(struct_extract({kind}, 'arguments')) FROM events WHERE event_id = '{deep['event_id']}'",
    )
    assert stored[1] == [(20_000,)]
    rows = run_query(
        settings,
        "SELECT raw_value, reason, kafka_topic, kafka_partition, kafka_offset, error FROM dead_letters",
    )[1]
    by_value = {bytes(row[0]): row for row in rows}
    for name, (value, reason) in poison.items():
        row = by_value[value]
        assert row[1] == reason, (name, row[1], row[5])
        assert row[2] == settings.topic and row[3] >= 0 and row[4] >= 0 and row[5], name
    assert IngestWorker(settings).run(until_idle=1).events == 0  # nothing left behind, nothing re-read


@pytest.mark.slow
def test_huge_event_is_rejected_by_the_producer_or_dead_lettered_past_the_limit(kafka_settings: Settings) -> None:
    events = sample_events(2, seed=22)
    tool_call = next(e for e in events if "arguments" in (e["payload"] or {}))
    huge = with_arguments(tool_call, "y" * (5 << 20))
    default = EventProducer(resolve_bootstrap(kafka_settings), kafka_settings.topic, "huge-host")
    with pytest.raises(KafkaException) as rejected:  # librdkafka's 1 MB message.max.bytes, before any I/O
        default.emit(huge)
    assert rejected.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    default.flush(10)

    # With the limits raised end to end the record reaches Kafka, and ingest dead-letters it as oversized.
    resource = ConfigResource(
        ResourceType.TOPIC,
        kafka_settings.topic,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(16 << 20), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    try:
        admin = admin_client(resolve_bootstrap(kafka_settings))  # kept referenced until the future resolves
        admin.incremental_alter_configs([resource])[resource].result(30)
    except KafkaException as exc:
        pytest.skip(f"broker does not alter topic configs: {exc}")
    raised = EventProducer(
        resolve_bootstrap(kafka_settings),
        kafka_settings.topic,
        "huge-host",
        extra_config={"message.max.bytes": str(16 << 20)},
    )
    raised.emit(huge)
    for event in events:
        raised.emit(event)
    raised.flush(60)
    assert not raised.failed, raised.failed
    stats = IngestWorker(kafka_settings).run(until_idle=1)
    assert (stats.events, stats.dead_letters, stats.reasons) == (len(events), 1, {"oversized": 1})
