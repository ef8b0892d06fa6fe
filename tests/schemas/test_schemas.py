"""Event schema: round trip, single-object header, failures, Iceberg mapping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from pyiceberg.types import StructType

from schemas.errors import BadMagic, CorruptPayload, EncodeError, InvalidEvent, OversizedEvent, UnknownFingerprint
from schemas.iceberg import raw_events_schema
from schemas.registry import HEADER_LEN, MAGIC, decode_event, encode_event, latest
from tests.helpers import sample_events
from tests.strategies import events


@given(events())
@settings(max_examples=300, deadline=None)
def test_round_trip_preserves_every_field(event: dict) -> None:
    data = encode_event(event)
    assert data[:2] == MAGIC and data[2:HEADER_LEN] == latest().fingerprint
    decoded = decode_event(data)
    ts = decoded.pop("ts")
    assert int(ts.timestamp() * 1_000_000) == pytest.approx(event["ts"], abs=1)
    assert decoded.pop("schema_version") == latest().version
    expected = {k: v for k, v in event.items() if k != "ts"}
    # Fields the latest schema added since the event's shape was written come back as their defaults.
    for added in set(decoded) - set(expected):
        assert decoded.pop(added) is None
    for added in set(decoded["payload"]) - set(expected["payload"]):
        assert decoded["payload"].pop(added) is None
    assert decoded == expected


def test_synthetic_events_round_trip() -> None:
    for event in sample_events(5):
        decoded = decode_event(encode_event(event))
        assert decoded["payload"] == {**decoded["payload"], **event["payload"]}
        assert decoded["event_id"] == event["event_id"]


def test_bad_input_raises_specific_errors() -> None:
    good = encode_event(sample_events(1)[0])
    with pytest.raises(BadMagic):
        decode_event(b"not avro at all")
    with pytest.raises(UnknownFingerprint):
        decode_event(MAGIC + b"\x00" * 8 + good[HEADER_LEN:])
    with pytest.raises(CorruptPayload):
        decode_event(good[: len(good) // 2])
    with pytest.raises(CorruptPayload):
        decode_event(good + b"\x00")
    with pytest.raises(OversizedEvent):
        decode_event(good, max_bytes=len(good) - 1)
    with pytest.raises(EncodeError):
        encode_event({**sample_events(1)[0], "event_type": "no_such_kind"})


def test_payload_kind_must_match_event_type() -> None:
    event = sample_events(1)[0]  # a session_start
    forged = encode_event({**event, "event_type": "session_start"}).replace(b"session_start", b"session_end__", 1)
    with pytest.raises((InvalidEvent, CorruptPayload)):
        decode_event(forged)


def test_iceberg_schema_has_typed_payload_columns() -> None:
    schema = raw_events_schema()
    names = {field.name for field in schema.fields}
    assert {"event_id", "session_id", "seq", "ts", "agent_action", "env_feedback", "kafka_offset"} <= names
    action = schema.find_field("agent_action").field_type
    assert isinstance(action, StructType)
    assert str({f.name: f for f in action.fields}["output_tokens"].field_type) == "long"
    assert str(schema.find_field("ts").field_type) == "timestamptz"
    ids = [f.field_id for f in schema.fields]
    assert len(ids) == len(set(ids))
