"""Which data files make up a table, and which files arrived since a snapshot.

Readers (the SQL views, incremental assembly) work on Parquet file lists planned
by pyiceberg: the planner applies Iceberg's metadata (manifests, deletes), then
DuckDB reads the files. Tables written by trajlake have no delete files
(pyiceberg writes copy-on-write); a table that has them is read through
pyiceberg's own scan instead, so the result is still correct.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import date, timedelta

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform

#: Snapshot-summary key marking a commit that only rewrote existing rows (compaction).
REWRITE_MARKER = "trajlake.rewrite"


@dataclass(frozen=True)
class FileSet:
    """Data files of a table at one snapshot."""

    snapshot_id: int | None
    paths: list[str]
    has_deletes: bool


def current_files(table: Table) -> FileSet:
    """The live data files of the table's current snapshot."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return FileSet(None, [], False)
    live, has_deletes = _planned(table)
    return FileSet(snapshot.snapshot_id, [f.path for f in live], has_deletes)


def snapshots_since(table: Table, snapshot_id: int | None) -> set[int] | None:
    """Ids of the snapshots after ``snapshot_id`` in the current ancestry.

    Returns ``None`` when ``snapshot_id`` is not an ancestor any more (expired,
    or history rewritten), meaning the caller must fall back to a full read.
    """
    found: set[int] = set()
    snapshot = table.current_snapshot()
    while snapshot is not None:
        if snapshot.snapshot_id == snapshot_id:
            return found
        found.add(snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return found if snapshot_id is None else None


def files_added_since(table: Table, snapshot_id: int | None) -> list[str] | None:
    """Data files added after ``snapshot_id`` and still live; ``None`` if unknown (see above)."""
    newer = snapshots_since(table, snapshot_id)
    if newer is None:
        return None
    # Compaction commits re-add rows that were already there (and, for raw events, already
    # assembled: see warehouse.maintenance), so their files are not new data.
    # (From no snapshot at all, everything is new, rewrites included.)
    if snapshot_id is not None:
        newer = {sid for sid in newer if not is_rewrite(table, sid)}
    snapshot = table.current_snapshot()
    if snapshot is None or not newer:
        return []
    paths: list[str] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in _entries(table, manifest):
            # Merged manifests keep the adding snapshot id on EXISTING entries, so test the id only.
            if entry.snapshot_id in newer:
                paths.append(entry.data_file.file_path)
    return paths


def is_rewrite(table: Table, snapshot_id: int) -> bool:
    """Whether the snapshot only rewrote existing rows (a trajlake compaction commit)."""
    snapshot = table.snapshot_by_id(snapshot_id)
    summary = snapshot.summary.additional_properties if snapshot and snapshot.summary else {}
    return summary.get(REWRITE_MARKER) == "true"


@dataclass(frozen=True)
class LiveFile:
    """One live data file of the current snapshot and the snapshot that added it."""

    data_file: DataFile
    added_by: int | None
    sequence_number: int | None = None

    @property
    def path(self) -> str:
        """The file's URI."""
        return self.data_file.file_path


def live_files(table: Table) -> list[LiveFile]:
    """Live data files of the current snapshot, with the snapshot that added each."""
    if table.current_snapshot() is None:
        return []
    return list(_planned(table)[0])


#: (metadata file, snapshot id) → that snapshot's live data files and whether it has delete files.
_PLANS: OrderedDict[tuple[str, int], tuple[tuple[LiveFile, ...], bool]] = OrderedDict()
_PLANS_KEPT = 64
_PLANS_LOCK = threading.Lock()


def _planned(table: Table) -> tuple[tuple[LiveFile, ...], bool]:
    """The current snapshot's manifests read once per process (a snapshot never changes).

    Opening the views asks for a table's files more than once (paths, then sizes for the object
    store); on ``s3://`` every manifest read is a request, so they are kept for the last
    :data:`_PLANS_KEPT` snapshots.
    """
    snapshot = table.current_snapshot()
    assert snapshot is not None
    key = (table.metadata_location, snapshot.snapshot_id)
    with _PLANS_LOCK:
        if key in _PLANS:
            _PLANS.move_to_end(key)
            return _PLANS[key]
    found: list[LiveFile] = []
    has_deletes = False
    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DELETES:
            has_deletes = has_deletes or manifest.added_files_count != 0 or manifest.existing_files_count != 0
            continue
        for entry in _entries(table, manifest):
            if entry.data_file.content == DataFileContent.DATA:
                found.append(LiveFile(entry.data_file, entry.snapshot_id, entry.sequence_number))
    plan = (tuple(found), has_deletes)
    with _PLANS_LOCK:
        _PLANS[key] = plan
        while len(_PLANS) > _PLANS_KEPT:
            _PLANS.popitem(last=False)
    return plan


#: manifest file → its live entries. A manifest is written once and never changes, and each commit
#: lists mostly the manifests of the snapshot before it: re-planning after a commit reads only the new ones.
_MANIFESTS: OrderedDict[str, tuple[ManifestEntry, ...]] = OrderedDict()
_MANIFEST_ENTRIES_KEPT = 500_000
_manifest_entries = 0


def _entries(table: Table, manifest: ManifestFile) -> tuple[ManifestEntry, ...]:
    """The live (not deleted) entries of ``manifest``, read once per process (at most
    :data:`_MANIFEST_ENTRIES_KEPT` entries are kept, the least recently used dropped first)."""
    global _manifest_entries
    path = manifest.manifest_path
    with _PLANS_LOCK:
        if path in _MANIFESTS:
            _MANIFESTS.move_to_end(path)
            return _MANIFESTS[path]
    entries = tuple(manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    with _PLANS_LOCK:
        if path not in _MANIFESTS:
            _MANIFESTS[path] = entries
            _manifest_entries += len(entries)
        while _manifest_entries > _MANIFEST_ENTRIES_KEPT and len(_MANIFESTS) > 1:
            _manifest_entries -= len(_MANIFESTS.popitem(last=False)[1])
    return entries


def day_partitions(table: Table, column: str) -> dict[str, date | None]:
    """The day partition of ``column`` (None: NULL) of each live data file partitioned by exactly that.

    Files of any other partition spec are left out: a caller pruning by day keeps them.
    """
    field_id = table.schema().find_field(column).field_id
    specs = table.specs()
    days: dict[str, date | None] = {}
    for entry in live_files(table):
        fields = specs[entry.data_file.spec_id].fields
        if len(fields) != 1 or fields[0].source_id != field_id or not isinstance(fields[0].transform, DayTransform):
            continue
        value = entry.data_file.partition[0]
        days[entry.path] = None if value is None else _EPOCH + timedelta(days=int(value))
    return days


_EPOCH = date(1970, 1, 1)


def size_bundles(
    entries: list[LiveFile], target_bytes: int, memory_bytes: int | None = None, row_bytes: float = 0.0
) -> list[list[LiveFile]]:
    """``entries`` (in path order) cut into consecutive bundles of at most about ``target_bytes``.

    Rewrites and copies work bundle by bundle, so their memory is bounded by the bundle,
    not by a partition (a day of raw events does not fit in memory at fleet scale). File
    sizes are compressed bytes, and trajectory data compresses 10-30×: with ``memory_bytes``
    a bundle also stays within that many bytes of Arrow rows (``row_bytes`` per row, see
    :func:`arrow_row_bytes`).
    """
    bundles: list[list[LiveFile]] = []
    bundle: list[LiveFile] = []
    size = 0
    rows = 0
    for entry in sorted(entries, key=lambda e: e.data_file.file_path):
        n = entry.data_file.record_count
        too_big = size + entry.data_file.file_size_in_bytes > target_bytes
        if memory_bytes is not None and (rows + n) * row_bytes > memory_bytes:
            too_big = True
        if bundle and too_big:
            bundles.append(bundle)
            bundle, size, rows = [], 0, 0
        bundle.append(entry)
        size += entry.data_file.file_size_in_bytes
        rows += n
    if bundle:
        bundles.append(bundle)
    return bundles


def arrow_row_bytes(table: Table, entries: list[LiveFile]) -> float:
    """Arrow bytes per row of ``entries``, estimated by reading the first and the last file."""
    if not entries:
        return 0.0
    ordered = sorted(entries, key=lambda e: e.data_file.file_path)
    sample = [ordered[0].data_file] if len(ordered) == 1 else [ordered[0].data_file, ordered[-1].data_file]
    per_row = 0.0
    for data_file in sample:
        rows = read_data_files(table, [data_file])
        per_row = max(per_row, rows.nbytes / max(rows.num_rows, 1))
    return per_row


def read_data_files(
    table: Table,
    files: list[DataFile],
    columns: tuple[str, ...] | None = None,
    row_filter: BooleanExpression | None = None,
) -> pa.Table:
    """Rows of the given data files as Arrow, in the table's current schema (or only ``columns``).

    Goes through pyiceberg's reader, so it works on any FileIO (``file://``, ``s3://``)
    and fills columns added after a file was written with nulls. With ``row_filter`` only
    matching rows, and row groups whose statistics exclude it are not read.
    """
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    schema = table.schema() if columns is None else table.schema().select(*columns)
    scan = ArrowScan(table.metadata, table.io, schema, row_filter if row_filter is not None else AlwaysTrue())
    return scan.to_table([FileScanTask(f) for f in files])
