"""Keep the lakehouse healthy: compact small files, expire snapshots, remove orphan files.

pyiceberg has no compaction, so :func:`compact_table` rewrites a partition's small
files with Arrow (sorted by the table's sort order, at its target file size) and
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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow.fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import PyArrowFileIO, _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from pipelines.settings import Settings
from warehouse.catalog import open_catalog
from warehouse.errors import WarehouseError
from warehouse.snapshots import (
    REWRITE_MARKER,
    LiveFile,
    live_files,
    read_data_files,
    size_bundles,
    snapshots_since,
)
from warehouse.tables import RAW_EVENTS, TABLES, TRAJECTORIES, ensure_table
from warehouse.tiering import TIERED_TABLES, _retry, ensure_cold_table, lifecycle_lock, tiered_files

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
    return (entry.data_file.spec_id, *tuple(entry.data_file.partition))


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


def _bundles(groups: dict[tuple[object, ...], list[LiveFile]], min_files: int, target: int) -> list[list[LiveFile]]:
    """Small files of partitions with ``min_files`` or more of them, in bundles of about ``target`` bytes.

    A bundle never mixes partitions; a lone leftover file is not worth a rewrite and stays.
    """
    return [
        bundle
        for files in groups.values()
        if len(files) >= min_files
        for bundle in size_bundles(files, target)
        if len(bundle) > 1
    ]


def compact_table(
    catalog: Catalog, table: Table, min_files: int, eligible: Callable[[LiveFile], bool] = lambda _: True
) -> tuple[int, int]:
    """Rewrite every partition holding ``min_files`` or more small eligible files into target-size files.

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
        spec = TABLES.get(table.name()[-1])
        old: list[DataFile] = []
        new: list[DataFile] = []
        # Each rewrite reads at most about one target file's worth of small files, so memory is
        # bounded by the target size, not by the partition (a day of raw events does not fit).
        for bundle in _bundles(groups, min_files, target):
            files = [entry.data_file for entry in bundle]
            rows = read_data_files(current, files)
            if spec and spec.sort_by and rows.num_rows:
                rows = rows.sort_by([(k, "ascending") for k in spec.sort_by])
            new.extend(_dataframe_to_data_files(current.metadata, rows, current.io))
            old.extend(files)
            del rows
        if not old:
            result = (0, 0)
            return
        with current.transaction() as tx:
            properties = {REWRITE_MARKER: "true", "trajlake.rewrite.files": str(len(old))}
            with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
                for data_file in old:
                    overwrite.delete_data_file(data_file)
                for data_file in new:
                    overwrite.append_data_file(data_file)
        result = (len(old), len(new))

    _retry(f"compact {'.'.join(table.name())}", attempt)
    return result


def protected_snapshots(catalog: Catalog, settings: Settings, table: Table) -> set[int]:
    """Snapshots expiry must keep beyond the current one: assembly's watermark and its descendants."""
    if table.name() != (settings.namespace, RAW_EVENTS.name):
        return set()
    marker = ensure_table(catalog, settings, TRAJECTORIES.name).properties.get(ASSEMBLED_SNAPSHOT)
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


def maintain(
    settings: Settings,
    catalog: Catalog | None = None,
    as_of: datetime | None = None,
    orphan_min_age: timedelta | None = None,
) -> list[TableReport]:
    """Compact, expire snapshots and remove orphans on every hot and cold table.

    Args:
        settings: thresholds (``compact_min_files``, ``snapshot_retention_hours``, ``orphan_min_age_hours``).
        catalog: Iceberg catalog; opened from settings by default.
        as_of: the "now" ages are measured from; wall clock by default.
        orphan_min_age: overrides ``settings.orphan_min_age_hours``.

    Raises:
        TieringError: the lifecycle lock stayed busy, or commits kept conflicting.
    """
    as_of = as_of or datetime.now(UTC)
    orphan_min_age = orphan_min_age if orphan_min_age is not None else timedelta(hours=settings.orphan_min_age_hours)
    reports: list[TableReport] = []
    with lifecycle_lock(settings):
        catalog = catalog or open_catalog(settings)
        tables = [ensure_table(catalog, settings, name) for name in TABLES]
        tables += [ensure_cold_table(catalog, settings, name) for name in TIERED_TABLES]
        cold_raw = ensure_cold_table(catalog, settings, RAW_EVENTS.name)
        for table in tables:
            started = time.monotonic()
            report = TableReport(".".join(table.name()), before=usage(table))
            eligible: Callable[[LiveFile], bool] = lambda _: True  # noqa: E731
            if table.name() == (settings.namespace, RAW_EVENTS.name):
                eligible = _raw_events_eligibility(catalog, settings, table, tiered_files(cold_raw))
            report.files_rewritten, report.files_written = compact_table(
                catalog, table, settings.compact_min_files, eligible
            )
            table = catalog.load_table(table.name())
            keep = protected_snapshots(catalog, settings, table)
            report.snapshots_expired = expire_snapshots(
                table, as_of - timedelta(hours=settings.snapshot_retention_hours), keep
            )
            table = catalog.load_table(table.name())
            report.orphans_removed, report.orphan_bytes = remove_orphans(table, as_of - orphan_min_age)
            report.after = usage(table)
            reports.append(report)
            log.info("maintained %s in %.1fs: %s", report.table, time.monotonic() - started, report.as_dict())
    return reports


def _raw_events_eligibility(
    catalog: Catalog, settings: Settings, raw: Table, pending: set[str]
) -> Callable[[LiveFile], bool]:
    """Which hot raw-events files compaction may rewrite: assembled ones not awaiting tier deletion.

    Assembled means a data sequence number at most that of assembly's watermark snapshot
    (sequence numbers grow with every commit, and survive the expiry of the adding snapshot).
    With no usable watermark, assembly reads everything on its next run anyway, so any file may go.
    """
    marker = ensure_table(catalog, settings, TRAJECTORIES.name).properties.get(ASSEMBLED_SNAPSHOT)
    snapshot = raw.snapshot_by_id(int(marker)) if marker else None
    if snapshot is None or snapshot.sequence_number is None:
        return lambda entry: entry.path not in pending
    watermark = snapshot.sequence_number
    return lambda entry: (
        entry.path not in pending and entry.sequence_number is not None and entry.sequence_number <= watermark
    )
