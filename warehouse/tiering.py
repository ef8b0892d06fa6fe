"""Hot → cold tiering: move data older than the hot retention to compacted cold tables.

Cold tables (:mod:`warehouse.cold`: where they live, which tables have one) have the
same schemas, partitioning and sort order as the hot tables.

Every move is two idempotent phases, each one atomic Iceberg commit:

1. **copy** the rows to the cold table, sorted by session, in zstd Parquet at the
   cold target file size; the same commit records what was copied;
2. **delete** them from hot.

A crash between the phases leaves rows in both tiers; readers (``warehouse.sql``)
count them once:

* ``raw_events`` moves whole day partitions older than the retention. The cold
  table's property :data:`TIERED_FILES` lists the hot *files* copied (files are
  immutable, so a path is an exact identity); the union view skips those hot files.
  A late event written to an old day lands in a new file, which is not listed,
  so it stays visible and is tiered by the next run. A day moves only when every
  session with events in it is assembled and closed, so assembly never needs the
  events it no longer sees in hot.
* ``trajectories``/``steps`` move closed sessions (status not ``running``) that
  started before the retention boundary's day. Their key is ``session_id``; the
  union view prefers the cold row, so a session present in both tiers counts once.
  An event arriving after its session was tiered lands in hot; assembly recomputes the
  session from its hot and cold events (:func:`late_event_files`), and the next run
  *amends* the cold tier: a session whose hot trajectory was assembled after its cold one
  gets its cold steps, then its cold trajectory, replaced by the hot ones, and only then
  leaves hot. Until that run the views show the cold (pre-late-event) rows.

Tiering and maintenance take :func:`lifecycle_lock` so they never interleave
(compaction rewriting a copied-but-not-deleted hot file would give its rows a new
identity); the lock is a row in the SQL catalog's database, so it holds across
machines sharing a PostgreSQL catalog (``warehouse.locks``). Every commit is also
conditioned on the snapshot it was planned from and re-planned after a conflict.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import And, BooleanExpression, In, LessThan, NotEqualTo, Reference
from pyiceberg.expressions.literals import literal
from pyiceberg.table import Table

from common.errors import TransientError
from common.faults import crash_point
from common.settings import Settings
from warehouse.cold import TIERED_FILES, tiered_files
from warehouse.errors import LockBusy, WarehouseError
from warehouse.files import parquet_source, readable_files
from warehouse.lakehouse import Lakehouse
from warehouse.snapshots import LiveFile, arrow_row_bytes, live_files, read_data_files, size_bundles
from warehouse.tables import RAW_EVENTS, STEPS, TABLES, TRAJECTORIES
from warehouse.transactions import retry_on_conflict, transaction

log = logging.getLogger("trajlake.tiering")

_DAY_US = 86_400_000_000


class TieringError(WarehouseError, TransientError):
    """Tiering could not complete (lock held, or commits kept conflicting)."""


@dataclass
class TierStats:
    """What one tiering run moved."""

    boundary: str = ""
    days_tiered: list[str] = field(default_factory=list)
    days_deferred: list[str] = field(default_factory=list)
    events_copied: int = 0
    event_files_removed: int = 0
    sessions_copied: int = 0
    sessions_amended: int = 0
    steps_copied: int = 0
    sessions_removed: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class TierOptions:
    """What tiering reads from the configuration.

    Attributes:
        hot_retention_days: days data stays hot (``TRAJLAKE_HOT_RETENTION_DAYS``).
        rewrite_memory_bytes: rows read into memory per copied bundle (``TRAJLAKE_REWRITE_MEMORY_BYTES``).
    """

    hot_retention_days: float = 7.0
    rewrite_memory_bytes: int = 768 << 20

    @classmethod
    def from_settings(cls, settings: Settings) -> TierOptions:
        """The options the settings give."""
        return cls(settings.hot_retention_days, settings.rewrite_memory_bytes)


@contextmanager
def lifecycle_lock(lake: Lakehouse, wait_s: float = 600.0) -> Iterator[None]:
    """Exclusive lock shared by tiering and maintenance on this catalog (every machine; ``warehouse.locks``).

    Raises:
        TieringError: another lifecycle job held the lock for ``wait_s`` seconds.
    """
    with ExitStack() as stack:
        try:
            stack.enter_context(lake.lock("lifecycle", wait_s))
        except LockBusy as exc:
            raise TieringError(f"another tier/maintain run holds the lock: {exc}") from exc
        yield


def _append_planned(table: Table, rows: pa.Table) -> None:
    """Append rows chosen from ``table``'s state as loaded; a concurrent commit fails it (re-run: idempotent).

    Raises:
        TieringError: ``table`` changed since the rows were chosen (a later run picks up where this one stopped).
    """
    try:
        with transaction(table) as tx:
            tx.append(rows)
    except CommitFailedException as exc:
        raise TieringError(f"{'.'.join(table.name())} changed while tiering; run `trajlake tier` again") from exc


def _day(ts: datetime) -> int:
    return int(ts.timestamp() * 1_000_000) // _DAY_US


def _day_name(day: int) -> str:
    return datetime.fromtimestamp(day * 86_400, UTC).date().isoformat()


def _sorted(rows: pa.Table, name: str) -> pa.Table:
    keys = TABLES[name].sort_by
    return rows.sort_by([(k, "ascending") for k in keys]) if rows.num_rows and keys else rows


def _ids(table: Table, column: str, row_filter: BooleanExpression) -> set[str]:
    if table.current_snapshot() is None:
        return set()
    rows = table.scan(row_filter=row_filter, selected_fields=(column,)).to_arrow()
    return set(rows.column(column).to_pylist())


# pyiceberg's predicates are pydantic models whose own ``__init__`` takes positional arguments, but a type
# checker sees only the fields' keyword ``__init__``: these spell them by field, so both agree.
def _in(column: str, values: list[str]) -> In:
    return In(term=Reference(column), literals={literal(v) for v in values})


def _before(column: str, value: str) -> LessThan:
    return LessThan(term=Reference(column), value=literal(value))


def _not_running() -> NotEqualTo:
    return NotEqualTo(term=Reference("status"), value=literal("running"))


def _chunks(ids: list[str], size: int = 5000) -> Iterator[list[str]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def _assembled_at(table: Table, ids: list[str]) -> dict[str, datetime | None]:
    """``session_id`` → ``assembled_at`` of the rows of ``ids`` in ``table`` (a trajectories table)."""
    found: dict[str, datetime | None] = {}
    if table.current_snapshot() is None:
        return found
    for chunk in _chunks(ids):
        scan = table.scan(row_filter=_in("session_id", chunk), selected_fields=("session_id", "assembled_at"))
        rows = scan.to_arrow()
        found.update(zip(rows.column("session_id").to_pylist(), rows.column("assembled_at").to_pylist(), strict=True))
    return found


def _copy_or_amend(table: Table, rows: pa.Table, amend: list[str]) -> None:
    """Append ``rows`` to cold ``table``, replacing the rows of sessions ``amend`` (one conditioned commit).

    Raises:
        TieringError: ``table`` changed since the rows were chosen.
    """
    try:
        with transaction(table) as tx:
            for chunk in _chunks(amend):
                tx.delete(_in("session_id", chunk))
            tx.append(rows.cast(table.schema().as_arrow()))
    except CommitFailedException as exc:
        raise TieringError(f"{'.'.join(table.name())} changed while tiering; run `trajlake tier` again") from exc


def late_event_files(con: duckdb.DuckDBPyConnection, lake: Lakehouse, affected: str) -> list[str]:
    """Cold ``raw_events`` files assembly must read too: some sessions of ``affected`` are already tiered.

    A late event of a tiered session lands in hot; recomputing the session from its hot events
    alone would lose the rest, so assembly reads its cold events as well (events in both tiers
    after a crashed tiering are deduplicated by ``event_id`` like any duplicate).

    Args:
        con: Assembly's connection (the object-store filesystem is registered on it when needed).
        lake: The lakehouse (its cold tier and object stores).
        affected: SQL relation on ``con`` with a ``session_id`` column: the sessions to assemble.

    Returns:
        The cold data files, or ``[]`` when no affected session is in the cold tier.
    """
    stores = lake.object_stores()
    tiered = readable_files(con, lake.cold_table(TRAJECTORIES.name), stores)
    if not tiered:
        return []
    found = con.execute(
        f"SELECT count(*) FROM {parquet_source(tiered, same_schema=False)} "
        f"WHERE session_id IN (SELECT session_id FROM {affected})"
    ).fetchone()
    if not found or not found[0]:
        return []
    return readable_files(con, lake.cold_table(RAW_EVENTS.name), stores)


def _tier_sessions(lake: Lakehouse, boundary_day: int, stats: TierStats) -> None:
    """Move closed sessions that started before ``boundary_day`` (trajectories and their steps).

    A session already in cold whose hot trajectory was assembled later (a late event after
    tiering; assembly recomputed it from its hot and cold events) *amends* the cold tier: its
    cold steps and trajectory are replaced by the hot ones, steps first. Until the trajectory
    is replaced the session counts as not moved, so a crash in between re-runs the amendment
    (replacing is idempotent) and the hot rows are never deleted before cold has them.
    """
    boundary = datetime.fromtimestamp(boundary_day * 86_400, UTC)
    hot_traj = lake.table(TRAJECTORIES.name)
    hot_steps = lake.table(STEPS.name)
    cold_traj = lake.cold_table(TRAJECTORIES.name)
    cold_steps = lake.cold_table(STEPS.name)
    if hot_traj.current_snapshot() is None:
        return
    closed = hot_traj.scan(row_filter=And(_before("started_at", boundary.isoformat()), _not_running())).to_arrow()
    candidates = closed.column("session_id").to_pylist()
    cold_at = _assembled_at(cold_traj, candidates)
    hot_at = dict(zip(candidates, closed.column("assembled_at").to_pylist(), strict=True))
    amend = sorted(s for s, at in cold_at.items() if _newer(hot_at[s], at))
    # Phase 1a: steps of candidate sessions not yet in cold, and of sessions to amend (one commit:
    # a session is all-or-nothing).
    if candidates and hot_steps.current_snapshot() is not None:
        done = set().union(*(_ids(cold_steps, "session_id", _in("session_id", c)) for c in _chunks(candidates)))
        todo = sorted({s for s in candidates if s not in done} | set(amend))
        if todo:
            parts = [hot_steps.scan(row_filter=_in("session_id", c)).to_arrow() for c in _chunks(todo)]
            steps = _sorted(pa.concat_tables(parts), STEPS.name)
            replaced = [s for s in amend if s in done]
            if steps.num_rows or replaced:
                _copy_or_amend(cold_steps, steps, replaced)
                stats.steps_copied += steps.num_rows
    crash_point("tier_after_copy_steps")
    # Phase 1b: the trajectories (replacing the amended ones: after this commit they are moved).
    if candidates:
        cold_traj = lake.catalog.load_table(cold_traj.name())
        done = set(cold_at) - set(amend)
        keep = [s not in done for s in candidates]
        rows = _sorted(closed.filter(pa.array(keep, pa.bool_())), TRAJECTORIES.name)
        if rows.num_rows:
            _copy_or_amend(cold_traj, rows, amend)
            stats.sessions_copied += rows.num_rows - len(amend)
            stats.sessions_amended += len(amend)
    crash_point("tier_after_copy_trajectories")
    # Phase 2: delete from hot every old session the cold tier holds as assembled in hot (also finishes a
    # crashed run). A session whose hot trajectory is newer than its cold one (amended after this run
    # planned, or running again) keeps its hot rows. A session's steps can run past midnight into the
    # boundary day, hence the day of slack for steps.
    slack = boundary + timedelta(days=1)
    for hot, cold, column, until in (
        (hot_steps, cold_steps, "ts", slack),
        (hot_traj, cold_traj, "started_at", boundary),
    ):
        removed: list[int] = []

        def delete(
            hot: Table = hot,
            cold: Table = cold,
            column: str = column,
            until: datetime = until,
            removed: list[int] = removed,
        ) -> None:
            table = lake.catalog.load_table(hot.name())
            cold = lake.catalog.load_table(cold.name())
            old = sorted(_ids(table, "session_id", _before(column, until.isoformat())))
            held = sorted(set().union(*(_ids(cold, "session_id", _in("session_id", c)) for c in _chunks(old))))
            moved = _moved(lake, held)
            if not moved:
                return
            with transaction(table) as tx:
                for chunk in _chunks(moved):
                    tx.delete(_in("session_id", chunk))
            removed.append(len(moved))

        retry_on_conflict(f"delete tiered sessions from {hot.name()}", delete)
        if hot.name()[-1] == TRAJECTORIES.name:
            stats.sessions_removed += removed[-1] if removed else 0
        crash_point(f"tier_after_delete_{hot.name()[-1]}")


def _newer(hot: datetime | None, cold: datetime | None) -> bool:
    """Whether a hot ``assembled_at`` is later than the cold one (no cold row: the hot one is newer)."""
    return hot is not None and (cold is None or hot > cold)


def _moved(lake: Lakehouse, held: list[str]) -> list[str]:
    """Sessions among ``held`` (in cold) whose hot trajectory is not newer than the cold one."""
    if not held:
        return []
    hot_at = _assembled_at(lake.table(TRAJECTORIES.name), held)
    cold_at = _assembled_at(lake.cold_table(TRAJECTORIES.name), held)
    return [s for s in held if not _newer(hot_at.get(s), cold_at.get(s))]


def _day_of(entry: LiveFile, table: Table) -> int | None:
    """Day partition value of a ``raw_events`` file (None if the file is not day-partitioned on ts)."""
    spec = table.specs().get(entry.data_file.spec_id)
    if spec is None:
        return None
    for i, pf in enumerate(spec.fields):
        if table.schema().find_column_name(pf.source_id) == "ts" and "day" in str(pf.transform).lower():
            return entry.data_file.partition[i]
    return None


def _settled_sessions(lake: Lakehouse, ids: list[str]) -> set[str]:
    """Sessions among ``ids`` that are assembled and closed (in hot or cold trajectories)."""
    hot = lake.table(TRAJECTORIES.name)
    cold = lake.cold_table(TRAJECTORIES.name)
    settled: set[str] = set()
    for chunk in _chunks(ids):
        settled |= _ids(cold, "session_id", _in("session_id", chunk))
        settled |= _ids(hot, "session_id", And(_in("session_id", chunk), _not_running()))
    return settled


def _tier_raw(lake: Lakehouse, boundary_day: int, stats: TierStats, memory_bytes: int) -> None:
    """Move whole ``raw_events`` day partitions before ``boundary_day``."""
    hot = lake.table(RAW_EVENTS.name)
    cold = lake.cold_table(RAW_EVENTS.name)
    copied = tiered_files(cold)
    by_day: dict[int, list[LiveFile]] = {}
    for entry in live_files(hot):
        day = _day_of(entry, hot)
        if day is not None and day < boundary_day:
            by_day.setdefault(day, []).append(entry)
    to_copy: list[LiveFile] = []
    for day, entries in sorted(by_day.items()):
        fresh = [e for e in entries if e.path not in copied]
        if not fresh:
            continue
        sessions = read_data_files(hot, [e.data_file for e in fresh], columns=("session_id",)).column("session_id")
        ids = pc.unique(sessions).to_pylist()
        if len(_settled_sessions(lake, ids)) < len(ids):
            stats.days_deferred.append(_day_name(day))  # unassembled or running sessions: next run
            continue
        stats.days_tiered.append(_day_name(day))
        to_copy.extend(fresh)
    live = {e.path for entries in by_day.values() for e in entries}
    target = int(cold.properties.get("write.target-file-size-bytes", str(128 << 20)))
    # Bundle by bundle, each copy committed with its marker: memory is bounded by a bundle, and a
    # crash between bundles leaves every copied file marked (hidden in the hot view), the rest hot.
    # Live files imply a current snapshot; an empty table has nothing to copy.
    source = "" if (snapshot := hot.current_snapshot()) is None else str(snapshot.snapshot_id)
    for bundle in size_bundles(to_copy, target, memory_bytes, arrow_row_bytes(hot, to_copy)):
        rows = _sorted(read_data_files(hot, [e.data_file for e in bundle]), RAW_EVENTS.name)
        # Keep only markers of hot files still present: the rest were deleted, nothing to exclude.
        marker = sorted((copied & live) | {e.path for e in bundle})
        with transaction(cold) as tx:
            tx.append(
                rows.cast(cold.schema().as_arrow()),
                snapshot_properties={"trajlake.tiered-from-snapshot": source},
            )
            tx.set_properties({TIERED_FILES: json.dumps(marker)})
        stats.events_copied += rows.num_rows
        copied = set(marker)
        del rows
    crash_point("tier_after_copy_raw_events")

    def delete() -> None:
        table = lake.catalog.load_table(hot.name())
        pending = [e.data_file for e in live_files(table) if e.path in copied]
        if not pending:
            return
        with transaction(table) as tx:
            with tx.update_snapshot(snapshot_properties={"trajlake.tiered": str(len(pending))}).overwrite() as ow:
                for data_file in pending:
                    ow.delete_data_file(data_file)
        stats.event_files_removed += len(pending)

    retry_on_conflict(f"delete tiered files from {hot.name()}", delete)
    crash_point("tier_after_delete_raw_events")


def tier(lake: Lakehouse, as_of: datetime | None = None, options: TierOptions | None = None) -> TierStats:
    """Move everything older than ``options.hot_retention_days`` from hot to cold.

    Safe to kill at any point and to re-run: see the module docstring.

    Args:
        lake: the lakehouse.
        as_of: the "now" the retention is measured from; wall clock by default.
        options: retention and memory; read from the lakehouse's settings by default.

    Raises:
        TieringError: the lifecycle lock stayed busy, or hot commits kept conflicting.
    """
    started = time.monotonic()
    as_of = as_of or datetime.now(UTC)
    options = options or TierOptions.from_settings(lake.settings)
    boundary_day = _day(as_of - timedelta(days=options.hot_retention_days))
    stats = TierStats(boundary=_day_name(boundary_day))
    with lifecycle_lock(lake):
        _tier_sessions(lake, boundary_day, stats)
        _tier_raw(lake, boundary_day, stats, options.rewrite_memory_bytes)
    stats.seconds = time.monotonic() - started
    log.info("tiered before %s: %s", stats.boundary, stats.as_dict())
    return stats
