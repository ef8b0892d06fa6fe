"""Zombies and concurrency: stale batches and racing commits never write an offset twice."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from common.settings import Settings
from pipelines.ingest import IngestWorker, event_row, recorded_offsets
from schemas.registry import decode_event, encode_event
from tests.helpers import hold_everything, produce, sample_events
from warehouse.query import run_query
from warehouse.tables import RAW_EVENTS

pytestmark = pytest.mark.integration


def counts(settings: Settings) -> tuple[int, int]:
    return run_query(settings, "SELECT count(*), count(DISTINCT event_id) FROM events")[1][0]


@pytest.mark.slow
def test_stale_worker_flushing_after_losing_its_partitions_adds_only_what_is_new(kafka_settings: Settings) -> None:
    first, second = sample_events(8, seed=11), sample_events(4, seed=12)
    produce(kafka_settings, first)
    zombie = IngestWorker(kafka_settings)
    try:
        hold_everything(zombie, len(first))
        # The group moves on: a live worker ingests and commits the same partitions.
        live = IngestWorker(kafka_settings).run(until_idle=1)
        assert live.events == len(first)
        produce(kafka_settings, second)
        hold_everything(zombie, len(first) + len(second))
        zombie.flush()  # the stale batch: everything the live worker committed, plus newer records
    finally:
        zombie.consumer.close()
    assert (zombie.stats.events, zombie.stats.skipped) == (len(second), len(first))
    total = len(first) + len(second)
    assert counts(kafka_settings) == (total, total)
    again = IngestWorker(kafka_settings).run(until_idle=1)
    assert (again.events, again.skipped) == (0, 0)
    assert counts(kafka_settings) == (total, total)


def rows_for(events: list[dict], partition: int, first_offset: int) -> list[tuple[int, int, dict]]:
    now = datetime.now(UTC)
    return [
        (partition, first_offset + i, event_row(decode_event(encode_event(e)), "t", partition, first_offset + i, now))
        for i, e in enumerate(events)
    ]


def commit_concurrently(workers: list[IngestWorker], batches: list[list[tuple[int, int, dict]]]) -> None:
    """Each worker commits its batch at the same moment (a barrier), so SQLite commits collide."""
    barrier = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def commit(worker: IngestWorker, rows: list[tuple[int, int, dict]]) -> None:
        try:
            next_offsets: dict[int, int] = {}
            for partition, offset, _ in rows:
                next_offsets[partition] = max(next_offsets.get(partition, 0), offset + 1)
            barrier.wait()
            table = pa.Table.from_pylist([row for _, _, row in rows], schema=worker.raw_schema)
            worker.raw_table, written, skipped = worker._commit_table(worker.raw_table.refresh, table, next_offsets, [])
            worker.stats.events += written
            worker.stats.skipped += skipped
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=pair) for pair in zip(workers, batches, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors


@pytest.mark.slow
def test_racing_commits_retry_with_backoff_and_lose_nothing(settings: Settings, tansu_broker: str) -> None:
    """Four workers commit to one SQLite catalog at once, round after round; two of them race on the same rows."""
    workers = [IngestWorker(settings, bootstrap=tansu_broker) for _ in range(4)]
    events = sample_events(8, seed=13)
    per_round = 10
    rounds = len(events) // (per_round * 4)
    assert rounds >= 3
    expected_offsets: dict[int, int] = {}
    cursor = 0
    try:
        for r in range(rounds):
            batches = []
            for w in range(3):  # workers 0-2 own partitions 0-2
                batches.append(rows_for(events[cursor : cursor + per_round], w, r * per_round))
                cursor += per_round
                expected_offsets[w] = (r + 1) * per_round
            batches.append(batches[0])  # worker 3 is a zombie replaying worker 0's batch at the same moment
            commit_concurrently(workers, batches)
    finally:
        for worker in workers:
            worker.consumer.close()
    retries = sum(w.stats.commit_retries for w in workers)
    written = sum(w.stats.events for w in workers)
    skipped = sum(w.stats.skipped for w in workers)
    print(f"{rounds} rounds x 4 racing commits: {retries} retries, {written} rows, {skipped} skipped")
    assert retries > 0  # the race really happened, and was retried rather than lost
    assert written == cursor and skipped == rounds * per_round
    assert counts(settings) == (cursor, cursor)
    raw = workers[0].catalog.load_table((settings.namespace, RAW_EVENTS.name))
    assert recorded_offsets(raw, settings.topic) == expected_offsets
