"""Offset bookkeeping without Kafka: the pure functions behind ingest's exactly-once commits."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from common.settings import Settings
from pipelines.ingest import (
    Incarnation,
    IngestStats,
    IngestTimings,
    advanced_offsets,
    batch_next_offsets,
    dumps_offsets,
    incarnation_key,
    loads_offsets,
    merge_offsets,
    offsets_key,
    recorded_incarnation,
    recorded_offsets,
    start_offsets,
    unrecorded_rows,
)
from warehouse.catalog import open_catalog
from warehouse.tables import DEAD_LETTERS, ensure_table
from warehouse.transactions import transaction

partitions = st.integers(0, 11)
offset_values = st.integers(0, 10**12)
offset_maps = st.dictionaries(partitions, offset_values, max_size=8)
# A batch's next offsets are one past a record's offset, so at least 1.
next_offset_maps = st.dictionaries(partitions, st.integers(1, 10**12), max_size=8)
# A batch: (partition, offset) per row, offsets of one partition distinct as in Kafka.
batches = st.lists(st.tuples(partitions, st.integers(0, 500)), max_size=60, unique=True)


def as_arrays(rows: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([p for p, _ in rows], dtype=np.int32), np.array([o for _, o in rows], dtype=np.int64)


@given(st.lists(offset_maps, max_size=4))
def test_merge_takes_the_highest_offset_of_every_partition_in_any_order(sources: list[dict[int, int]]) -> None:
    merged = merge_offsets(*sources)
    assert set(merged) == set().union(*sources)
    for partition, offset in merged.items():
        assert offset == max(source[partition] for source in sources if partition in source)
    assert merge_offsets(*reversed(sources)) == merged
    assert merge_offsets(merged, *sources) == merged  # idempotent: merging again changes nothing


@given(offset_maps, next_offset_maps)
def test_recorded_offsets_never_move_backwards(recorded: dict[int, int], next_offsets: dict[int, int]) -> None:
    advanced = advanced_offsets(next_offsets, recorded)
    assert advanced == {p: o for p, o in next_offsets.items() if o > recorded.get(p, 0)}
    merged = merge_offsets(recorded, advanced)
    assert all(merged[p] >= o for p, o in recorded.items())  # a stale batch (zombie) lowers nothing
    assert all(merged[p] == o for p, o in advanced.items())
    assert merged == merge_offsets(recorded, next_offsets)  # only the advanced partitions matter
    assert advanced_offsets(next_offsets, merged) == {}  # once committed, the batch holds nothing new


@given(batches, offset_maps)
def test_unrecorded_rows_are_exactly_those_at_or_past_their_partitions_offset(
    rows: list[tuple[int, int]], recorded: dict[int, int]
) -> None:
    partitions_, offsets = as_arrays(rows)
    keep = unrecorded_rows(partitions_, offsets, recorded)
    assert keep.dtype == np.bool_ and keep.shape == (len(rows),)
    assert keep.tolist() == [o >= recorded.get(p, 0) for p, o in rows]


@given(batches)
def test_next_offsets_of_a_batch_are_one_past_its_highest_offset_per_partition(rows: list[tuple[int, int]]) -> None:
    partitions_, offsets = as_arrays(rows)
    expected: dict[int, int] = {}
    for p, o in rows:
        expected[p] = max(expected.get(p, 0), o + 1)
    assert batch_next_offsets(partitions_, offsets) == expected


@given(batches, offset_maps)
def test_a_committed_batch_replayed_adds_nothing_and_its_new_rows_land_once(
    rows: list[tuple[int, int]], recorded: dict[int, int]
) -> None:
    """The replay rule end to end: commit a batch's unrecorded rows with its offsets, then replay it."""
    partitions_, offsets = as_arrays(rows)
    first = unrecorded_rows(partitions_, offsets, recorded)
    after = merge_offsets(recorded, advanced_offsets(batch_next_offsets(partitions_, offsets), recorded))
    assert not unrecorded_rows(partitions_, offsets, after).any()  # a crash replay or a zombie: all dropped
    # Everything kept the first time lies below the new offsets, everything dropped lay below the old ones.
    assert all(o < after[p] for (p, o), kept in zip(rows, first, strict=True) if kept)


