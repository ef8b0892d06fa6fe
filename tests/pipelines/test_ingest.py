"""Ingest against the embedded broker: exactly once, dead letters, crash recovery."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st

from common.memory import STEADY_GC_GEN0
from common.settings import Settings
from pipelines.ingest import IngestWorker, recorded_offsets
from schemas.registry import encode_event
from tests.helpers import produce, sample_events
from warehouse.catalog import open_catalog
from warehouse.query import run_query
from warehouse.tables import RAW_EVENTS, ensure_table

pytestmark = pytest.mark.integration


def counts(settings: Settings) -> tuple[int, int, int]:
    rows = run_query(
        settings,
        "SELECT (SELECT count(*) FROM events), (SELECT count(DISTINCT event_id) FROM events), "
        "(SELECT count(*) FROM dead_letters)",
    )[1]
    return rows[0]


@pytest.mark.slow
def test_ingest_lands_every_event_once_and_rerun_adds_nothing(
    kafka_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = sample_events(30)
    produce(kafka_settings, events)
    worker, collector = IngestWorker(kafka_settings), gc.get_threshold()
    during: list[tuple[int, int]] = []  # the collector as the loop sees it (see common.memory.steady_gc)
    add = worker._add_many

    def spy(messages: list[Message]) -> None:
        during.append((gc.get_threshold()[0], gc.get_freeze_count()))
        add(messages)

    monkeypatch.setattr(worker, "_add_many", spy)
    stats = worker.run(until_idle=2)
    assert stats.events == len(events)
    assert during and all(gen0 >= STEADY_GC_GEN0 and frozen > 0 for gen0, frozen in during)
    assert (gc.get_threshold(), gc.get_freeze_count()) == (collector, 0)
    assert counts(kafka_settings) == (len(events), len(events), 0)
    timings = stats.timings  # the worker's own phase times (what `trajlake bench ingest` reads)
    assert 0 < timings.first_record_to_last_commit_s <= stats.seconds
    assert min(timings.consume_s, timings.decode_s, timings.commit_s) > 0
    again = IngestWorker(kafka_settings).run(until_idle=2)
    assert (again.events, again.dead_letters) == (0, 0)
    assert counts(kafka_settings) == (len(events), len(events), 0)
    table = ensure_table(open_catalog(kafka_settings), kafka_settings, RAW_EVENTS.name)
    offsets = recorded_offsets(table, kafka_settings.topic)
    assert sum(offsets.values()) == len(events)  # next offset per partition = records per partition


@pytest.mark.slow
def test_corrupt_records_go_to_dead_letters_and_the_rest_of_the_batch_lands(kafka_settings: Settings) -> None:
    events = sample_events(5)
    good = encode_event(events[1])
    poison = [b"\x00garbage", good[:-5], b"\xc3\x01" + b"\xff" * 8 + good[10:], good + b"\x01"]
    produce(kafka_settings, events, extra_values=poison)
    stats = IngestWorker(kafka_settings).run(until_idle=2)
    assert (stats.events, stats.dead_letters) == (len(events), len(poison))
    assert counts(kafka_settings) == (len(events), len(events), len(poison))
    columns, rows = run_query(
        kafka_settings,
        "SELECT reason, count(*), bool_and(raw_value IS NOT NULL AND kafka_offset >= 0 AND error <> '') "
        "FROM dead_letters GROUP BY reason ORDER BY reason",
    )
    assert rows == [("bad_magic", 1, True), ("corrupt_payload", 2, True), ("unknown_schema", 1, True)]


@pytest.mark.slow
def test_a_dead_letter_keeps_no_secret_its_sender_left_in_it(kafka_settings: Settings) -> None:
    """The probe: a host that does not redact sends records that cannot be decoded, a secret in the bytes (a
    cut Avro event, JSON text) or in the Kafka key (a session id); dead_letters kept them verbatim -- the one
    table no admission pass ever saw. The record is still kept (reason, coordinates, size), its secrets not."""
    from common.broker import resolve_bootstrap
    from producers.sdk import EventProducer

    token = "gh" + "p_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
    event = sample_events(1)[0]
    leaky = {**event, "extra": {**(event.get("extra") or {}), "note": f"push with {token}"}}
    cut = encode_event(leaky)[:-3]
    as_json = json.dumps({"session_id": "s", "password": "Zq8#vL2mPw9xKt4R", "token": token}).encode()
    producer = EventProducer(resolve_bootstrap(kafka_settings), kafka_settings.topic, "host-b", redact=False)
    for key, value in [("s1", cut), ("s2", as_json), (token, b"\x00garbage")]:
        producer.send(key, "e", value)
    producer.flush(60)
    stats = IngestWorker(kafka_settings).run(until_idle=2)
    assert stats.dead_letters == 3
    rows = run_query(kafka_settings, "SELECT raw_key, raw_value, error, value_bytes FROM dead_letters")[1]
    stored = b" ".join(bytes(k or b"") + bytes(v or b"") + (e or "").encode() for k, v, e, _ in rows)
    assert b"aB3dE5fG7h" not in stored and b"Zq8#vL2mPw" not in stored
    assert sorted(n for *_, n in rows) == sorted([len(cut), len(as_json), len(b"\x00garbage")])  # as received


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_iceberg_commit", "between_table_commits", "before_commit"])
def test_crash_at_commit_points_neither_duplicates_nor_skips(kafka_settings: Settings, point: str) -> None:
    events = sample_events(20)
    produce(kafka_settings, events, extra_values=[b"poison"])
    env = {**os.environ, "TRAJLAKE_FAULT": point}
    crashed = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", "ingest", "--until-idle", "2"], env=env, capture_output=True
    )
    assert crashed.returncode == -9, crashed.stderr.decode()[-2000:]
    before = counts(kafka_settings)
    assert before[0] == (len(events) if point == "after_iceberg_commit" else 0)
    stats = IngestWorker(kafka_settings).run(until_idle=2)
    assert counts(kafka_settings) == (len(events), len(events), 1)
    assert stats.events == len(events) - before[0]


@pytest.mark.slow
def test_resent_events_are_dropped_within_and_across_workers(kafka_settings: Settings) -> None:
    events = sample_events(12)
    half = len(events) // 2
    produce(kafka_settings, events[:half] + events[:10])  # a producer re-sends ten events at once
    first = IngestWorker(kafka_settings).run(until_idle=2)
    assert (first.events, first.resent_duplicates) == (half, 10)
    # A new worker (a new process in production) warms its window from raw_events.
    produce(kafka_settings, events[half - 5 :])  # five already ingested, the rest new
    second = IngestWorker(kafka_settings).run(until_idle=2)
    assert (second.events, second.resent_duplicates) == (len(events) - half, 5)
    assert counts(kafka_settings) == (len(events), len(events), 0)


@pytest.mark.slow
def test_another_sessions_copy_of_an_event_id_never_drops_the_owners_event(kafka_settings: Settings) -> None:
    """The probe: event ids a second host can know in advance (an import's are derived from a public file, a
    late verdict's from the session and the report) sent first in its own session made ingest drop the owner's
    events as re-sends; a duplicate is one of the same session, never another's."""
    owner = [e for e in sample_events(2, seed=5) if e["session_id"] == sample_events(2, seed=5)[0]["session_id"]]
    squatter = [{**e, "session_id": "squatter", "host_id": "host-b"} for e in owner]
    produce(kafka_settings, squatter)
    IngestWorker(kafka_settings).run(until_idle=2)
    produce(kafka_settings, owner)
    stats = IngestWorker(kafka_settings).run(until_idle=2)  # a new worker: its window warmed from raw_events
    assert (stats.events, stats.resent_duplicates) == (len(owner), 0)
    produce(kafka_settings, owner[:3])  # the owner's own re-send is still dropped
    assert IngestWorker(kafka_settings).run(until_idle=2).resent_duplicates == 3
    landed = run_query(kafka_settings, "SELECT session_id, count(*) FROM events GROUP BY 1 ORDER BY 1")[1]
    assert landed == sorted([(owner[0]["session_id"], len(owner)), ("squatter", len(owner))])


def test_recent_keys_join_session_and_event_in_arrow_as_the_window_is_warmed() -> None:
    """The keys commit checks are the keys a restarted worker warms its window with (session, 0x1F, event id;
    a missing part is empty), whatever the column's string type or chunking."""
    import pyarrow as pa

    from pipelines.ingest.recent_ids import recent_keys
    from warehouse.sql import connect

    sessions, events = ["s1", None, "s3", "s\x1f4"], ["e1", "e2", None, "e4"]
    expected = [
        connect().execute("SELECT coalesce(?, '') || chr(31) || coalesce(?, '')", [s, e]).fetchall()[0][0]
        for s, e in zip(sessions, events, strict=True)
    ]
    assert expected == ["s1\x1fe1", "\x1fe2", "s3\x1f", "s\x1f4\x1fe4"]
    assert recent_keys(pa.array(sessions), pa.array(events)) == expected
    assert recent_keys(pa.chunked_array([sessions[:1], sessions[1:]], pa.large_string()), pa.array(events)) == expected


@given(
    st.lists(st.tuples(st.none() | st.text(max_size=40), st.none() | st.text(max_size=40)), max_size=30),
    st.sampled_from(["string", "large_string"]),
    st.integers(min_value=1, max_value=4),
)
def test_recent_keys_of_any_ids_are_session_0x1f_event_and_tell_different_pairs_apart(
    pairs: list[tuple[str | None, str | None]], kind: str, chunks: int
) -> None:
    """Ids come from every host: whatever text they hold, the key is the session, 0x1F, the event id (missing: empty),
    and two pairs get the same key only when that text is the same."""
    import pyarrow as pa

    from pipelines.ingest.recent_ids import recent_keys

    sessions, events = [s for s, _ in pairs], [e for _, e in pairs]
    step = max(1, -(-len(pairs) // chunks))
    chunked = pa.chunked_array(
        [sessions[i : i + step] for i in range(0, len(sessions), step)] or [[]], getattr(pa, kind)()
    )
    keys = recent_keys(chunked, pa.array(events, pa.string()))
    assert keys == [f"{s or ''}\x1f{e or ''}" for s, e in pairs]
    if not any("\x1f" in (x or "") for pair in pairs for x in pair):
        assert len(set(keys)) == len({(s or "", e or "") for s, e in pairs})


def test_recent_id_window_is_bounded_and_forgets_the_oldest() -> None:
    from pipelines.ingest import RecentIds

    window = RecentIds(3)
    ids = list("abcd")
    assert window.unseen([*ids, "a"]) == [True, True, True, True, False]  # in-batch repeat dropped
    window.remember(ids)
    assert len(window) == 3 and "a" not in window and "d" in window
    assert window.unseen(["a", "b"]) == [True, False]
    assert RecentIds(0).unseen(ids + ids) == [True] * 8  # disabled

    window = RecentIds(5)  # evicts whole batches and then part of the oldest, in arrival order
    for batch in (["a", "b"], ["c", "d", "c"], ["b", "e", "f"], ["g"]):
        window.remember(batch)  # repeats (in the batch or in the window) keep their first place
    assert sorted(window._ids) == ["c", "d", "e", "f", "g"]
    assert window.unseen(["b", "c", "h", "h"]) == [True, False, True, False]
    window.remember([f"x{i}" for i in range(4)])
    assert sorted(window._ids) == ["g", "x0", "x1", "x2", "x3"]


@pytest.mark.slow
def test_decoder_written_files_hold_the_decoded_rows_and_a_partial_commit_rewrites_them(
    kafka_settings: Settings,
) -> None:
    """The decoder process writes a batch's data files; the commit takes them as they are when every row
    is new, and otherwise writes only the new rows again and deletes the decoder's files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.ingest import Written
    from tests.helpers import hold_everything

    events = sample_events(6, seed=21)
    produce(kafka_settings, events)
    worker = IngestWorker(kafka_settings)
    try:
        hold_everything(worker, len(events))
        batch = worker._batch
        written, _ = worker.decode_batch(batch, write=True)
        whole, _ = worker.decode_batch(batch, write=False)
    finally:
        worker.consumer.close()
    assert isinstance(written, Written) and written.files
    assert isinstance(whole, pa.Table)  # decoded here: the whole rows come back
    paths = [f.file_path.removeprefix("file://") for f in written.files]
    from_files = pa.concat_tables(pq.read_table(path) for path in paths).cast(worker.raw_schema)
    key = [("event_id", "ascending")]
    assert from_files.drop(["ingested_at"]).sort_by(key).equals(whole.drop(["ingested_at"]).sort_by(key))
    assert sum(f.record_count for f in written.files) == len(events) == written.keys.num_rows

    # A peer already committed the first half of every partition: only the rest may land.
    offsets = whole.column("kafka_offset").to_numpy()
    partitions = whole.column("kafka_partition").to_numpy()
    half = {int(p): int(np.median(offsets[partitions == p])) for p in np.unique(partitions)}
    first = whole.filter(pa.array(offsets < np.array([half[int(p)] for p in partitions])))
    worker.raw_table, n_first, _ = worker._commit_table(worker.raw_table.refresh, first, half, [])
    ends = {int(p): int(offsets[partitions == p].max()) + 1 for p in np.unique(partitions)}
    worker.raw_table, n_rest, skipped = worker._commit_table(worker.raw_table.refresh, written, ends, [])
    assert (n_first + n_rest, skipped) == (len(events), n_first)
    assert counts(kafka_settings)[:2] == (len(events), len(events))
    assert not any(os.path.exists(path) for path in paths)  # rewritten, so the decoder's files are gone
    committed = {task.file.file_path for task in worker.raw_table.scan().plan_files()}
    assert not committed & {f.file_path for f in written.files}


@pytest.mark.slow
def test_a_batch_of_new_rows_commits_the_decoders_files_and_a_replay_deletes_its_copy(
    kafka_settings: Settings,
) -> None:
    import numpy as np

    from pipelines.ingest import Written
    from tests.helpers import hold_everything

    events = sample_events(4, seed=22)
    produce(kafka_settings, events)
    worker = IngestWorker(kafka_settings)
    try:
        hold_everything(worker, len(events))
        written, _ = worker.decode_batch(worker._batch, write=True)
        replay, _ = worker.decode_batch(worker._batch, write=True)
    finally:
        worker.consumer.close()
    assert isinstance(written, Written) and isinstance(replay, Written)
    partitions = written.keys.column("kafka_partition").to_numpy()
    offsets = written.keys.column("kafka_offset").to_numpy()
    ends = {int(p): int(offsets[partitions == p].max()) + 1 for p in np.unique(partitions)}
    worker.raw_table, n, skipped = worker._commit_table(worker.raw_table.refresh, written, ends, [])
    assert (n, skipped) == (len(events), 0)
    committed = {task.file.file_path for task in worker.raw_table.scan().plan_files()}
    assert committed == {f.file_path for f in written.files}  # taken as written, not rewritten
    worker.raw_table, n, skipped = worker._commit_table(worker.raw_table.refresh, replay, ends, [])
    assert (n, skipped) == (0, len(events))
    assert not any(os.path.exists(f.file_path.removeprefix("file://")) for f in replay.files)
    assert counts(kafka_settings)[:2] == (len(events), len(events))
