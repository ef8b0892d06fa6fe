"""The producer's outage spool: bounded, crash-safe, ordered; real Kafka down for 10 s loses nothing."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from producers.errors import SpoolFullError
from producers.sdk import EventProducer
from producers.spool import LOG_NAME, Spool
from schemas.registry import decode_event
from tests.helpers import sample_events


def test_spool_round_trip_ack_and_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(5):
        spool.append(f"s{i % 2}", f"e{i}", bytes([i]) * (i + 1))
    records = spool.pending()
    assert [r.event_id for r in records] == ["e0", "e1", "e2", "e3", "e4"]
    spool.ack(records[1].end)
    spool.close()
    reopened = Spool(tmp_path)  # a restarted producer process
    assert [(r.session_id, r.event_id, r.value) for r in reopened.pending()] == [
        ("s0", "e2", b"\x02" * 3),
        ("s1", "e3", b"\x03" * 4),
        ("s0", "e4", b"\x04" * 5),
    ]
    reopened.ack(reopened.pending()[-1].end)
    assert not reopened and (tmp_path / LOG_NAME).stat().st_size == 0


def test_torn_record_from_a_crash_mid_append_is_cut_off(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append("s", "e0", b"complete")
    spool.append("s", "e1", b"torn-in-half")
    spool.close()
    log = tmp_path / LOG_NAME
    log.write_bytes(log.read_bytes()[:-5])
    reopened = Spool(tmp_path)
    assert [r.event_id for r in reopened.pending()] == ["e0"]
    reopened.append("s", "e2", b"next")  # appends after the valid prefix, not after the torn bytes
    assert [r.event_id for r in reopened.pending()] == ["e0", "e2"]


def test_full_spool_is_back_pressure_with_a_clear_error(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=100)
    spool.append("s", "e0", b"x" * 50)
    with pytest.raises(SpoolFullError, match=r"full .*e1 of session s"):
        spool.append("s", "e1", b"x" * 50)
    spool.ack(spool.pending()[0].end)
    spool.append("s", "e1", b"x" * 50)  # room again once Kafka took the earlier events


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[dict]:
    """Every event on ``topic`` in partition order (stops at ``expected`` or after ``timeout``)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while len(events) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                value = message.value()
                if message.error() is None and value is not None:
                    events.append(decode_event(value))
    finally:
        consumer.close()
    return events


def assert_exactly_once_in_session_order(received: list[dict], sent: list[dict]) -> None:
    assert sorted(e["event_id"] for e in received) == sorted(e["event_id"] for e in sent)
    seqs: dict[str, list[int]] = {}
    for event in received:
        seqs.setdefault(event["session_id"], []).append(event["seq"])
    assert all(s == sorted(s) for s in seqs.values()), "a session's events arrived out of order"


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.kafka
def test_kafka_down_while_producing_loses_nothing_and_keeps_session_order(private_kafka, tmp_path: Path) -> None:
    from common.broker import ensure_topic

    topic = f"outage-{uuid.uuid4().hex[:8]}"
    ensure_topic(private_kafka.bootstrap, topic, 4)
    events = sample_events(120)
    producer = EventProducer(private_kafka.bootstrap, topic, "host", spool_dir=tmp_path / "spool")
    stop_at = len(events) // 3
    for event in events[:stop_at]:
        producer.emit(event)
    # Delivered before the broker stops: an event in flight when it dies waits out librdkafka's
    # message timeout (5 min) before it fails over to the spool — not lost, but not this test's subject.
    producer.flush(60)
    private_kafka.stop()

    def emit_rest() -> None:  # the rest during the outage, sessions continued
        for event in events[stop_at:]:
            producer.emit(event)
            time.sleep(0.05)

    emitter = threading.Thread(target=emit_rest)
    emitter.start()
    # The broker stays down until every event was emitted and the producer has spooled some (the point the
    # code reaches when it sees the outage), however long that takes on a loaded machine: not a fixed 10 s.
    deadline = time.monotonic() + 300
    while emitter.is_alive() or producer.spooled == 0:
        assert time.monotonic() < deadline, f"after 300 s: emitter alive {emitter.is_alive()}, spooled 0"
        time.sleep(0.1)
    spooled_during_outage = producer.spooled
    private_kafka.start()
    emitter.join()
    producer.close(120)
    assert spooled_during_outage > 0, "the outage never reached the spool"
    assert_exactly_once_in_session_order(read_topic(private_kafka.bootstrap, topic, len(events)), events)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.kafka
def test_restarted_producer_delivers_what_the_previous_process_spooled(private_kafka, tmp_path: Path) -> None:
    from common.broker import ensure_topic

    topic = f"restart-{uuid.uuid4().hex[:8]}"
    ensure_topic(private_kafka.bootstrap, topic, 4)
    events = sample_events(20)
    private_kafka.stop()
    first = EventProducer(private_kafka.bootstrap, topic, "host", spool_dir=tmp_path / "spool")
    for event in events[:150]:
        first.emit(event)
    first.close(3)  # Kafka is down: the events stay on disk
    assert len(Spool(tmp_path / "spool")) == min(150, len(events))
    private_kafka.start()
    second = EventProducer(private_kafka.bootstrap, topic, "host", spool_dir=tmp_path / "spool")
    for event in events[150:]:
        second.emit(event)
    second.close(60)
    assert_exactly_once_in_session_order(read_topic(private_kafka.bootstrap, topic, len(events)), events)
    assert not Spool(tmp_path / "spool")
