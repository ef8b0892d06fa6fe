"""Commit cost against the table's history: one small append to raw_events whose metadata holds N snapshots.

Every Iceberg commit reads the table's metadata file and writes a new one, and the metadata holds
every snapshot still kept: a follower committing once a second adds ~1 kB a commit until its upkeep
expires them (``TRAJLAKE_INGEST_FOLLOW_RETENTION_SECONDS``). A 60-second freshness run never sees
a long history, so this bench builds one: a real raw_events table with a few real commits, whose
metadata is then grown to N snapshots (copies of the real ones under new ids, chained, the real
current snapshot last) and written as a new metadata file the catalog points to. Each round moves
the pointer back to that file, so every measured commit starts from N snapshots.

The figure is CPU time (this process) of what ingest does per commit — refresh the table, stage an
append of 100 rows with properties, commit through the catalog — with the staging trajlake uses
(:func:`warehouse.catalog.apply_updates`: updates applied copy-on-write) against, in the same run
and alternated, pyiceberg's own staging (``update_table_metadata``, which ends with a deep copy of
the whole metadata, in the transaction and again in the catalog).
"""

from __future__ import annotations

import contextlib
import copy
import json
import sqlite3
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table
from pyiceberg.table.update import update_table_metadata

import warehouse.catalog as catalog_module
import warehouse.transactions as transactions_module
from benchmarks.harness import Figure, bench_home, print_figures
from common.settings import CATALOG_FILE, Settings
from warehouse.catalog import open_catalog
from warehouse.tables import RAW_EVENTS, ensure_table
from warehouse.transactions import transaction


def _rows(n: int, start: int) -> pa.Table:
    """``n`` raw-events rows: ids, sessions, seq and Kafka coordinates; the other columns null."""
    schema = RAW_EVENTS.arrow_schema()
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns["event_id"] = pa.array([f"bench-{i}" for i in range(start, start + n)])
    columns["session_id"] = pa.array([f"s{i % 7}" for i in range(start, start + n)])
    columns["seq"] = pa.array(range(start, start + n), pa.int64())
    columns["kafka_partition"] = pa.array([0] * n, pa.int32())
    columns["kafka_offset"] = pa.array(range(start, start + n), pa.int64())
    return pa.table(columns).cast(schema)


@contextlib.contextmanager
def pyiceberg_staging() -> Iterator[None]:
    """Stage commits as pyiceberg does (a deep copy of the whole metadata per application), as before."""

    def deep(base: Any, updates: Any, metadata_location: str | None = None) -> Any:
        return update_table_metadata(base, updates, metadata_location=metadata_location)

    saved = transactions_module.apply_updates, catalog_module._LeanSqlCatalog._update_and_stage_table
    transactions_module.apply_updates = deep
    catalog_module._LeanSqlCatalog._update_and_stage_table = SqlCatalog._update_and_stage_table  # type: ignore[method-assign]
    try:
        yield
    finally:
        transactions_module.apply_updates, catalog_module._LeanSqlCatalog._update_and_stage_table = saved  # type: ignore[method-assign]


def _grown(table: Table, snapshots: int) -> str:
    """Write ``table``'s metadata grown to ``snapshots`` snapshots as a new metadata file; returns its location."""
    with table.io.new_input(table.metadata_location).open() as stream:
        document = json.loads(stream.read())
    real = document["snapshots"]
    current = next(s for s in real if s["snapshot-id"] == document["current-snapshot-id"])
    grown: list[dict[str, Any]] = []
    parent: int | None = None
    for i in range(snapshots - 1):
        snapshot = copy.deepcopy(real[i % len(real)])
        snapshot["snapshot-id"] = 7 * 10**15 + snapshots * 10**6 + i
        snapshot["timestamp-ms"] = current["timestamp-ms"] - (snapshots - i) * 700
        snapshot.pop("parent-snapshot-id", None)
        if parent is not None:
            snapshot["parent-snapshot-id"] = parent
        parent = snapshot["snapshot-id"]
        grown.append(snapshot)
    last = dict(current)
    if parent is not None:
        last["parent-snapshot-id"] = parent
    grown.append(last)
    document["snapshots"] = grown
    document["snapshot-log"] = [{"snapshot-id": s["snapshot-id"], "timestamp-ms": s["timestamp-ms"]} for s in grown]
    document["metadata-log"] = []
    folder = table.metadata_location.rsplit("/", 1)[0]
    location = f"{folder}/{99_999 - snapshots:05d}-{uuid.uuid4()}.metadata.json"
    with table.io.new_output(location).create() as out:
        out.write(json.dumps(document).encode())
    return location


