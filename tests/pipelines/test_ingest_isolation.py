"""One record ingest cannot write never stops ingest: it is isolated, the rest lands, the next run goes on."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform
from pyiceberg.types import LongType, NestedField, TimestamptzType

from common.settings import Settings
from pipelines.assemble import assemble
from pipelines.decode import ROW_INDEX
from pipelines.decode.files import isolate_unwritable
from pipelines.decode.results import TS_MAX_US, TS_MIN_US, clamp_event_times
from pipelines.ingest import Batch, IngestWorker, dead_letter_row
from schemas.registry import encode_event
from tests.helpers import produce, sample_events
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.transactions import data_files

YEAR_0 = -62_167_219_200_000_000  # 0000-01-01T00:00:00Z in µs
YEAR_10000 = 253_402_300_800_000_000  # 10000-01-01T00:00:00Z in µs
EXTREME_TS = {"year_0": YEAR_0, "year_10000": YEAR_10000, "long_max": 2**63 - 1, "long_min": -(2**63)}
CLAMPED = {"year_0": TS_MIN_US, "year_10000": TS_MAX_US, "long_max": TS_MAX_US, "long_min": TS_MIN_US}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("neighbour", ["none", "truncated"])
def test_out_of_range_timestamps_land_clamped_with_the_value_as_sent(kafka_settings: Settings, neighbour: str) -> None:
    """Year 0, year 10000 and the Avro long's extremes used to stop ingest for good (OverflowError
    naming the day partition, on every run). They land, clamped to the range ``ts`` holds, with
    the value as sent in ``ts_raw_us``, beside the good events of other sessions. A truncated
    record next to them sends their block through the record-by-record path: same outcome."""
    events = sample_events(4, seed=31)
    sessions = sorted({e["session_id"] for e in events})
    template = next(e for e in events if e["session_id"] == sessions[0])
    good = [e for e in events if e["session_id"] != sessions[0]]
    extreme = {
        name: dict(template, ts=ts, event_id=f"extreme-{name}", session_id=f"extreme-{name}")
        for name, ts in EXTREME_TS.items()
    }
    poison = [encode_event(good[0])[:-3]] if neighbour == "truncated" else []
    produce(kafka_settings, good + list(extreme.values()), poison)

    stats = IngestWorker(kafka_settings).run(until_idle=1)
    assert (stats.events, stats.dead_letters) == (len(good) + len(extreme), len(poison))
    rows = run_query(kafka_settings, "SELECT event_id, epoch_us(ts), ts_raw_us FROM events")[1]
    landed = {event_id: (ts, raw) for event_id, ts, raw in rows}
    assert len(landed) == len(rows) == len(good) + len(extreme)
    for e in good:
        assert landed[e["event_id"]][1] is None
    for name, ts in EXTREME_TS.items():
        assert landed[f"extreme-{name}"] == (CLAMPED[name], ts), name
    again = IngestWorker(kafka_settings).run(until_idle=1)
    assert (again.events, again.dead_letters) == (0, 0)

    # Assembly over such rows: every session lands, the clamped ones on the first or last day.
    assembled = assemble(Lakehouse.open(kafka_settings))
    assert assembled.skipped_sessions == 0
    started = dict(run_query(kafka_settings, "SELECT session_id, epoch_us(started_at) FROM trajectories")[1])
    assert set(started) == {e["session_id"] for e in good} | {f"extreme-{name}" for name in EXTREME_TS}
    for name in EXTREME_TS:
        assert started[f"extreme-{name}"] == CLAMPED[name]


def test_clamping_keeps_in_range_times_as_they_are() -> None:
    ts = pa.array([0, TS_MIN_US, TS_MAX_US, YEAR_0, YEAR_10000, None], pa.int64()).cast(pa.timestamp("us", "UTC"))
    clamped, raw = clamp_event_times(ts)
    assert clamped.cast(pa.int64()).to_pylist() == [0, TS_MIN_US, TS_MAX_US, TS_MIN_US, TS_MAX_US, None]
    assert raw.to_pylist() == [None, None, None, YEAR_0, YEAR_10000, None]
    same, none = clamp_event_times(ts.slice(0, 3))
    assert same.equals(ts.slice(0, 3)) and none.null_count == 3


def test_a_kafka_timestamp_past_year_9999_is_no_time() -> None:
    batch = Batch()
    batch.data += b"x"
    batch.ends.append(1)
    batch.partitions.append(0)
    batch.offsets.append(0)
    batch.timestamps.append(2**63 - 1)
    batch.keys.append(None)
    row = dead_letter_row(batch, 0, "t", "bad_magic", "x", datetime.now(UTC))
    assert row["kafka_timestamp"] is None


def _day_table(tmp_path: Path) -> tuple[SqlCatalog, Table]:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("n")
    schema = Schema(NestedField(1, "t", TimestamptzType()), NestedField(2, ROW_INDEX, LongType()))
    spec = PartitionSpec(PartitionField(1, 1000, DayTransform(), "t_day"))
    return catalog, catalog.create_table("n.days", schema, partition_spec=spec)


def test_bisecting_isolates_the_rows_a_write_refuses_and_writes_the_rest(tmp_path: Path) -> None:
    """A day-partitioned write of a timestamp past 9999 raises OverflowError (pyiceberg cannot name
    the day): without bisection the whole batch failed. The two bad rows are named, the rest written."""
    _, table = _day_table(tmp_path)
    micros = [1_767_225_600_000_000 + i * 3_600_000_000 for i in range(40)]
    micros[7], micros[31] = YEAR_10000, YEAR_0
    rows = pa.table(
        {"t": pa.array(micros, pa.int64()).cast(pa.timestamp("us", "UTC")), ROW_INDEX: pa.array(range(40), pa.int64())}
    )
    with pytest.raises(OverflowError):
        data_files(table.metadata, rows, table.io, uuid.uuid4())

    def write(part: pa.Table) -> list:
        return data_files(table.metadata, part, table.io, uuid.uuid4())

    written, unwritable = isolate_unwritable(rows, write)
    assert [index for index, _ in unwritable] == [7, 31]
    assert all(exc.reason == "unwritable" and "OverflowError" in str(exc) for _, exc in unwritable)
    assert sum(f.record_count for files in written for f in files) == 38


def test_an_error_of_the_place_written_to_is_not_the_rows_fault(tmp_path: Path) -> None:
    """An OSError (an unreachable store, a full disk) stops the batch as before: good events are never
    turned into dead letters by an outage."""
    rows = pa.table({"t": pa.array([1], pa.int64()), ROW_INDEX: pa.array([0], pa.int64())})

    def unreachable(part: pa.Table) -> None:
        raise ConnectionRefusedError("object store unreachable")

    with pytest.raises(ConnectionRefusedError):
        isolate_unwritable(rows, unreachable)
