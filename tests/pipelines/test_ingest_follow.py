"""``ingest --follow``: an event becomes queryable through ``events`` without waiting for a full batch."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest

from common.broker import resolve_bootstrap
from common.settings import Settings
from pipelines.ingest import IngestWorker, Written
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


@contextmanager
def _following(
    settings: Settings,
) -> Iterator[tuple[IngestWorker, list[str], threading.Thread, Callable[[], None]]]:
    """A following worker and a producer thread streaming to it.

    Yields the worker, the event ids sent so far, the producer thread and a call that stops sending.
    """
    worker = IngestWorker(settings, follow=True)
    stop, sent = threading.Event(), list[str]()
    producer = threading.Thread(target=_stream, args=(settings, stop, sent))
    ingest = threading.Thread(target=worker.run)
    ingest.start()
    producer.start()

    def stop_sending() -> None:
        stop.set()
        producer.join(60)

    try:
        yield worker, sent, producer, stop_sending
    finally:
        stop_sending()
        worker.stop()
        ingest.join(60)


def _visible(settings: Settings, event_id: str) -> bool:
    """Whether ``trajlake sql``'s path (its process, the cached view plan) finds ``event_id`` in ``events``."""
    return run_query(settings, f"SELECT count(*) FROM events WHERE event_id = '{event_id}'")[1] == [(1,)]


@pytest.mark.slow
def test_follow_makes_events_queryable_with_no_full_batch_while_records_arrive(kafka_settings: Settings) -> None:
    # Batches that never fill and never age out: the linger, or a poll that comes back empty
    # (on a loaded host one can, between the stream's sends), commits them. The policy itself,
    # that only the linger cuts a batch while records flow, is the next test's.
    settings = kafka_settings.model_copy(
        update={
            "ingest_max_rows": 10_000_000,
            "ingest_max_bytes": 1 << 40,
            "ingest_max_seconds": 3600.0,
            # Fetches answered every ~10 ms: a poll (0.1 s) comes back empty only in a gap of the stream.
            "kafka_extra": {**kafka_settings.kafka_extra, "fetch.wait.max.ms": "10", "fetch.min.bytes": "1"},
        }
    )
    with _following(settings) as (worker, sent, producer, stop_sending):
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
        stop_sending()
        # The rest lands too, without stopping the worker: every event sent, exactly once.
        deadline = time.monotonic() + 60
        while not _visible(settings, sent[-1]) and time.monotonic() < deadline:
            time.sleep(0.5)
        total, distinct = run_query(settings, "SELECT count(*), count(DISTINCT event_id) FROM events")[1][0]
        assert total == distinct == len(sent)


class _Record:
    """What ``Batch.add`` reads of a consumed record (a ``confluent_kafka.Message``)."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return b"value"

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def key(self) -> bytes:
        return b"session"


def _records(*offsets: int) -> list[Any]:
    return [_Record(offset) for offset in offsets]


def test_a_batch_opened_at_a_cut_is_as_old_as_the_cut_when_its_first_record_comes() -> None:
    from pipelines.ingest.batch import Batch

    opened = time.monotonic() - 2.0
    batch, unopened = Batch(opened=opened), Batch()
    before = time.monotonic()
    assert batch.add(_records(0), {}) == unopened.add(_records(0), {}) == 1
    assert batch.started == opened and unopened.started >= before
    batch.add(_records(1), {})
    assert batch.started == opened  # the first record's, kept


def _close(worker: IngestWorker) -> None:
    worker._decoding.shutdown()
    worker._committer.shutdown()
    worker.consumer.close()
    worker.decoder.close()


@pytest.mark.slow
def test_only_a_follower_cuts_a_batch_at_its_linger_and_only_once_the_one_before_is_decoded(
    kafka_settings: Settings,
) -> None:
    settings = kafka_settings.model_copy(update={"ingest_max_seconds": 3600.0, "ingest_follow_linger_seconds": 0.5})
    follower, catching_up = IngestWorker(settings, follow=True), IngestWorker(settings)
    try:
        for worker in (follower, catching_up):
            assert not worker._batch_full()  # nothing to commit
            worker._batch.ends.append(100)  # one record of 100 bytes...
            worker._batch.started = time.monotonic() - 0.1
            assert not worker._batch_full()  # ...younger than the linger
            worker._batch.started = time.monotonic() - 1.0
        assert follower._batch_full() and not catching_up._batch_full()
        decoding: Future[tuple[dict[int, int], pa.Table | Written, pa.Table]] = Future()
        follower._decoded = decoding
        assert not follower._batch_full()  # the batch grows while the one before is decoded
        decoding.set_result(({}, pa.table({}), pa.table({})))
        assert follower._batch_full()
        follower._decoded = None
        catching_up._batch.started = time.monotonic() - 3600
        assert catching_up._batch_full()  # the batch-mode bound still holds
        # The next batch: a follower's linger counts from the cut, a batch-mode worker's from its first record.
        cut = time.monotonic()
        following, batch_mode = follower._next_batch(), catching_up._next_batch()
        for batch in (following, batch_mode):
            batch.add(_records(7), {})
        assert cut <= following.started < batch_mode.started
    finally:
        _close(follower)
        _close(catching_up)


@pytest.mark.slow
def test_a_follower_keeps_its_snapshots_bounded_and_every_event_lands_once(kafka_settings: Settings) -> None:
    # Upkeep after every commit that is a second past the last round, keeping no old snapshot,
    # compacting any two small files; no recent-id window, so only the recorded offsets (which
    # must survive the expiry of the snapshots that carried them) keep a restart exactly once.
    settings = kafka_settings.model_copy(
        update={
            "ingest_follow_linger_seconds": 0.1,
            "ingest_follow_upkeep_seconds": 1.0,
            "ingest_follow_retention_seconds": 0.0,
            "ingest_follow_compact": True,
            "compact_min_files": 2,
            "ingest_dedupe_window": 0,
        }
    )
    with _following(settings) as (worker, sent, producer, stop_sending):
        deadline = time.monotonic() + 120
        while worker.stats.upkeep.rounds < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        stop_sending()
        deadline = time.monotonic() + 60
        while not _visible(settings, sent[-1]) and time.monotonic() < deadline:
            time.sleep(0.5)
    upkeep = worker.stats.upkeep
    assert upkeep.rounds >= 3, upkeep
    assert upkeep.files_rewritten > upkeep.files_written > 0, upkeep  # small files were compacted
    assert upkeep.snapshots_expired > 0 and upkeep.snapshots_left == 1, upkeep  # only the current one stays
    raw = worker.raw_table.refresh()
    assert len(raw.snapshots()) < worker.stats.batches  # without upkeep: one snapshot per batch
    total, distinct = run_query(settings, "SELECT count(*), count(DISTINCT event_id) FROM events")[1][0]
    assert total == distinct == len(sent)

    # A restart resumes from the offsets the expired snapshots carried (kept in the table's
    # properties): the events sent since land, none of the earlier ones a second time.
    late = EventProducer(resolve_bootstrap(settings), settings.topic, "follow-host")
    for event in sample_events(1)[:10]:
        fresh = {**event, "event_id": uuid.uuid4().hex}
        late.emit(fresh)
        sent.append(fresh["event_id"])
    late.flush(30)
    restarted = IngestWorker(settings)
    restarted.run(until_idle=2.0)
    assert restarted.stats.events == 10
    total, distinct = run_query(settings, "SELECT count(*), count(DISTINCT event_id) FROM events")[1][0]
    assert total == distinct == len(sent)
