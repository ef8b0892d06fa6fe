"""Committing a batch to one Iceberg table, exactly once: rows and next offsets in one atomic commit.

Before committing, the rows below the offsets the table records are dropped (a zombie or a
replay after a crash), inside the commit retry loop, so a concurrent commit that wins the
race is seen; the Iceberg commit is atomic, so rows and offsets land together or not at
all, and pyiceberg's own retry, which would re-apply the append without that re-read, is
turned off on ingest's tables (:func:`disable_library_retries`).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import In, Reference
from pyiceberg.expressions.literals import literal
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from pipelines.ingest.offsets import (
    Incarnation,
    advanced_offsets,
    dumps_offsets,
    incarnation_key,
    merge_offsets,
    offsets_key,
    per_row,
    recorded_incarnation,
    recorded_offsets,
    recorded_reset,
    reset_key,
    unrecorded_rows,
)
from pipelines.ingest.recent_ids import RecentIds, recent_keys
from pipelines.ingest.stats import IngestStats
from warehouse.errors import CommitConflict
from warehouse.tables import RAW_EVENTS
from warehouse.transactions import transaction

log = logging.getLogger("trajlake.ingest")

# pyiceberg >= 0.12 retries a conflicting append itself by re-applying it to the new
# table state; for ingest that replay would bypass the offset filter (a zombie's
# stale rows would land after all), so ingest's tables turn it off and the
# worker's own loop re-reads the offsets on every attempt.
# Every append adds a manifest, and every commit rewrites the manifest list naming all of
# them (and every query plans through all of them): at a follower's cadence of a commit a
# second, a fast append's table has thousands within the hour and each commit costs more
# than the last. A merging append folds them into one once 100 have gathered.
_NO_LIBRARY_RETRY = {
    "commit.retry.num-retries": "0",
    "commit.manifest-merge.enabled": "true",
    "commit.manifest.min-count-to-merge": "100",
}


def disable_library_retries(table: Table) -> Table:
    """Make ``table`` surface commit conflicts to the caller instead of re-applying the append
    (and merge its manifests once 100 have gathered, see ``_NO_LIBRARY_RETRY``).

    Raises:
        CommitConflict: the property could not be set (the table keeps changing under us).
    """
    for _ in range(10):
        if all(table.properties.get(k) == v for k, v in _NO_LIBRARY_RETRY.items()):
            return table
        try:
            with transaction(table) as tx:
                tx.set_properties(_NO_LIBRARY_RETRY)
        except CommitFailedException:
            time.sleep(0.05 * (1 + random.random()))
        table = table.refresh()
    raise CommitConflict(f"could not set {_NO_LIBRARY_RETRY} on {table.name()}")


@dataclass
class Written:
    """Raw events the decoder process already wrote as data files, not yet committed."""

    files: list[DataFile]
    keys: pa.Table  # KEY_COLUMNS of every row in the files


#: Codec of the files ingest writes (the hot tier). LZ4 encodes a batch of raw events ~0.5 µs per
#: event cheaper than the tables' zstd, for files ~1.8x larger; ``trajlake maintain`` rewrites them
#: with the table's own codec when it compacts or tiers them (docs/performance.md, "Ingest").
HOT_CODEC = "lz4"


def writer_metadata(metadata: TableMetadata) -> TableMetadata:
    """``metadata`` without its history, writing the hot tier's codec: what the decoder writes files with."""
    properties = {**metadata.properties, "write.parquet.compression-codec": HOT_CODEC}
    return metadata.model_copy(
        update={
            "snapshots": [],
            "snapshot_log": [],
            "metadata_log": [],
            "refs": {},
            "current_snapshot_id": None,
            "properties": properties,
        }
    )


def _coordinates(rows: pa.Table) -> pa.Array:
    """One int64 per row identifying its Kafka record within a batch: partition and offset."""
    partitions = rows.column("kafka_partition").to_numpy().astype(np.int64)
    return pa.array((partitions << 48) | rows.column("kafka_offset").to_numpy())


