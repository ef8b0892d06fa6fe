"""Maintenance: compaction bounds files per partition, expiry and orphan removal keep what readers need."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import Table

from common.settings import Settings, load_settings
from pipelines.assemble import ASSEMBLED_SNAPSHOT, assemble
from pipelines.ingest import event_row, offsets_key, recorded_offsets
from schemas.registry import decode_event, encode_event
from tests.helpers import BASE, day_events, lake_state, materialized
from warehouse.catalog import open_catalog
from warehouse.cold import ensure_cold_table
from warehouse.lakehouse import Lakehouse
from warehouse.maintenance import maintain, tidy_tables, usage
from warehouse.snapshots import arrow_row_bytes, live_files, read_data_files
from warehouse.sql import local_path
from warehouse.tables import RAW_EVENTS, ensure_table
from warehouse.tiering import tier

TOPIC = "maint"


def ingest_like(settings: Settings, events: list[dict], batch_size: int, first_offset: int = 0) -> None:
    """Append raw events in small batches the way ingest commits: offsets in summary and property."""
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    now = datetime.now(UTC)
    for start in range(0, len(events), batch_size):
        batch = events[start : start + batch_size]
        offset = first_offset + start
        rows = [event_row(decode_event(encode_event(e)), TOPIC, 0, offset + i, now) for i, e in enumerate(batch)]
        marker = json.dumps({"0": offset + len(batch)})
        with table.transaction() as tx:
            tx.append(
                pa.Table.from_pylist(rows, schema=RAW_EVENTS.arrow_schema()),
                snapshot_properties={offsets_key(TOPIC): marker},
            )
            tx.set_properties({offsets_key(TOPIC): marker})


@pytest.mark.slow
def test_maintain_compacts_expires_and_keeps_incremental_assembly(settings: Settings) -> None:
    settings = load_settings(compact_min_files=3, snapshot_retention_hours=0)
    events = day_events(2, 4)
    ingest_like(settings, events, batch_size=40)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    before_state = lake_state(settings)
    catalog = open_catalog(settings)
    raw = ensure_table(catalog, settings, RAW_EVENTS.name)
    offsets = recorded_offsets(raw, TOPIC)
    before = usage(raw)
    assert before.max_files_per_partition > 3
    # A file no snapshot references (a writer that died before committing), old enough to go.
    stray = os.path.join(local_path(raw.location()), "data", "stray-uncommitted.parquet")
    with open(stray, "wb") as handle:
        handle.write(b"not referenced")
    old = time.time() - 7200
    os.utime(stray, (old, old))

    reports = {r.table: r for r in maintain(Lakehouse.open(settings), orphan_min_age=timedelta(hours=1))}

    report = reports[f"{settings.namespace}.raw_events"]
    assert report.before.files == before.files
    assert report.files_rewritten == before.files and report.after.files < before.files
    assert report.after.max_files_per_partition <= settings.compact_min_files - 1
    assert report.snapshots_expired > 0
    assert report.orphans_removed >= 1 and not os.path.exists(stray)
    assert lake_state(settings) == before_state
    raw = catalog.load_table(raw.name())
    assert recorded_offsets(raw, TOPIC) == offsets
    # Assembly's watermark survived expiry and compaction: nothing to re-read.
    stats = assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    assert not stats.full_rebuild and stats.new_files == 0 and stats.sessions == 0
    # And the next batch is read incrementally: only its own files.
    late = day_events(3, 1)[-20:]
    ingest_like(settings, late, batch_size=20, first_offset=len(events))
    stats = assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    assert not stats.full_rebuild and stats.new_files == 1
    # Every data file maintenance left is readable (nothing referenced was deleted as an orphan).
    assert lake_state(settings)["events"] == sorted(before_state["events"] + [(len(events) + i,) for i in range(20)])


def test_unassembled_files_are_not_compacted(settings: Settings) -> None:
    settings = load_settings(compact_min_files=2, snapshot_retention_hours=0)
    events = day_events(1, 4)
    ingest_like(settings, events[:60], batch_size=20)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    ingest_like(settings, events[60:], batch_size=20, first_offset=60)
    catalog = open_catalog(settings)
    assembled_at = ensure_table(catalog, settings, "trajectories").properties[ASSEMBLED_SNAPSHOT]
    reports = {r.table: r for r in maintain(Lakehouse.open(settings), orphan_min_age=timedelta(hours=1))}
    assert reports[f"{settings.namespace}.raw_events"].files_rewritten == 3
    raw = catalog.load_table((settings.namespace, RAW_EVENTS.name))
    assert raw.snapshot_by_id(int(assembled_at)) is not None, "expiry dropped assembly's watermark"
    new_batches = -(-(len(events) - 60) // 20)
    stats = assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    assert not stats.full_rebuild and stats.new_files == new_batches


@pytest.mark.slow
def test_maintain_bounds_cold_files_after_repeated_tiering(settings: Settings) -> None:
    settings = load_settings(compact_min_files=2, snapshot_retention_hours=0)
    ingest_like(settings, day_events(4, 2), batch_size=200)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    before = lake_state(settings)
    for day in range(1, 5):  # one tier run per day: many small cold files per table
        tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=7 + day))
    reports = {r.table: r for r in maintain(Lakehouse.open(settings), orphan_min_age=timedelta(0))}
    for name in ("raw_events", "trajectories", "steps"):
        report = reports[f"{settings.namespace}_cold.{name}"]
        assert report.after.max_files_per_partition <= 1, report.as_dict()
    assert lake_state(settings) == before


@pytest.mark.slow
def test_lifecycle_assets_materialize(settings: Settings) -> None:
    from dagster import materialize

    from dagster_project.defs import lifecycle
    from dagster_project.resources import LakehouseResource

    ingest_like(settings, day_events(3, 2), batch_size=100)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    before = lake_state(settings)
    # Retention long enough back that 2026-01-01.. is old whatever today's date is.
    lakehouse = LakehouseResource(home=str(settings.home))
    result = materialize([lifecycle.cold_tier, lifecycle.table_maintenance], resources={"lakehouse": lakehouse})
    assert result.success
    metadata = materialized(result)
    assert metadata["cold_tier"]["sessions_copied"] == 6
    assert metadata["table_maintenance"]["files_after"] <= metadata["table_maintenance"]["files_before"]
    assert lake_state(settings) == before


def _small_files_lake(sessions: int, batch_size: int) -> tuple[Settings, Any, Table, Any]:
    """A day of ``sessions`` ingested in small batches and assembled; compaction allowed from 2 files."""
    settings = load_settings(compact_min_files=2, snapshot_retention_hours=0)
    ingest_like(settings, day_events(1, sessions), batch_size=batch_size)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    before = lake_state(settings)
    catalog = open_catalog(settings)
    return settings, catalog, ensure_table(catalog, settings, RAW_EVENTS.name), before


@pytest.mark.slow
def test_compaction_and_tiering_work_in_bounded_bundles(settings: Settings) -> None:
    """Neither a rewrite nor a tier copy reads a whole partition: bundles of about the target size."""
    settings, catalog, raw, before = _small_files_lake(sessions=4, batch_size=10)
    files = raw.inspect.files()
    largest = max(files.column("file_size_in_bytes").to_pylist())
    target = 3 * largest  # a bundle holds about three of the small files
    with raw.transaction() as tx:
        tx.set_properties({"write.target-file-size-bytes": str(target)})
    reports = {r.table: r for r in maintain(Lakehouse.open(settings), orphan_min_age=timedelta(hours=1))}
    report = reports[f"{settings.namespace}.raw_events"]
    assert report.files_rewritten >= files.num_rows - 1
    assert report.after.files >= 2  # several session ranges, not one partition-sized file
    assert lake_state(settings) == before

    hot_files = catalog.load_table(raw.name()).inspect.files().column("file_size_in_bytes").to_pylist()
    assert len(hot_files) >= 2
    settings = settings.model_copy(update={"cold_target_file_bytes": min(hot_files)})  # a bundle per hot file
    stats = tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    cold_raw = ensure_cold_table(catalog, settings, RAW_EVENTS.name)
    assert stats.events_copied == len(day_events(1, 4))
    copies = [
        s
        for s in catalog.load_table(cold_raw.name()).snapshots()
        if "trajlake.tiered-from-snapshot" in (s.summary.additional_properties if s.summary else {})
    ]
    assert len(copies) >= 2, (stats, hot_files)  # one commit per bundle
    assert lake_state(settings) == before


@pytest.mark.slow
def test_compaction_is_bounded_in_arrow_memory_and_writes_disjoint_session_ranges(settings: Settings) -> None:
    """Parquet sizes say little about memory (trajectory data compresses 10-30×): a rewrite bundle is
    also bounded by its rows' Arrow bytes; the new files are disjoint ranges of sessions."""
    settings, catalog, raw, before = _small_files_lake(sessions=40, batch_size=100)
    files = live_files(raw)
    row_bytes = arrow_row_bytes(raw, files)
    memory = int(row_bytes * max(f.data_file.record_count for f in files) * 3.5)  # about three files a bundle
    maintain(
        Lakehouse.open(settings.model_copy(update={"rewrite_memory_bytes": memory})), orphan_min_age=timedelta(hours=1)
    )
    after = live_files(catalog.load_table(raw.name()))
    assert 2 <= len(after) <= len(files) // 2, (len(files), len(after))
    # ranges come from sampled quantiles and never split a session: about the bound, not exactly
    assert max(f.data_file.record_count for f in after) * row_bytes <= memory * 1.25
    # the files are disjoint ranges of sessions: each session's rows are in one file
    where: dict[str, str] = {}
    for entry in after:
        rows = read_data_files(catalog.load_table(raw.name()), [entry.data_file], columns=("session_id",))
        for session in set(rows.column("session_id").to_pylist()):
            assert where.setdefault(session, entry.path) == entry.path
    assert len(where) == 40
    assert lake_state(settings) == before


