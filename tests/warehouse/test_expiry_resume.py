"""Snapshot expiry never loses ingest offsets: a new ingest resumes exactly (no re-read, no skip)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from common.settings import Settings
from pipelines.ingest import IngestWorker, offsets_key, recorded_incarnation, recorded_offsets
from tests.helpers import produce, sample_events, summary_of
from warehouse.catalog import open_catalog
from warehouse.maintenance import expire_snapshots
from warehouse.query import run_query
from warehouse.tables import DEAD_LETTERS, RAW_EVENTS, ensure_table

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_ingest_resumes_exactly_after_expiring_every_offset_carrying_snapshot(kafka_settings: Settings) -> None:
    rounds = [sample_events(4, seed=31), sample_events(3, seed=32)]
    for i, events in enumerate(rounds):
        produce(kafka_settings, events, extra_values=[f"poison {i}".encode()])
        assert IngestWorker(kafka_settings).run(until_idle=1).events == len(events)

    catalog = open_catalog(kafka_settings)
    before = {}
    for spec in (RAW_EVENTS, DEAD_LETTERS):
        table = ensure_table(catalog, kafka_settings, spec.name)
        before[spec.name] = (
            recorded_offsets(table, kafka_settings.topic),
            recorded_incarnation(table, kafka_settings.topic),
        )
        # A foreign commit (no offsets in its summary) becomes current, then every older snapshot expires:
        # only the table properties still carry the offsets.
        table.append(pa.Table.from_pylist([], schema=spec.arrow_schema()))
        table = table.refresh()
        expired = expire_snapshots(table, datetime.now(UTC) + timedelta(hours=1), keep=set())
        table = table.refresh()
        assert expired >= 2 and len(table.snapshots()) == 1
        assert offsets_key(kafka_settings.topic) not in summary_of(table.current_snapshot()).additional_properties
        assert (recorded_offsets(table, kafka_settings.topic), recorded_incarnation(table, kafka_settings.topic)) == (
            before[spec.name]
        )

    last = sample_events(2, seed=33)
    produce(kafka_settings, last, extra_values=[b"poison 2"])
    stats = IngestWorker(kafka_settings).run(until_idle=1)
    assert (stats.events, stats.dead_letters, stats.skipped, stats.resets) == (len(last), 1, 0, 0)
    total = sum(len(r) for r in rounds) + len(last)
    counts = run_query(
        kafka_settings, "SELECT count(*), count(DISTINCT event_id), (SELECT count(*) FROM dead_letters) FROM events"
    )[1][0]
    assert counts == (total, total, 3)
    raw = ensure_table(open_catalog(kafka_settings), kafka_settings, RAW_EVENTS.name)
    assert sum(recorded_offsets(raw, kafka_settings.topic).values()) == total + 3
