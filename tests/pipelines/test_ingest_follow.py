"""``ingest --follow``: an event becomes queryable through ``events`` without waiting for a full batch."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from common.broker import resolve_bootstrap
from common.settings import Settings
from pipelines.ingest import IngestWorker
from producers.sdk import EventProducer
from tests.helpers import sample_events
from warehouse.query import run_query

pytestmark = pytest.mark.integration


def _stream(settings: Settings, stop: threading.Event, sent: list[str]) -> None:
    """Send events at ~1,000/s until ``stop``, each with a new event id (ids into ``sent``)."""
    producer = EventProducer(resolve_bootstrap(settings), settings.topic, "follow-host")
    base = sample_events(3)
    while not stop.is_set():
        for event in base[:10]:
            fresh = {**event, "event_id": uuid.uuid4().hex}
            producer.emit(fresh)
            sent.append(fresh["event_id"])
        time.sleep(0.01)
    producer.flush(30)


def _visible(settings: Settings, event_id: str) -> bool:
    """Whether ``trajlake sql``'s path (its process, the cached view plan) finds ``event_id`` in ``events``."""
    return run_query(settings, f"SELECT count(*) FROM events WHERE event_id = '{event_id}'")[1] == [(1,)]


@pytest.mark.slow
def test_follow_commits_after_its_linger_while_records_keep_arriving(kafka_settings: Settings) -> None:
    # Batches that never fill and never age out: only the follower's linger can commit one
    # (records arrive all the time, so no poll comes back empty either).
    settings = kafka_settings.model_copy(
        update={"ingest_max_rows": 10_000_000, "ingest_max_bytes": 1 << 40, "ingest_max_seconds": 3600.0}
    )
    worker = IngestWorker(settings, follow=True)
    stop, sent = threading.Event(), list[str]()
    producer = threading.Thread(target=_stream, args=(settings, stop, sent))
    ingest = threading.Thread(target=worker.run)
    ingest.start()
    producer.start()
    try:
        deadline = time.monotonic() + 60  # the group join, then a generous bound
        while not sent and time.monotonic() < deadline:
            time.sleep(0.1)
        first = sent[0]
        # Each query replays the view plan the one before saved while no table moved: the
        # plan made before the first commit must not hide it.
        while not _visible(settings, first) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _visible(settings, first), "the first event was not queryable within 60 s"
        assert producer.is_alive() and worker.stats.batches >= 1
        stop.set()
        producer.join(60)
        # The rest lands too, without stopping the worker: every event sent, exactly once.
        deadline = time.monotonic() + 60
        while not _visible(settings, sent[-1]) and time.monotonic() < deadline:
            time.sleep(0.5)
        total, distinct = run_query(settings, "SELECT count(*), count(DISTINCT event_id) FROM events")[1][0]
        assert total == distinct == len(sent)
    finally:
        stop.set()
        producer.join(60)
        worker.stop()
        ingest.join(60)