def test_a_followers_upkeep_expires_but_keeps_offsets_and_assemblys_watermark(settings: Settings) -> None:
    # What `ingest --follow` runs between commits by default: expiry only, no compaction.
    settings = load_settings()
    events = day_events(1, 4)
    ingest_like(settings, events[:60], batch_size=20)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    ingest_like(settings, events[60:], batch_size=20, first_offset=60)
    catalog = open_catalog(settings)
    raw = catalog.load_table((settings.namespace, RAW_EVENTS.name))
    offsets, files, snapshots = recorded_offsets(raw, TOPIC), usage(raw).files, len(raw.snapshots())
    assembled_at = int(ensure_table(catalog, settings, "trajectories").properties[ASSEMBLED_SNAPSHOT])

    reports = tidy_tables(Lakehouse.open(settings), (RAW_EVENTS.name,), datetime.now(UTC), None)

    raw = catalog.load_table(raw.name())
    kept = {s.snapshot_id for s in raw.snapshots()}
    assert reports[0].snapshots_expired == snapshots - len(kept) > 0
    assert reports[0].files_rewritten == 0 and usage(raw).files == files
    # Only the watermark and what came after it are left: what assembly reads next.
    assert assembled_at in kept and len(kept) == 1 + -(-(len(events) - 60) // 20)
    assert recorded_offsets(raw, TOPIC) == offsets
    stats = assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    assert not stats.full_rebuild and stats.new_files == len(kept) - 1
