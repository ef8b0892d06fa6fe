"""Topic resets: a recreated topic or a restarted memory-only broker neither duplicates nor silently skips."""

from __future__ import annotations

import json
import time

import pytest

from common.broker import admin_client, ensure_topic, resolve_bootstrap, start_broker, stop_broker
from common.settings import Settings, load_settings
from pipelines.ingest import IngestWorker, recorded_incarnation, recorded_offsets, recorded_reset
from tests.helpers import produce, sample_events, summary_of
from warehouse.catalog import open_catalog
from warehouse.query import run_query
from warehouse.tables import DEAD_LETTERS, RAW_EVENTS, ensure_table

pytestmark = pytest.mark.integration


def counts(settings: Settings) -> tuple[int, int, int]:
    sql = (
        "SELECT (SELECT count(*) FROM events), (SELECT count(DISTINCT event_id) FROM events), "
        "(SELECT count(*) FROM dead_letters)"
    )
    return run_query(settings, sql)[1][0]


def recreate_topic(settings: Settings) -> None:
    """Delete the topic, wait until the broker forgets it, and create it again."""
    admin = admin_client(resolve_bootstrap(settings))
    admin.delete_topics([settings.topic])[settings.topic].result(30)
    deadline = time.monotonic() + 60
    while settings.topic in admin.list_topics(timeout=5).topics:
        assert time.monotonic() < deadline, f"{settings.topic} still listed 60 s after deletion"
        time.sleep(0.2)
    ensure_topic(resolve_bootstrap(settings), settings.topic, settings.topic_partitions)


def assert_reset_recorded(settings: Settings, epoch: int) -> None:
    catalog = open_catalog(settings)
    for name in (RAW_EVENTS.name, DEAD_LETTERS.name):
        table = ensure_table(catalog, settings, name)
        reset = recorded_reset(table, settings.topic)
        assert reset is not None and reset["epoch"] == epoch, (name, reset)
        assert recorded_incarnation(table, settings.topic).epoch == epoch
        if epoch < 1:
            continue
        # the commit that crossed the reset carries it in its summary; the worker may have committed
        # again after it (a loaded machine splits a run's events over two commits)
        key = f"trajlake.reset.{settings.topic}"
        carried = [
            summary_of(s).additional_properties[key]
            for s in table.snapshots()
            if key in summary_of(s).additional_properties
        ]
        assert carried and json.loads(carried[-1]) == reset, (name, carried, reset)


@pytest.mark.slow
def test_recreated_topic_is_read_from_its_start_without_duplicates(kafka_settings: Settings) -> None:
    before = sample_events(12, seed=1)
    produce(kafka_settings, before)
    first = IngestWorker(kafka_settings).run(until_idle=1)
    assert (first.events, first.resets) == (len(before), 0)

    recreate_topic(kafka_settings)
    after = sample_events(6, seed=2)
    # A producer re-sending part of the old history (e.g. from its spool) must not duplicate it.
    resent = before[: len(before) // 2]
    produce(kafka_settings, after + resent, extra_values=[b"poison after reset"])
    second = IngestWorker(kafka_settings).run(until_idle=1)

    assert second.resets == 2  # raw_events and dead_letters each start epoch 1
    assert second.events == len(after)
    assert second.reset_duplicates == len(resent)
    assert any("topic reset" in line for line in second.describe_resets())
    assert counts(kafka_settings) == (len(before) + len(after), len(before) + len(after), 1)
    assert_reset_recorded(kafka_settings, epoch=1)
    table = ensure_table(open_catalog(kafka_settings), kafka_settings, RAW_EVENTS.name)
    assert sum(recorded_offsets(table, kafka_settings.topic).values()) == len(after) + len(resent) + 1

    third = IngestWorker(kafka_settings).run(until_idle=1)  # steady state again: nothing re-read
    assert (third.events, third.resets, third.skipped) == (0, 0, 0)


@pytest.mark.slow
def test_restarted_embedded_broker_truncation_is_detected(settings: Settings) -> None:
    """tansu keeps its log in memory: a restart starts every partition at offset 0 again."""
    start_broker(settings)
    try:
        live = load_settings(kafka_bootstrap=resolve_bootstrap(settings))
        before = sample_events(10, seed=3)
        produce(live, before)
        assert IngestWorker(live).run(until_idle=1).events == len(before)

        stop_broker(settings)
        start_broker(settings)
        live = load_settings(kafka_bootstrap=resolve_bootstrap(settings))
        after = sample_events(4, seed=4)
        produce(live, after)
        stats = IngestWorker(live).run(until_idle=1)
        assert stats.resets == 2 and stats.events == len(after)
        assert counts(live) == (len(before) + len(after), len(before) + len(after), 0)
        assert_reset_recorded(live, epoch=1)
    finally:
        stop_broker(settings)


@pytest.mark.slow
def test_cli_ingest_prints_the_reset(kafka_settings: Settings) -> None:
    from typer.testing import CliRunner

    from trajlake.cli import app

    produce(kafka_settings, sample_events(3, seed=5))
    IngestWorker(kafka_settings).run(until_idle=1)
    recreate_topic(kafka_settings)
    produce(kafka_settings, sample_events(2, seed=6))
    result = CliRunner().invoke(app, ["ingest", "--until-idle", "1"])
    assert result.exit_code == 0, result.output
    assert "topic reset" in result.output and "epoch 1" in result.output


@pytest.mark.slow
def test_truncation_without_topic_ids_is_reported_not_silent(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that gives no topic id: a log truncated below the recorded offsets is reported."""
    monkeypatch.setattr(IngestWorker, "fetch_topic_id", lambda self: None)
    start_broker(settings)
    try:
        live = load_settings(kafka_bootstrap=resolve_bootstrap(settings))
        produce(live, sample_events(10, seed=7))
        IngestWorker(live).run(until_idle=1)
        stop_broker(settings)
        start_broker(settings)
        live = load_settings(kafka_bootstrap=resolve_bootstrap(settings))
        produce(live, sample_events(2, seed=8))
        stats = IngestWorker(live).run(until_idle=1)
        assert stats.truncations >= 1 and stats.resets == 0
        assert any(line.startswith("suspected truncation") for line in stats.describe_resets())
    finally:
        stop_broker(settings)