def _delete_files(table: Table, files: Sequence[DataFile]) -> None:
    for data_file in files:
        try:
            table.io.delete(data_file.file_path)
        except OSError as exc:  # an orphan at worst: maintenance removes it
            log.warning("could not delete unused data file %s: %s", data_file.file_path, exc)


def _reset_detail(table: Table, topic: str, incarnation: Incarnation, topic_id: str) -> dict[str, Any]:
    """The record of a topic reset: ``table``'s offsets belong to another life of the topic."""
    return {
        "kind": "reset",
        "table": ".".join(table.name()),
        "topic": topic,
        "epoch": incarnation.epoch + 1,
        "previous_topic_id": incarnation.topic_id,
        "topic_id": topic_id,
        "previous_offsets": {str(p): o for p, o in sorted(recorded_offsets(table, topic).items())},
        "detected_at": datetime.now(UTC).isoformat(),
    }


def commit_rows(
    load: Callable[[], Table],
    rows: pa.Table | Written,
    next_offsets: dict[int, int],
    sort_keys: list[tuple[str, str]],
    *,
    topic: str,
    topic_id: str | None,
    stats: IngestStats,
    reset_dedupe_records: int,
    recent: RecentIds | None = None,
) -> tuple[Table, int, int]:
    """Append the rows not yet recorded, with offsets, retrying commit conflicts.

    ``rows`` is shaped like the table and carries ``kafka_partition`` and
    ``kafka_offset``, or is already written as data files (``Written``: the files
    and the key columns of their rows). Everything that decides what is new (offsets,
    incarnation, reset window) is re-read from the table inside the retry loop, so a
    peer's commit that wins the race is honoured. Written files are committed as they
    are when every row is new (the usual case); otherwise the new rows are read back
    and written again, and the files are deleted once that commit holds.

    Args:
        load: returns the table as it is now (called on every attempt).
        rows: the batch's rows for this table.
        next_offsets: the batch's next offset per partition.
        sort_keys: order to write ``rows`` in (when they are a table).
        topic: Kafka topic of the batch.
        topic_id: Kafka topic id of the incarnation being read; None if the broker has none.
        stats: where commit retries, resets and dropped duplicates are counted.
        reset_dedupe_records: records per partition after a reset checked against ingested event ids.
        recent: the recent-id window (raw events only): re-sent events are dropped, kept ones remembered.

    Returns:
        The table after the commit, rows written and rows dropped (already recorded or re-sent).

    Raises:
        CommitConflict: 12 attempts in a row lost the race.
    """
    delay = 0.05
    key, inc_key = offsets_key(topic), incarnation_key(topic)
    if isinstance(rows, pa.Table) and sort_keys and rows.num_rows:
        rows = rows.sort_by(sort_keys)  # once: filtering below keeps the order
    keys = rows.keys if isinstance(rows, Written) else rows
    partitions = keys.column("kafka_partition").to_numpy()
    offsets = keys.column("kafka_offset").to_numpy()
    for attempt in range(12):
        table = load()
        incarnation = recorded_incarnation(table, topic)
        reset: dict[str, Any] | None = None
        window: dict[str, Any] | None
        if topic_id and incarnation.topic_id and incarnation.topic_id != topic_id:
            # The table's offsets belong to another life of the topic: they mean nothing here.
            reset = _reset_detail(table, topic, incarnation, topic_id)
            recorded: dict[int, int] = {}
            incarnation = Incarnation(reset["epoch"], topic_id)
            window = reset
        else:
            recorded = recorded_offsets(table, topic)
            incarnation = Incarnation(incarnation.epoch, topic_id or incarnation.topic_id)
            window = recorded_reset(table, topic)
            if window is not None and window.get("epoch") != incarnation.epoch:
                window = None
        advanced = advanced_offsets(next_offsets, recorded)
        if not advanced:  # everything here was committed already (by us before a crash, or a peer)
            if isinstance(rows, Written):
                _delete_files(table, rows.files)
            return table, 0, keys.num_rows
        keep = unrecorded_rows(partitions, offsets, recorded)
        n_fresh = int(keep.sum())
        if window and n_fresh:
            fresh = keys.filter(pa.array(keep))
            keep[np.flatnonzero(keep)] &= ~_resent_before_reset(table, fresh, window, reset_dedupe_records)
        resent = 0
        kept_ids: list[str] = []
        if recent is not None and keep.any():
            kept = keys.filter(pa.array(keep))
            kept_ids = recent_keys(kept.column("session_id"), kept.column("event_id"))
            unseen = recent.unseen(kept_ids)
            resent = unseen.count(False)
            if resent:
                keep[np.flatnonzero(keep)] &= np.array(unseen, dtype=bool)
                kept_ids = list(itertools.compress(kept_ids, unseen))
        n_kept = int(keep.sum())
        properties = {key: dumps_offsets(merge_offsets(recorded, advanced)), inc_key: incarnation.dumps()}
        if reset is not None:
            properties[reset_key(topic)] = json.dumps(reset)
        try:
            with transaction(table) as tx:
                if isinstance(rows, Written) and n_kept == keys.num_rows:
                    tx.append_files(rows.files, snapshot_properties=properties)
                else:
                    tx.append(_kept_rows(table, rows, keep), snapshot_properties=properties)
                tx.set_properties(properties)
        except CommitFailedException as exc:
            stats.commit_retries += 1
            log.info("commit conflict on %s (attempt %d): %s", table.name(), attempt + 1, exc)
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)
            continue
        if isinstance(rows, Written) and n_kept < keys.num_rows:
            _delete_files(table, rows.files)  # their new rows were written again and committed
        if reset is not None:
            stats.resets += 1
            stats.reset_details.append(reset)
            log.warning("%s", IngestStats(reset_details=[reset]).describe_resets()[0])
        if recent is not None:
            recent.remember(kept_ids, unseen=True)
        stats.resent_duplicates += resent
        stats.reset_duplicates += n_fresh - n_kept - resent
        return table, n_kept, keys.num_rows - n_kept
    raise CommitConflict(f"could not commit to {table.name()} after 12 attempts")