def _point(settings: Settings, table: Table, location: str) -> None:
    """Point the SQLite catalog's raw_events at ``location`` (what a commit does, without one)."""
    namespace, name = ".".join(table.name()[:-1]), table.name()[-1]
    with contextlib.closing(sqlite3.connect(settings.home_path / CATALOG_FILE)) as db:
        db.execute(
            "UPDATE iceberg_tables SET metadata_location = ? WHERE table_namespace = ? AND table_name = ?",
            (location, namespace, name),
        )
        db.commit()


def _commit_cpu(table: Table, start: int) -> float:
    """CPU seconds of one ingest-shaped commit: refresh, append 100 rows with properties, commit."""
    started = time.process_time()
    table = table.refresh()
    with transaction(table) as tx:
        tx.append(_rows(100, start), snapshot_properties={"trajlake.bench": str(start)})
        tx.set_properties({"trajlake.bench": str(start)})
    return time.process_time() - started


def bench_commits(snapshots: tuple[int, ...] = (100, 1_000, 5_000), rounds: int = 5) -> dict[str, Any]:
    """Commit CPU at each history size: trajlake's staging against pyiceberg's, alternated (see the module)."""
    result: dict[str, Any] = {"rounds": rounds}
    figures: list[Figure] = []
    with bench_home(kafka=False) as settings:
        table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
        for n in range(3):
            with transaction(table) as tx:
                tx.append(_rows(100, 1_000 * n))
            table = table.refresh()
        start = 10**6
        for size in snapshots:
            location = _grown(table, size)
            cpu: dict[str, list[float]] = {"trajlake": [], "pyiceberg": []}
            for round_ in range(rounds):
                for mode in ("trajlake", "pyiceberg") if round_ % 2 == 0 else ("pyiceberg", "trajlake"):
                    _point(settings, table, location)
                    start += 100
                    with pyiceberg_staging() if mode == "pyiceberg" else contextlib.nullcontext():
                        cpu[mode].append(_commit_cpu(table, start))
            ours, theirs = statistics.median(cpu["trajlake"]), statistics.median(cpu["pyiceberg"])
            with table.io.new_input(location).open() as stream:
                megabytes = len(stream.read()) / 1e6
            print(
                f"  {size:6,d} snapshots ({megabytes:.2f} MB of metadata): trajlake {ours * 1e3:.0f} ms CPU per commit "
                f"(rounds {', '.join(f'{x * 1e3:.0f}' for x in cpu['trajlake'])}), pyiceberg's staging "
                f"{theirs * 1e3:.0f} ms ({', '.join(f'{x * 1e3:.0f}' for x in cpu['pyiceberg'])})",
                flush=True,
            )
            result[f"trajlake_ms @{size}"] = ours * 1e3
            result[f"pyiceberg_ms @{size}"] = theirs * 1e3
            figures.append(
                Figure(
                    f"CPU per 100-row commit to raw_events with {size:,} snapshots of history",
                    ours * 1e3,
                    theirs * 1e3,
                    "ms",
                    higher_is_better=False,
                )
            )
    result["figures"] = [f.as_dict() for f in figures]
    print_figures("commits", figures, result)
    return result