@given(offset_maps, offset_maps)
def test_a_restart_begins_at_the_lower_table_and_0_where_a_table_has_nothing(
    raw: dict[int, int], dead: dict[int, int]
) -> None:
    start = start_offsets(raw, dead)
    assert set(start) == set(raw) | set(dead)
    for partition, offset in start.items():
        assert offset == min(raw.get(partition, 0), dead.get(partition, 0))
        assert offset <= raw.get(partition, 0) and offset <= dead.get(partition, 0)
    assert start_offsets(raw) == raw


@given(offset_maps)
def test_offsets_round_trip_through_their_property_value(offsets: dict[int, int]) -> None:
    text = dumps_offsets(offsets)
    assert loads_offsets(text) == offsets
    assert list(json.loads(text)) == [str(p) for p in sorted(offsets)]


def test_the_property_value_keeps_its_stored_format() -> None:
    # Tables written before this module existed hold exactly this shape.
    assert dumps_offsets({2: 7, 0: 5, 10: 1}) == '{"0": 5, "2": 7, "10": 1}'
    assert loads_offsets('{"1": 3, "0": 9}') == {0: 9, 1: 3}


@given(st.integers(0, 1000), st.none() | st.text(min_size=1, max_size=30))
def test_incarnation_round_trips_and_missing_means_epoch_0(epoch: int, topic_id: str | None) -> None:
    incarnation = Incarnation(epoch, topic_id)
    assert Incarnation.parse(incarnation.dumps()) == incarnation
    assert Incarnation.parse(None) == Incarnation.parse("") == Incarnation(0, None)


def test_recorded_offsets_merge_property_and_summary_and_ignore_an_older_epoch(settings: Settings) -> None:
    """On a real (local) Iceberg table: the max of property and newest summary, the stale epoch left out."""
    table = ensure_table(open_catalog(settings), settings, DEAD_LETTERS.name)
    topic = settings.topic
    key, inc_key = offsets_key(topic), incarnation_key(topic)
    empty = DEAD_LETTERS.arrow_schema().empty_table()
    with transaction(table) as tx:  # a snapshot summary ahead on partition 0
        tx.append(empty, snapshot_properties={key: dumps_offsets({0: 9, 1: 2}), inc_key: Incarnation(1).dumps()})
    table = table.refresh()
    with transaction(table) as tx:  # the table property ahead on partition 1
        tx.set_properties({key: dumps_offsets({0: 4, 1: 6, 2: 1}), inc_key: Incarnation(1).dumps()})
    table = table.refresh()
    assert recorded_incarnation(table, topic) == Incarnation(1)
    assert recorded_offsets(table, topic) == {0: 9, 1: 6, 2: 1}
    with transaction(table) as tx:  # the property moves to epoch 2 (a reset): the epoch-1 summary no longer counts
        tx.set_properties({key: dumps_offsets({0: 3}), inc_key: Incarnation(2, "new-id").dumps()})
    table = table.refresh()
    assert recorded_incarnation(table, topic) == Incarnation(2, "new-id")
    assert recorded_offsets(table, topic) == {0: 3}
    assert recorded_offsets(table, "another-topic") == {}


def test_stats_report_the_same_keys_and_keep_phase_timings_apart() -> None:
    stats = IngestStats(events=3)
    stats.timings.consume_s = 1.5
    report = stats.as_dict()
    assert "timings" not in report and report["events"] == 3
    assert set(report) == {
        "events",
        "dead_letters",
        "skipped",
        "batches",
        "commit_retries",
        "resets",
        "reset_duplicates",
        "resent_duplicates",
        "gaps",
        "truncations",
        "reset_details",
        "bytes",
        "seconds",
        "reasons",
    }
    assert IngestTimings().first_record_to_last_commit_s == 0.0
    assert IngestTimings(first_record_at=10.0, last_commit_at=12.5).first_record_to_last_commit_s == 2.5