def _kept_rows(table: Table, rows: pa.Table | Written, keep: np.ndarray) -> pa.Table:
    """The rows that ``keep`` marks, as an Arrow table (read back from written files if need be)."""
    if isinstance(rows, pa.Table):
        return rows if keep.all() else rows.filter(pa.array(keep))
    if not keep.any() or not rows.files:
        return RAW_EVENTS.arrow_schema().empty_table()
    written = pa.concat_tables(pq.read_table(table.io.new_input(f.file_path).open()) for f in rows.files).cast(
        RAW_EVENTS.arrow_schema()
    )
    # Files group rows by partition value, so match rows by their Kafka coordinates.
    wanted = rows.keys.filter(pa.array(keep))
    mask = pc.is_in(_coordinates(written), value_set=_coordinates(wanted))
    return written.filter(mask)


def _resent_before_reset(table: Table, rows: pa.Table, window: dict[str, Any], reset_dedupe_records: int) -> np.ndarray:
    """Mask of ``rows`` inside the post-reset window whose event ids ``table`` already holds.

    The window is bounded: only the first records of each partition of the new
    incarnation (the previous incarnation's offset plus ``reset_dedupe_records``:
    room for a full re-send of the old history interleaved with new events) are
    checked, and only against the rows of their own sessions.
    """
    duplicate = np.zeros(rows.num_rows, dtype=bool)
    if "event_id" not in rows.column_names or table.current_snapshot() is None:
        return duplicate  # dead letters carry no event id
    previous = {int(p): int(o) + reset_dedupe_records for p, o in window.get("previous_offsets", {}).items()}
    partitions = rows.column("kafka_partition").to_numpy()
    candidate = rows.column("kafka_offset").to_numpy() < per_row(previous, partitions)
    if not candidate.any():
        return duplicate
    candidates = rows.filter(pa.array(candidate))
    sessions = sorted(set(candidates.column("session_id").to_pylist()))
    present = table.scan(
        row_filter=In(term=Reference("session_id"), literals={literal(s) for s in sessions}),
        selected_fields=("event_id",),
    ).to_arrow()
    known = pc.is_in(rows.column("event_id"), value_set=present.column("event_id").combine_chunks())
    return candidate & known.to_numpy(zero_copy_only=False)
