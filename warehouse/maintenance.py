"""Keep the lakehouse healthy: compact small files, expire snapshots, remove orphan files.

pyiceberg has no compaction, so :func:`compact_table` rewrites a partition's small
files with Arrow into sorted, non-overlapping ranges of the sort key (each at most the
target file size and a memory bound) and
swaps them in one OVERWRITE commit whose summary carries
:data:`warehouse.snapshots.REWRITE_MARKER`.

What incremental readers rely on is kept:

* ingest offsets live in the table property ``trajlake.offsets.<topic>`` as well as
  in snapshot summaries, so expiring the snapshots that carried them loses nothing;
* assembly's watermark (``trajlake.assembled-raw-snapshot`` on ``trajectories``)
  must stay an ancestor of ``raw_events``' current snapshot, or assembly rebuilds
  everything: expiry keeps that snapshot and every later one in the current
  ancestry, compaction of ``raw_events`` only rewrites files already assembled, and
  :func:`warehouse.snapshots.files_added_since` skips rewrite commits — so a
  compaction never makes assembly re-read anything;
* hot ``raw_events`` files listed as copied to cold (tiering in progress) are not
  compacted, so their rows keep the identity the union view excludes them by.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    IsNull,
    LessThan,
    Or,
    Reference,
)
from pyiceberg.expressions.literals import literal
from pyiceberg.io.pyarrow import PyArrowFileIO, _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from common.settings import Settings
from warehouse.cold import FILTERS_SINCE, TIERED_TABLES, tiered_files
from warehouse.errors import WarehouseError
from warehouse.lakehouse import Lakehouse
from warehouse.snapshots import (
    REWRITE_MARKER,
    LiveFile,
    arrow_row_bytes,
    live_files,
    read_data_files,
    size_bundles,
    snapshots_since,
)
from warehouse.tables import RAW_EVENTS, TABLES, TRAJECTORIES
from warehouse.tiering import lifecycle_lock
from warehouse.transactions import retry_on_conflict, transaction

log = logging.getLogger("trajlake.maintenance")

ASSEMBLED_SNAPSHOT = "trajlake.assembled-raw-snapshot"  # owned by pipelines.assemble; read here
#: A file below this share of the target size counts as small.
_SMALL = 0.75


@dataclass
class Usage:
    """Live data files of a table."""

    files: int = 0
    bytes: int = 0
    max_files_per_partition: int = 0
    snapshots: int = 0


@dataclass
class TableReport:
    """What maintenance did to one table."""

    table: str
    before: Usage = field(default_factory=Usage)
    after: Usage = field(default_factory=Usage)
    files_rewritten: int = 0
    files_written: int = 0
    snapshots_expired: int = 0
    orphans_removed: int = 0
    orphan_bytes: int = 0

    def as_dict(self) -> dict[str, object]:
        """Flat dict for printing and asset metadata."""
        flat: dict[str, object] = {"table": self.table}
        for prefix, usage in (("before", self.before), ("after", self.after)):
            flat.update({f"{prefix}_{k}": v for k, v in usage.__dict__.items()})
        flat.update(
            files_rewritten=self.files_rewritten,
            files_written=self.files_written,
            snapshots_expired=self.snapshots_expired,
            orphans_removed=self.orphans_removed,
            orphan_bytes=self.orphan_bytes,
        )
        return flat


def _partition_key(entry: LiveFile) -> tuple[object, ...]:
    partition = entry.data_file.partition
    return (entry.data_file.spec_id, *(partition[i] for i in range(len(partition))))


def usage(table: Table) -> Usage:
    """Files, bytes and the largest file count of any partition in the current snapshot."""
    per_partition: dict[tuple[object, ...], int] = {}
    found = Usage(snapshots=len(table.snapshots()))
    for entry in live_files(table):
        found.files += 1
        found.bytes += entry.data_file.file_size_in_bytes
        key = _partition_key(entry)
        per_partition[key] = per_partition.get(key, 0) + 1
    found.max_files_per_partition = max(per_partition.values(), default=0)
    return found


def _rewrites(
    table: Table, files: list[LiveFile], sort_by: tuple[str, ...], target: int, memory: int, row_bytes: float
) -> Iterator[pa.Table]:
    """The rows of one partition's ``files``, sorted, as the contents of the files that replace them.

    Each output holds at most about ``target`` Parquet bytes and ``memory`` Arrow bytes. With a
    sort key the outputs are *ranges* of its leading column (split at quantiles of a sample
    drawn from every file), so they do not overlap: a session's rows end up in one file, and a lookup by
    session prunes every other file by its statistics. Each range is read with a filter that
    skips the row groups of the (sorted) inputs outside it.
    """
    data_files = [f.data_file for f in files]
    rows_total = sum(f.record_count for f in data_files)
    outputs = max(
        math.ceil(rows_total * row_bytes / (memory * 0.8)),  # headroom for uneven ranges
        math.ceil(sum(f.file_size_in_bytes for f in data_files) / target),
        1,
    )
    keys = [(k, "ascending") for k in sort_by]
    if not sort_by:  # nothing to range on: bundles of neighbouring files
        for bundle in size_bundles(files, target, memory, row_bytes):
            yield read_data_files(table, [f.data_file for f in bundle])
        return
    if outputs == 1:
        rows = read_data_files(table, data_files)
        yield rows.sort_by(keys) if rows.num_rows else rows
        return
    lead = sort_by[0]
    # Quantiles of the leading key from a systematic sample of every file (one column, one file
    # at a time: ~100k values whatever the partition's size). A few whole files are not a
    # sample: a file holds the sessions of one ingest batch, and ids need not be uniform.
    stride = max(1, rows_total // 100_000)
    sample = [
        read_data_files(table, [data_file], columns=(lead,)).column(lead).drop_null()[::stride]
        for data_file in data_files
    ]
    values = pc.unique(pa.chunked_array(sample).combine_chunks()).sort().to_pylist()
    bounds = sorted({values[len(values) * i // outputs] for i in range(1, outputs)} - {values[0]} if values else set())
    for index in range(len(bounds) + 1):
        lower = bounds[index - 1] if index else None
        upper = bounds[index] if index < len(bounds) else None
        # Keyword arguments: pyiceberg's predicates take positional ones at run time, but a type
        # checker sees only their pydantic fields.
        column = Reference(lead)
        if lower is None and upper is None:
            condition: BooleanExpression = AlwaysTrue()
        elif lower is None:
            condition = Or(IsNull(term=column), LessThan(term=column, value=literal(upper)))
        elif upper is None:
            condition = GreaterThanOrEqual(term=column, value=literal(lower))
        else:
            condition = And(
                GreaterThanOrEqual(term=column, value=literal(lower)), LessThan(term=column, value=literal(upper))
            )
        rows = read_data_files(table, data_files, row_filter=condition)
        if rows.num_rows:
            yield rows.sort_by(keys)
        del rows


def compact_table(
    catalog: Catalog,
    table: Table,
    min_files: int,
    eligible: Callable[[LiveFile], bool] = lambda _: True,
    memory_bytes: int = 768 << 20,
) -> tuple[int, int]:
    """Rewrite every partition holding ``min_files`` or more small eligible files into target-size files.

    The new files are sorted by the table's sort order and split into ranges of its leading
    column (see :func:`_rewrites`), each at most the target size and ``memory_bytes`` of Arrow
    rows — which also bounds the rewrite's memory.

    Returns:
        (files removed, files written); (0, 0) when nothing needed compacting.

    Raises:
        TieringError: concurrent commits kept conflicting.
    """
    result = (0, 0)

    def attempt() -> None:
        nonlocal result
        current = catalog.load_table(table.name())
        target = int(current.properties.get("write.target-file-size-bytes", str(128 << 20)))
        groups: dict[tuple[object, ...], list[LiveFile]] = {}
        for entry in live_files(current):
            if entry.data_file.file_size_in_bytes < target * _SMALL and eligible(entry):
                groups.setdefault(_partition_key(entry), []).append(entry)
        old: list[DataFile] = []
        new: list[DataFile] = []
        for files in groups.values():
            if len(files) < min_files:
                continue
            row_bytes = arrow_row_bytes(current, files)
            # A file as large as a rewrite would make it is done: without this, files bounded by
            # memory rather than by the target would be rewritten by every run.
            files = [f for f in files if f.data_file.record_count * row_bytes < memory_bytes * _SMALL]
            if len(files) < min_files:
                continue
            new.extend(_rewritten(current, files, target, memory_bytes, row_bytes))
            old.extend(f.data_file for f in files)
        result = _swap(current, old, new)

    retry_on_conflict(f"compact {'.'.join(table.name())}", attempt)
    return result


def _rewritten(
    current: Table, files: list[LiveFile], target: int, memory_bytes: int, row_bytes: float
) -> list[DataFile]:
    """New data files holding the rows of ``files`` (one partition's), sorted and split by :func:`_rewrites`."""
    spec = TABLES.get(current.name()[-1])
    sort_by = tuple(spec.sort_by) if spec and spec.sort_by else ()
    # pyiceberg splits what it writes at the target size measured in Arrow bytes, which is
    # 10-30× the Parquet bytes here: left to it, one rewrite came out as dozens of small files.
    one_file = current.metadata.model_copy(
        update={"properties": {**current.metadata.properties, "write.target-file-size-bytes": str(1 << 60)}}
    )
    new: list[DataFile] = []
    for rows in _rewrites(current, files, sort_by, target, memory_bytes, row_bytes):
        new.extend(_dataframe_to_data_files(one_file, rows, current.io))
    return new


def _swap(current: Table, old: list[DataFile], new: list[DataFile]) -> tuple[int, int]:
    """Replace ``old`` by ``new`` in one rewrite commit (marked, so incremental readers skip it)."""
    if not old:
        return (0, 0)
    with transaction(current) as tx:
        properties = {REWRITE_MARKER: "true", "trajlake.rewrite.files": str(len(old))}
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for data_file in old:
                overwrite.delete_data_file(data_file)
            for data_file in new:
                overwrite.append_data_file(data_file)
    return (len(old), len(new))


def rewrite_unfiltered(catalog: Catalog, table: Table, memory_bytes: int = 768 << 20) -> tuple[int, int]:
    """Rewrite the data files written before ``table``'s Bloom filters were turned on, a partition per commit.

    ``FILTERS_SINCE`` (set by :func:`warehouse.tiering.ensure_cold_table` when it turns them on for a
    table that already holds data) is the first data sequence number written with them; a rewritten
    file gets a new one, so a run killed midway goes on where it stopped.

    Returns:
        (files removed, files written).
    """
    since = table.properties.get(FILTERS_SINCE)
    if since is None:
        return (0, 0)
    removed = written = 0
    while True:
        done = (0, 0)

        def attempt() -> None:
            nonlocal done
            current = catalog.load_table(table.name())
            old = [e for e in live_files(current) if e.sequence_number is not None and e.sequence_number < int(since)]
            if not old:
                done = (0, 0)
                return
            partition = _partition_key(old[0])
            files = [e for e in old if _partition_key(e) == partition]
            target = int(current.properties.get("write.target-file-size-bytes", str(128 << 20)))
            new = _rewritten(current, files, target, memory_bytes, arrow_row_bytes(current, files))
            done = _swap(current, [f.data_file for f in files], new)

        retry_on_conflict(f"add Bloom filters to {'.'.join(table.name())}", attempt)
        if done == (0, 0):
            return removed, written
        removed, written = removed + done[0], written + done[1]


def protected_snapshots(lake: Lakehouse, table: Table) -> set[int]:
    """Snapshots expiry must keep beyond the current one: assembly's watermark and its descendants."""
    if table.name() != (lake.namespace, RAW_EVENTS.name):
        return set()
    marker = lake.table(TRAJECTORIES.name).properties.get(ASSEMBLED_SNAPSHOT)
    if not marker:
        return set()
    newer = snapshots_since(table, int(marker))
    return set() if newer is None else newer | {int(marker)}


def expire_snapshots(table: Table, older_than: datetime, keep: set[int]) -> int:
    """Expire snapshots older than ``older_than`` except the current one and ``keep``; returns how many."""
    current = table.current_snapshot()
    keep = keep | ({current.snapshot_id} if current else set())
    cutoff_ms = int(older_than.timestamp() * 1000)
    doomed = [s.snapshot_id for s in table.snapshots() if s.timestamp_ms < cutoff_ms and s.snapshot_id not in keep]
    if doomed:
        table.maintenance.expire_snapshots().by_ids(doomed).commit()
    return len(doomed)


def _referenced(table: Table) -> set[str]:
    """Every file the table's metadata still points at (data, manifests, manifest lists, metadata)."""
    io = table.io
    found = {table.metadata_location, *(entry.metadata_file for entry in table.metadata.metadata_log)}
    found |= {s.statistics_path for s in table.metadata.statistics}
    seen_manifests: set[str] = set()
    for snapshot in table.snapshots():
        found.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            found.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                found.add(entry.data_file.file_path)
    return found


def _filesystem(table: Table, location: str) -> tuple[pafs.FileSystem, str]:
    io = table.io
    if not isinstance(io, PyArrowFileIO):
        # Listing a warehouse needs a filesystem; other FileIOs (e.g. fsspec) expose none here.
        raise WarehouseError(
            f"orphan removal lists files through PyArrowFileIO; {'.'.join(table.name())} uses {type(io).__name__} "
            "(set py-io-impl=pyiceberg.io.pyarrow.PyArrowFileIO in TRAJLAKE_CATALOG_PROPERTIES)"
        )
    scheme, netloc, path = io.parse_location(location)
    return io.fs_by_scheme(scheme, netloc), path


def remove_orphans(table: Table, older_than: datetime) -> tuple[int, int]:
    """Delete files under the table location that no metadata references and older than ``older_than``.

    The age guard protects files a concurrent writer has written but not yet committed.

    Returns:
        (files removed, bytes removed).
    """
    fs, root = _filesystem(table, table.location())
    referenced = {_filesystem(table, uri)[1] for uri in _referenced(table)}
    try:
        listing = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return 0, 0
    removed = removed_bytes = 0
    for info in listing:
        if info.type != pafs.FileType.File or info.path in referenced:
            continue
        if info.mtime is not None and info.mtime.replace(tzinfo=info.mtime.tzinfo or UTC) >= older_than:
            continue
        fs.delete_file(info.path)
        removed += 1
        removed_bytes += info.size or 0
    return removed, removed_bytes


@dataclass(frozen=True)
class MaintainOptions:
    """What maintenance reads from the configuration.

    Attributes:
        compact_min_files: compact a partition once it has this many small files (``TRAJLAKE_COMPACT_MIN_FILES``).
        snapshot_retention_hours: expire older snapshots (``TRAJLAKE_SNAPSHOT_RETENTION_HOURS``).
        orphan_min_age_hours: only delete unreferenced files older than this (``TRAJLAKE_ORPHAN_MIN_AGE_HOURS``).
        rewrite_memory_bytes: rows read into memory per rewritten bundle (``TRAJLAKE_REWRITE_MEMORY_BYTES``).
    """

    compact_min_files: int = 4
    snapshot_retention_hours: float = 24.0
    orphan_min_age_hours: float = 24.0
    rewrite_memory_bytes: int = 768 << 20

    @classmethod
    def from_settings(cls, settings: Settings) -> MaintainOptions:
        """The options the settings give."""
        return cls(
            settings.compact_min_files,
            settings.snapshot_retention_hours,
            settings.orphan_min_age_hours,
            settings.rewrite_memory_bytes,
        )


def maintain(
    lake: Lakehouse,
    as_of: datetime | None = None,
    orphan_min_age: timedelta | None = None,
    options: MaintainOptions | None = None,
) -> list[TableReport]:
    """Compact, expire snapshots and remove orphans on every hot and cold table.

    Args:
        lake: the lakehouse.
        as_of: the "now" ages are measured from; wall clock by default.
        orphan_min_age: overrides ``options.orphan_min_age_hours``.
        options: the thresholds; read from the lakehouse's settings by default.

    Raises:
        TieringError: the lifecycle lock stayed busy, or commits kept conflicting.
    """
    as_of = as_of or datetime.now(UTC)
    options = options or MaintainOptions.from_settings(lake.settings)
    orphan_min_age = orphan_min_age if orphan_min_age is not None else timedelta(hours=options.orphan_min_age_hours)
    reports: list[TableReport] = []
    catalog = lake.catalog
    with lifecycle_lock(lake):
        tables = [lake.table(name) for name in TABLES]
        tables += [lake.cold_table(name) for name in TIERED_TABLES]
        cold_raw = lake.cold_table(RAW_EVENTS.name)
        for table in tables:
            started = time.monotonic()
            report = TableReport(".".join(table.name()), before=usage(table))
            eligible: Callable[[LiveFile], bool] = lambda _: True  # noqa: E731
            if table.name() == (lake.namespace, RAW_EVENTS.name):
                eligible = _raw_events_eligibility(lake, table, tiered_files(cold_raw))
            report.files_rewritten, report.files_written = compact_table(
                catalog, table, options.compact_min_files, eligible, options.rewrite_memory_bytes
            )
            removed, written = rewrite_unfiltered(catalog, table, options.rewrite_memory_bytes)
            report.files_rewritten += removed
            report.files_written += written
            table = lake.catalog.load_table(table.name())
            keep = protected_snapshots(lake, table)
            report.snapshots_expired = expire_snapshots(
                table, as_of - timedelta(hours=options.snapshot_retention_hours), keep
            )
            table = lake.catalog.load_table(table.name())
            report.orphans_removed, report.orphan_bytes = remove_orphans(table, as_of - orphan_min_age)
            report.after = usage(table)
            reports.append(report)
            log.info("maintained %s in %.1fs: %s", report.table, time.monotonic() - started, report.as_dict())
    return reports


def _raw_events_eligibility(lake: Lakehouse, raw: Table, pending: set[str]) -> Callable[[LiveFile], bool]:
    """Which hot raw-events files compaction may rewrite: assembled ones not awaiting tier deletion.

    Assembled means a data sequence number at most that of assembly's watermark snapshot
    (sequence numbers grow with every commit, and survive the expiry of the adding snapshot).
    With no usable watermark, assembly reads everything on its next run anyway, so any file may go.
    """
    marker = lake.table(TRAJECTORIES.name).properties.get(ASSEMBLED_SNAPSHOT)
    snapshot = raw.snapshot_by_id(int(marker)) if marker else None
    if snapshot is None or snapshot.sequence_number is None:
        return lambda entry: entry.path not in pending
    watermark = snapshot.sequence_number
    return lambda entry: (
        entry.path not in pending and entry.sequence_number is not None and entry.sequence_number <= watermark
    )


def tidy_tables(
    lake: Lakehouse, names: tuple[str, ...], older_than: datetime, min_files: int | None
) -> list[TableReport]:
    """A writer's own upkeep of the hot tables ``names``: expire old snapshots, compact small files.

    ``min_files`` None: no compaction, only the expiry.

    What :func:`maintain` does to them, bounded to what a streaming writer (``ingest --follow``)
    leaves behind, and safe beside it: under the lifecycle lock, taken without waiting (a
    running ``trajlake maintain`` or ``tier`` does the same work, so this round is skipped),
    with the same rules: raw_events files not yet assembled or awaiting tier deletion are not
    rewritten, assembly's watermark snapshot and its descendants are not expired, and the
    current snapshot never is. Neither step deletes a file: a reader holding an older snapshot
    still finds its files until orphan removal, which waits ``TRAJLAKE_ORPHAN_MIN_AGE_HOURS``.
    Each commit re-plans from the table's state on a conflict (:func:`retry_on_conflict`).

    Returns:
        One report per table (files rewritten and written, snapshots expired, snapshots left).

    Raises:
        TieringError: another lifecycle job holds the lock (nothing was done).
        CommitConflict: concurrent commits kept conflicting.
    """
    reports: list[TableReport] = []
    with lifecycle_lock(lake, wait_s=0.0):
        cold_raw = lake.cold_table(RAW_EVENTS.name) if RAW_EVENTS.name in names and min_files is not None else None
        for name in names:
            table = lake.table(name)
            report = TableReport(".".join(table.name()))
            if min_files is not None:
                eligible: Callable[[LiveFile], bool] = lambda _: True  # noqa: E731
                if cold_raw is not None and name == RAW_EVENTS.name:
                    eligible = _raw_events_eligibility(lake, table, tiered_files(cold_raw))
                report.files_rewritten, report.files_written = compact_table(
                    lake.catalog, table, min_files, eligible, lake.settings.rewrite_memory_bytes
                )

            def expire(name: str = name, report: TableReport = report) -> None:
                current = lake.catalog.load_table((lake.namespace, name))
                report.snapshots_expired = expire_snapshots(current, older_than, protected_snapshots(lake, current))

            retry_on_conflict(f"expire snapshots of {name}", expire)
            report.after.snapshots = len(lake.catalog.load_table((lake.namespace, name)).snapshots())
            reports.append(report)
    return reports
