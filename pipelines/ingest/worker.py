"""The ingest worker: consume a batch, decode it, commit it to both tables, exactly once.

The rules that make it exactly once are the package's (:mod:`pipelines.ingest`); here the
three of them meet:

* on assignment a partition is positioned at the offset recorded in Iceberg
  (the lower of the two tables), never at Kafka's committed offset;
* before committing, the worker re-reads the recorded offsets and drops rows
  below them (a zombie or a replay after a crash), inside the commit retry loop,
  so a concurrent commit that wins the race is seen (:func:`~pipelines.ingest.commit.commit_rows`);
* the Iceberg commit is atomic: rows and offsets land together or not at all.

Kafka offsets are still committed afterwards, for lag monitoring only. Three threads share
the work: the main thread consumes, a decode thread waits for the decoder process, and a
commit thread commits the batch before; each records its own phase time in
``IngestStats.timings``.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from common.broker import resolve_bootstrap
from common.errors import KafkaUnavailable
from common.faults import crash_point
from common.memory import _system_allocator, release_free_memory, steady_gc
from common.progress import Progress
from common.settings import Settings
from pipelines.decode import BatchDecoder, FileTarget, with_coordinates
from pipelines.ingest.batch import Batch
from pipelines.ingest.commit import Written, commit_rows, disable_library_retries, writer_metadata
from pipelines.ingest.consumer import consumer_config
from pipelines.ingest.offsets import (
    batch_next_offsets,
    merge_offsets,
    recorded_incarnation,
    recorded_offsets,
    start_offsets,
)
from pipelines.ingest.recent_ids import RecentIds
from pipelines.ingest.rows import dead_letter_row
from pipelines.ingest.stats import IngestStats
from warehouse.catalog import open_catalog
from warehouse.errors import WarehouseError
from warehouse.lakehouse import Lakehouse
from warehouse.maintenance import tidy_tables
from warehouse.tables import DEAD_LETTERS, RAW_EVENTS, ensure_table

log = logging.getLogger("trajlake.ingest")

_DEAD_SYNC_SECONDS = 30.0
#: The worker's heap is kept between batches below this much resident memory, trimmed above it.
#: Each poll allocates ~10,000 values and ``Message`` objects on the heap and frees them at the
#: next; trimmed after every free (glibc's default 128 KB trim threshold once the mmap threshold
#: is fixed) or every batch, the same pages were faulted in again: ~0.3 faults and ~1 µs of
#: system time per event (docs/performance.md, "Ingest"). Buffers over 1 MB (a batch's values)
#: are still mapped and returned on their own, so what is kept is the heap's high-water mark.
WORKER_RETAINED_BYTES = 384 << 20
_RAW_SORT = [("session_id", "ascending"), ("seq", "ascending")]


class IngestWorker:
    """One ingest process: a member of the consumer group writing to Iceberg.

    Args:
        settings: trajlake settings.
        catalog: Iceberg catalog; opened from settings by default.
        bootstrap: Kafka bootstrap; resolved from settings by default.
        follow: the worker will tail the topic for good (``run()`` without ``until_idle``),
            so its consumer fetches politely (:func:`consumer_config`) and it commits a batch
            after a short linger (``ingest_follow_linger_seconds``, see :meth:`_batch_full`).
    """

    def __init__(
        self, settings: Settings, catalog: Catalog | None = None, bootstrap: str | None = None, follow: bool = False
    ) -> None:
        self.settings = settings
        self.follow = follow
        self.topic = settings.topic
        self.catalog = catalog or open_catalog(settings)
        self.raw_table = disable_library_retries(ensure_table(self.catalog, settings, RAW_EVENTS.name))
        self.dead_table = disable_library_retries(ensure_table(self.catalog, settings, DEAD_LETTERS.name))
        self.raw_schema = RAW_EVENTS.arrow_schema()
        self.decoder = BatchDecoder(self.raw_schema, settings.max_event_bytes)
        self.dead_schema = DEAD_LETTERS.arrow_schema()
        self.bootstrap = bootstrap or resolve_bootstrap(settings)
        # bound_allocator's fixed 1 MB mmap threshold, and a heap that keeps its free pages (see above)
        _system_allocator(mmap_threshold=1 << 20, trim_threshold=1 << 30)
        self.consumer = Consumer(consumer_config(settings, self.bootstrap, follow=follow), logger=log)
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, **settings.kafka_extra})
        self.topic_id: str | None = None  # Kafka topic id of the incarnation being read; None if unknown
        self.stats = IngestStats()
        self.assigned: set[int] = set()
        self.positions: dict[int, int] = {}  # next offset to read, per assigned partition
        self._batch = Batch()
        self._stop = False
        self._closing = False
        self.recent_ids = RecentIds(settings.ingest_dedupe_window)
        self.recent_ids.warm(self.raw_table)
        self._decoding = ThreadPoolExecutor(1, thread_name_prefix="trajlake-decode")
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="trajlake-commit")
        self._inflight: Future[dict[int, int]] | None = None
        self._decoded: Future[tuple[dict[int, int], pa.Table | Written, pa.Table]] | None = None  # the last batch's
        self._dead_pending: dict[int, int] = {}  # offsets committed to raw_events but not yet to dead_letters
        self._dead_synced = time.monotonic()
        self._writer: tuple[tuple[object, ...], TableMetadata] | None = None  # see _writer_metadata
        self._upkept = time.monotonic()  # when the last upkeep round ran (see _upkeep)
        self._lake: Lakehouse | None = None

    # -- offsets -----------------------------------------------------------------

    def fetch_topic_id(self) -> str | None:
        """The broker's topic id of the current incarnation of the topic; None when it has none."""
        try:
            description = self.admin.describe_topics(TopicCollection([self.topic]))[self.topic].result(timeout=10)
        except KafkaException as exc:
            log.warning("cannot describe topic %s (reset detection by topic id is off): %s", self.topic, exc)
            return None
        topic_id = str(description.topic_id) if description.topic_id is not None else ""
        # An all-zero id (AAAAAAAAAAAAAAAAAAAAAA) is what brokers without topic ids return.
        return topic_id if topic_id.strip("A=") else None

    def _current_offsets(self, table: Table) -> dict[int, int]:
        """The table's offsets if they belong to the incarnation being read; {} (from the start) if not."""
        incarnation = recorded_incarnation(table, self.topic)
        if self.topic_id and incarnation.topic_id and incarnation.topic_id != self.topic_id:
            return {}
        return recorded_offsets(table, self.topic)

    def _start_offsets(self) -> dict[int, int]:
        return start_offsets(self._current_offsets(self.raw_table), self._current_offsets(self.dead_table))

    def _check_gaps(self, consumer: Consumer, start: dict[int, int], partitions: list[TopicPartition]) -> None:
        """Report recorded offsets outside the partition's log: below the low watermark (records lost
        before ingest), or, on a broker without topic ids, past the high watermark (log truncated)."""
        for tp in partitions:
            recorded = start.get(tp.partition)
            if not recorded:
                continue
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, tp.partition), timeout=5)
            except KafkaException as exc:
                log.warning("watermarks of %s/%d unavailable: %s", self.topic, tp.partition, exc)
                continue
            if self.topic_id is None and recorded > high:
                # Without a topic id a reset cannot be told apart from tansu's lagging high
                # watermark with certainty, so it is reported, not acted on.
                detail = {"kind": "truncated", "topic": self.topic, "partition": tp.partition, "recorded": recorded}
                detail["high"] = high
                log.warning("%s", IngestStats(reset_details=[detail]).describe_resets()[0])
                self.stats.truncations += 1
                self.stats.reset_details.append(detail)
            if recorded < low:
                detail = {
                    "kind": "gap",
                    "topic": self.topic,
                    "partition": tp.partition,
                    "recorded": recorded,
                    "low": low,
                }
                log.warning("%s", IngestStats(reset_details=[detail]).describe_resets()[0])
                self.stats.gaps += 1
                self.stats.reset_details.append(detail)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._refresh_tables()
        # Re-read on every assignment: the topic may have been recreated since the last one.
        self.topic_id = self.fetch_topic_id()
        start = self._start_offsets()
        self._check_gaps(consumer, start, partitions)
        for tp in partitions:
            tp.offset = start.get(tp.partition, OFFSET_BEGINNING)
            self.assigned.add(tp.partition)
            self.positions[tp.partition] = max(tp.offset, 0)
        log.info("assigned %s (topic id %s)", {tp.partition: tp.offset for tp in partitions}, self.topic_id)
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Finish what we hold before the partitions move; the offset check makes this safe either way.
        # Not once the worker is closing (the consumer's close revokes too): after a failure that
        # would retry the failed commit and hide its error; the next owner re-reads from Iceberg.
        if not self._closing:
            self.flush()
        self.assigned -= {tp.partition for tp in partitions}

    # -- batching ----------------------------------------------------------------

    def _batch_full(self) -> bool:
        """Whether to hand the batch on now: it is full (rows, bytes), or old enough.

        Following, a batch is old enough after ``ingest_follow_linger_seconds`` (not
        ``ingest_max_seconds``) so that an event is queryable about a second after it is sent,
        but only once the batch before it is decoded: it is then decoded while that one
        commits, the cadence is one commit after another, never more than the catalog
        sustains, and the batch grows while it waits.
        """
        batch = self._batch
        if not batch.ends:
            return False
        if len(batch.ends) >= self.settings.ingest_max_rows or batch.n_bytes >= self.settings.ingest_max_bytes:
            return True
        age = time.monotonic() - batch.started
        if age >= self.settings.ingest_max_seconds:
            return True
        return (
            self.follow
            and age >= self.settings.ingest_follow_linger_seconds
            and (self._decoded is None or self._decoded.done())
        )

    def _next_batch(self) -> Batch:
        """The batch after the one being cut now.

        Following, its linger runs from this cut, not from its first poll, which comes only once the
        commit before is done (:meth:`flush` waits for it): the records that arrive meanwhile have been
        waiting since, so waiting for the commit and for the linger overlap instead of adding up.
        """
        return Batch(opened=time.monotonic() if self.follow else 0.0)

    def _add(self, message: Message) -> None:
        self._add_many([message])

    def _add_many(self, messages: list[Message]) -> None:
        """Add the records among ``messages`` to the batch (errors are logged, partition EOFs ignored)."""
        if self._batch.add(messages, self.positions) and self.stats.timings.first_record_at is None:
            self.stats.timings.first_record_at = time.perf_counter()

    def _refresh_tables(self) -> None:
        self.raw_table = self.raw_table.refresh()
        self.dead_table = self.dead_table.refresh()

    def decode_batch(self, batch: Batch, write: bool = False) -> tuple[pa.Table | Written, pa.Table]:
        """Decode a batch into raw-events rows and dead-letter rows (Arrow, table-shaped).

        Decodes the whole batch at once (pipelines.decode), events sorted by (session, seq);
        both tables carry the Kafka coordinates of every row in ``kafka_partition`` /
        ``kafka_offset``. With ``write``, the decoder process writes the events as
        ``raw_events`` data files, and only the files and the rows' keys come back
        (``Written``), unless the batch had to be decoded here.
        """
        now = datetime.now(UTC)
        partitions = np.frombuffer(batch.partitions, dtype=np.int32)
        offsets = np.frombuffer(batch.offsets, dtype=np.int64)
        timestamps = np.frombuffer(batch.timestamps, dtype=np.int64)
        target = None
        if write:
            table = self.raw_table
            target = FileTarget(
                self._writer_metadata(table.metadata),
                dict(table.io.properties),
                self.topic,
                partitions,
                offsets,
                now,
                timestamps,
            )
        decoded = self.decoder.decode_array(batch.values(), sort_by=_RAW_SORT, write=target)
        if decoded.files is not None:
            events: pa.Table | Written = Written(decoded.files, decoded.events)
        else:
            events = with_coordinates(
                decoded.events,
                self.raw_schema,
                self.topic,
                pa.array(partitions),
                pa.array(offsets),
                now,
                pa.array(timestamps),
            )
        dead_rows = [
            dead_letter_row(batch, index, self.topic, exc.reason, str(exc), now) for index, exc in decoded.dead
        ]
        return events, pa.Table.from_pylist(dead_rows, schema=self.dead_schema)

    def _writer_metadata(self, metadata: TableMetadata) -> TableMetadata:
        """What the decoder process needs of ``metadata`` to write data files, in objects of its own.

        The request is pickled on another thread while the commit thread works on the table,
        and pyiceberg's schemas and specs fill caches in their ``__dict__`` as they are used: a
        pickle of the table's own objects can meet a dictionary that changes size ("dictionary
        changed size during iteration", then a request that never arrives and a 10 s stall,
        frequent at a follower's commit cadence). So the schema and spec come from a table
        loaded for this alone (again only when they change), and only the properties, a dict
        pyiceberg replaces rather than changes, are taken from ``metadata``.
        """
        key = (metadata.location, metadata.current_schema_id, metadata.default_spec_id, metadata.last_column_id)
        if self._writer is None or self._writer[0] != key:
            own = self.catalog.load_table(self.raw_table.name()).metadata
            self._writer = (key, writer_metadata(own))
        return self._writer[1].model_copy(update={"properties": dict(metadata.properties)})

    # -- committing ----------------------------------------------------------------

    def _commit_table(
        self,
        load: Callable[[], Table],
        rows: pa.Table | Written,
        next_offsets: dict[int, int],
        sort_keys: list[tuple[str, str]],
        recent: RecentIds | None = None,
    ) -> tuple[Table, int, int]:
        """Append the rows not yet recorded, with offsets (:func:`~pipelines.ingest.commit.commit_rows`).

        Returns the table after the commit, rows written and rows dropped (already recorded or re-sent).
        """
        started = time.perf_counter()
        try:
            return commit_rows(
                load,
                rows,
                next_offsets,
                sort_keys,
                topic=self.topic,
                topic_id=self.topic_id,
                stats=self.stats,
                reset_dedupe_records=self.settings.reset_dedupe_records,
                recent=recent,
            )
        finally:
            self.stats.timings.commit_s += time.perf_counter() - started

    def _decode(self, batch: Batch) -> tuple[dict[int, int], pa.Table | Written, pa.Table]:
        """Decode one batch: its next offsets, raw-events rows and dead-letter rows.

        Runs on the decode thread, which only waits for the decoder process, while the
        commit thread commits the batch before.
        """
        started = time.perf_counter()
        partitions = np.frombuffer(batch.partitions, dtype=np.int32)
        offsets = np.frombuffer(batch.offsets, dtype=np.int64)
        next_offsets = batch_next_offsets(partitions, offsets)
        good, dead = self.decode_batch(batch, write=self.decoder.isolate)
        batch.data, batch.keys = bytearray(), []  # the batch's bytes go as soon as it is decoded
        self.stats.timings.decode_s += time.perf_counter() - started
        return next_offsets, good, dead

    def _process(
        self, batch: Batch, decoding: Future[tuple[dict[int, int], pa.Table | Written, pa.Table]]
    ) -> dict[int, int]:
        """Commit one decoded batch to dead_letters and raw_events; returns its next offsets.

        Runs on the commit thread while the main thread consumes the next batch and the
        decode thread decodes it. ``dead_letters`` is committed when the batch has dead
        letters, every ``_DEAD_SYNC_SECONDS`` and on a waiting flush (see :meth:`flush`):
        its offsets only bound where a restart begins reading (the lower of the two
        tables), and raw_events drops what it already holds, so a lagging dead-letter
        offset costs a bounded re-read, never a duplicate.
        """
        next_offsets, good, dead = decoding.result()
        crash_point("before_commit")
        self._dead_pending.update(merge_offsets(self._dead_pending, next_offsets))
        if dead.num_rows or time.monotonic() - self._dead_synced >= _DEAD_SYNC_SECONDS:
            # Dead letters first: if we die between the two commits, raw events' lower offsets
            # make the replay start early, and the dead-letter offsets drop the repeats.
            self._commit_dead(dead)
        crash_point("between_table_commits")
        self.raw_table, n_good, skipped = self._commit_table(
            self.raw_table.refresh, good, next_offsets, [], self.recent_ids
        )
        crash_point("after_iceberg_commit")
        self.stats.events += n_good
        self.stats.skipped += skipped
        self.stats.batches += 1
        self.stats.bytes += batch.n_bytes
        for reason in dead.column("reason").to_pylist():
            self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1
        log.info("batch %d: %d events, %d dead letters, %d skipped", self.stats.batches, n_good, dead.num_rows, skipped)
        del good, dead
        release_free_memory(above=WORKER_RETAINED_BYTES)
        self.stats.timings.last_commit_at = time.perf_counter()
        self._upkeep()
        return next_offsets

    def _upkeep(self) -> None:
        """Following, every ``ingest_follow_upkeep_seconds``: expire raw_events' and dead_letters'
        snapshots older than ``ingest_follow_retention_seconds``, and with ``ingest_follow_compact``
        compact the small files this worker's commits left (:func:`~warehouse.maintenance.tidy_tables`).

        A commit a second adds a data file, a snapshot and ~0.8 kB of table metadata that every
        later commit rewrites; left to a nightly ``trajlake maintain`` that is ~150k snapshots and
        a 100 MB metadata file a day. It runs on the commit thread after a batch's commits, so it
        never races this worker's own commits (a peer's commit that wins is re-planned against),
        and the main thread goes on consuming meanwhile; but the next commit waits for the round,
        which is why compaction, a rewrite of every small file of the day's partition, is opt-in
        (docs/performance.md, "Freshness"). Offsets survive expiry: they are in the
        table properties as well as in snapshot summaries (:func:`recorded_offsets`). A round
        that cannot run (lock held by ``maintain``/``tier``, conflicts) is logged and skipped.
        """
        interval = self.settings.ingest_follow_upkeep_seconds
        if not self.follow or interval <= 0 or time.monotonic() - self._upkept < interval:
            return
        started = time.monotonic()
        self._upkept = started
        upkeep = self.stats.upkeep
        older_than = datetime.now(UTC) - timedelta(seconds=self.settings.ingest_follow_retention_seconds)
        try:
            if self._lake is None:
                self._lake = Lakehouse.open(self.settings, self.catalog)
            compact = self.settings.compact_min_files if self.settings.ingest_follow_compact else None
            reports = tidy_tables(self._lake, (RAW_EVENTS.name, DEAD_LETTERS.name), older_than, compact)
        except (WarehouseError, OSError) as exc:  # lock busy, conflicts, storage: the next round tries again
            upkeep.skipped += 1
            log.warning("table upkeep skipped: %s", exc)
            return
        finally:
            upkeep.seconds += time.monotonic() - started
        upkeep.rounds += 1
        for report in reports:
            upkeep.files_rewritten += report.files_rewritten
            upkeep.files_written += report.files_written
            upkeep.snapshots_expired += report.snapshots_expired
        upkeep.snapshots_left = reports[0].after.snapshots
        self._refresh_tables()
        log.info(
            "table upkeep in %.1f s: %s",
            time.monotonic() - started,
            "; ".join(
                f"{r.table}: {r.files_rewritten} files compacted into {r.files_written}, "
                f"{r.snapshots_expired} snapshots expired, {r.after.snapshots} left"
                for r in reports
            ),
        )

    def _commit_dead(self, dead: pa.Table) -> None:
        """Commit dead letters with the offsets of every batch processed since the last such commit."""
        self.dead_table, n_dead, _ = self._commit_table(
            self.dead_table.refresh,
            dead,
            dict(self._dead_pending),
            [("kafka_partition", "ascending"), ("kafka_offset", "ascending")],
        )
        self.stats.dead_letters += n_dead
        self._dead_pending.clear()
        self._dead_synced = time.monotonic()

    def flush(self, wait: bool = True) -> None:
        """Hand the current batch to the commit thread; with ``wait``, return once everything is committed.

        A full batch starts decoding at once (in the decoder process), while the batch
        before it is still being committed; at most one batch is being committed, one
        decoded and one read, so memory stays bounded at about three batches. A waiting
        flush (end of run, partitions revoked) also brings dead_letters' offsets up to date.
        """
        batch = self._batch
        if batch.ends:
            self._batch = self._next_batch()
            decoding = self._decoded = self._decoding.submit(self._decode, batch)
            self._wait_inflight()
            self._inflight = self._committer.submit(self._process, batch, decoding)
        if wait:
            self._wait_inflight()
            if self._dead_pending:
                self._committer.submit(self._commit_dead, self.dead_schema.empty_table()).result()

    def _wait_inflight(self) -> None:
        """Wait for the batch being committed (re-raising its error), then commit its offsets to Kafka."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        next_offsets = inflight.result()
        # For lag monitoring only: Iceberg holds the offsets that count.
        self.consumer.commit(
            offsets=[TopicPartition(self.topic, p, o) for p, o in next_offsets.items()], asynchronous=True
        )

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

    def _backlog(self) -> int:
        """Records not read yet on the assigned partitions, from the watermarks the last fetches returned."""
        left = 0
        for partition in self.assigned:
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition), cached=True)
            except KafkaException:
                continue
            left += max(0, high - self.positions.get(partition, high))
        return left

    def run(
        self, until_idle: float | None = None, join_timeout: float = 60.0, progress: Progress | None = None
    ) -> IngestStats:
        """Consume until stopped, or until caught up and idle for ``until_idle`` seconds.

        ``progress`` is told, after each fetch, of the records read and how many the partitions hold in all.

        Raises:
            KafkaUnavailable: no partition was assigned within ``join_timeout`` seconds.
        """
        with steady_gc():  # what the worker set up stays out of the collections the loop makes
            return self._run(until_idle, join_timeout, progress)

    def _run(self, until_idle: float | None, join_timeout: float, progress: Progress | None) -> IngestStats:
        started = time.monotonic()
        self.consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        last_message = time.monotonic()
        read = 0
        # A poll waits its whole timeout unless 10,000 records arrive: following, it must not
        # hold a batch much past its linger.
        timeout = min(0.2, self.settings.ingest_follow_linger_seconds / 5) if self.follow else 0.2
        try:
            while not self._stop:
                polled = time.perf_counter()
                messages = self.consumer.consume(num_messages=10_000, timeout=timeout)
                self._add_many(messages)
                self.stats.timings.consume_s += time.perf_counter() - polled
                if messages:
                    last_message = time.monotonic()
                    if progress is not None:
                        read += len(messages)
                        progress(read, read + self._backlog(), "events")
                if self._batch_full() or (not messages and self._batch.ends):
                    self.flush(wait=False)
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
            self._closing = True
            self._decoding.shutdown(wait=True)
            self._committer.shutdown(wait=True)  # an in-flight commit finishes (or fails) before we close
            self.consumer.close()
            self.decoder.close()
            self.stats.seconds = time.monotonic() - started
        return self.stats


def run_ingest(
    settings: Settings, until_idle: float | None = None, follow: bool = False, progress: Progress | None = None
) -> IngestStats:
    """Run one ingest worker; ``follow`` runs until SIGTERM/SIGINT finishes the batch; ``progress``: see ``run``."""
    worker = IngestWorker(settings, follow=follow)
    if follow:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        return worker.run(progress=progress)
    return worker.run(until_idle=until_idle if until_idle is not None else 5.0, progress=progress)
