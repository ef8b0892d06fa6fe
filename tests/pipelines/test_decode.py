"""Batch decoding gives exactly what decode_event gives record by record, poison records included."""

from __future__ import annotations

import io
import os
import re
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.settings import Settings
from pipelines.decode import BatchDecoder, FileTarget, binary_array, concatenated, with_coordinates
from pipelines.decode.batch import LocalDecoder
from pipelines.decode.resolution import _resolve, conform, fill, plan_for, spread
from pipelines.ingest import event_row
from pipelines.ingest.commit import writer_metadata
from schemas.errors import DecodeError, EncodeError
from schemas.registry import HEADER_LEN, decode_event, encode_event, latest, snake_case, versions
from tests.helpers import sample_events
from tests.strategies import events as event_strategy
from warehouse.catalog import open_catalog
from warehouse.sql import local_path
from warehouse.tables import RAW_EVENTS, ensure_table

TARGET = RAW_EVENTS.arrow_schema()
NOW = datetime(2026, 1, 1, tzinfo=UTC)
MAX_BYTES = 4096


def _message(exc: DecodeError) -> str:
    # fastavro error texts name the buffer object; its address differs between calls.
    return re.sub(r"0x[0-9a-f]+", "0x?", str(exc))


def reference(values: list[bytes], max_bytes: int | None = MAX_BYTES) -> tuple[pa.Table, list[tuple[int, str, str]]]:
    """What per-record decode_event makes of a batch: raw-events rows and (index, reason, message)."""
    rows, dead = [], []
    for index, value in enumerate(values):
        try:
            rows.append(event_row(decode_event(value, max_bytes=max_bytes), "t", 0, index, NOW))
        except DecodeError as exc:
            dead.append((index, exc.reason, _message(exc)))
    return pa.Table.from_pylist(rows, schema=TARGET), dead


def batch(values: list[bytes], decoder: BatchDecoder) -> tuple[pa.Table, list[tuple[int, str, str]]]:
    result = decoder.decode(values)
    n = len(values)
    table = with_coordinates(
        result.events, TARGET, "t", pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()), NOW
    )
    return table, [(index, exc.reason, _message(exc)) for index, exc in result.dead]


def assert_same(values: list[bytes], decoder: BatchDecoder, max_bytes: int | None = MAX_BYTES) -> None:
    got_rows, got_dead = batch(values, decoder)
    want_rows, want_dead = reference(values, max_bytes)
    assert got_dead == want_dead
    assert got_rows.num_rows == want_rows.num_rows
    for name in TARGET.names:
        assert got_rows.column(name).to_pylist() == want_rows.column(name).to_pylist(), name


@pytest.fixture(scope="module")
def decoder() -> Iterator[BatchDecoder]:
    # Isolated: some poison (a value holding two records) makes the Rust reader spin; the child is killed.
    with BatchDecoder(TARGET, MAX_BYTES, isolate=True, timeout_s=3.0) as isolated:
        yield isolated


def _mismatched_kind() -> bytes:
    """A well-formed body whose event_type names another payload kind than the union branch."""
    schema = latest()
    event = dict(sample_events(1)[0])  # session_start
    body = {**event, "event_type": "session_end", "payload": (schema.payload_kinds["session_start"], event["payload"])}
    buffer = io.BytesIO()
    buffer.write(schema.header)
    fastavro.schemaless_writer(buffer, schema.parsed, body)
    return buffer.getvalue()


def poison_records(good: list[bytes]) -> list[bytes]:
    v = good[0]
    return [
        v + b"\x00",  # trailing byte
        v[:-3],  # truncated
        b"junk",  # no magic
        b"",  # empty
        v[:2] + b"\x00" * 8 + v[HEADER_LEN:],  # unknown fingerprint
        v + b"x" * MAX_BYTES,  # oversized
        _mismatched_kind(),
        encode_event({**sample_events(1)[0], "event_id": ""}),
        encode_event({**sample_events(1)[0], "seq": -4}),
        v + good[1][HEADER_LEN:],  # two records in one value: trailing bytes that decode
    ]


def test_clean_batch_matches_per_record_decoding(decoder: BatchDecoder) -> None:
    values = [encode_event(event) for event in sample_events(30)]
    assert_same(values, decoder)


@pytest.mark.slow
def test_poison_records_are_isolated_with_decode_event_reasons(decoder: BatchDecoder) -> None:
    good = [encode_event(event) for event in sample_events(20)]
    poison = poison_records(good)
    values = good[:50] + poison[:5] + good[50:300] + poison[5:] + good[300:]
    assert_same(values, decoder)
    result = decoder.decode(values)
    assert {exc.reason for _, exc in result.dead} == {
        "corrupt_payload",
        "bad_magic",
        "unknown_schema",
        "oversized",
        "invalid_event",
    }
    assert result.events.num_rows == len(good)


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(versions()))
def test_every_writer_version_resolves_to_the_latest_reader(decoder: BatchDecoder, version: int) -> None:
    values = [encode_event(event, version=version) for event in sample_events(10)]
    assert_same(values, decoder)
    assert set(decoder.decode(values).events.column("schema_version").to_pylist()) == {version}


def _defaults(reader: Any, target: pa.DataType, named: dict[str, Any]) -> Iterator[tuple[Any, pa.DataType]]:
    """(default, Arrow type) of every field with a default under a reader record, nested records included."""
    reader = _resolve(reader, named)
    if not (pa.types.is_struct(target) and isinstance(reader, dict) and reader.get("type") == "record"):
        return
    for spec in reader["fields"]:
        field_type = target.field(spec["name"]).type
        if "default" in spec:
            yield spec["default"], field_type
        yield from _defaults(spec["type"], field_type, named)


def test_filled_defaults_are_the_defaults_row_by_row() -> None:
    # A field the writer lacks is filled from one scalar per batch; every default of the reader
    # schema (nulls, numbers, booleans, strings, empty lists, records) must come out as the
    # value-by-value array would.
    plan = plan_for(versions()[1])
    fields = plan.reader_fields.items()
    pairs = [(spec["default"], TARGET.field(name).type) for name, spec in fields if "default" in spec]
    for kind, record in plan.reader_kinds.items():
        pairs += _defaults(record, TARGET.field(kind).type, plan.named)
    assert {repr(default) for default, _ in pairs} >= {"None", "0", "[]", "True", "'tcp'"}
    for default, field_type in pairs:
        for length in (0, 3):
            assert fill(default, length, field_type).equals(pa.array([default] * length, type=field_type))


def test_the_decoder_process_writes_valueless_columns_without_a_dictionary(
    decoder: BatchDecoder, settings: Settings
) -> None:
    # v1 events have no model call: its columns hold no value in the batch's file (see warehouse.parquet_writer).
    table = ensure_table(open_catalog(settings), settings, RAW_EVENTS.name)
    values = [encode_event(event, version=1) for event in sample_events(5)]
    n = len(values)
    target = FileTarget(
        writer_metadata(table.metadata), dict(table.io.properties), "t", np.zeros(n, np.int32), np.arange(n), NOW
    )
    result = decoder.decode_array(binary_array(values), write=target)
    assert result.files and result.events.num_rows == n
    meta = pq.read_metadata(local_path(result.files[0].file_path))
    dictionary = {
        meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).has_dictionary_page
        for i in range(meta.num_columns)
    }
    assert not dictionary["agent_input.model_call.model"]
    assert dictionary["session_id"]


def test_mixed_writer_versions_in_one_batch_keep_their_order(decoder: BatchDecoder) -> None:
    events = sample_events(10)
    all_versions = sorted(versions())
    values = [encode_event(event, version=all_versions[i % len(all_versions)]) for i, event in enumerate(events)]
    assert_same(values, decoder)


def _gathered_payloads(decoder: LocalDecoder, values: list[bytes], version: int) -> dict[str, pa.Array]:
    """Each payload kind's column as it was built before ``spread``: one gather of every row, nulls included."""
    plan = plan_for(versions()[version])
    decoded = decoder._decode_block(plan, concatenated(binary_array(values), range(len(values))), len(values))
    assert decoded is not None
    keys = pa.table({"session_id": decoded.column("session_id"), "seq": decoded.column("seq"), "i": range(len(values))})
    order = pc.sort_indices(keys, sort_keys=[("session_id", "ascending"), ("seq", "ascending"), ("i", "ascending")])
    payload = decoded.column("payload").combine_chunks()
    type_codes, offsets = payload.type_codes.take(order), payload.offsets.take(order)
    kinds = [snake_case(payload.type.field(i).name.rsplit(".", 1)[-1]) for i in range(payload.type.num_fields)]
    columns = {}
    for kind, record in plan.reader_kinds.items():
        target = TARGET.field(kind).type
        if kind not in kinds:
            columns[kind] = pa.nulls(len(values), type=target)
            continue
        code = payload.type.type_codes[kinds.index(kind)]
        index = pc.if_else(pc.equal(type_codes, code), offsets, pa.scalar(None, pa.int32()))
        columns[kind] = conform(payload.field(kinds.index(kind)).take(index), record, target, plan.named)
    return columns


@pytest.mark.fuzz
@given(st.lists(event_strategy(), min_size=1, max_size=30), st.sampled_from(sorted(versions())))
@settings(max_examples=25, deadline=None)
def test_payload_columns_match_one_gather_of_every_row(events: list[dict], version: int) -> None:
    # Each kind's rows are gathered alone and spread over the batch; the columns must equal the
    # previous construction buffer-for-value (Arrow equality, full validation), nulls included.
    events += sample_events(3)  # kinds the strategy does not draw
    try:
        values = [encode_event(event, version=version) for event in events]
    except EncodeError:
        return  # a field this writer version cannot hold
    decoder = LocalDecoder(TARGET, None)
    got = decoder.decode_here(binary_array(values), values, [("session_id", "ascending"), ("seq", "ascending")])
    assert got.events.num_rows == len(values)
    for kind, want in _gathered_payloads(decoder, values, version).items():
        column = got.events.column(kind).combine_chunks()
        column.validate(full=True)
        assert column.equals(want), kind


@pytest.mark.fuzz
@given(
    st.lists(
        st.none()
        | st.fixed_dictionaries(
            {
                "s": st.none() | st.text(max_size=5),
                "i": st.none() | st.integers(-(2**40), 2**40),
                "f": st.none() | st.floats(allow_nan=False),
                "b": st.none() | st.booleans(),
                "l": st.none() | st.lists(st.none() | st.text(max_size=3), max_size=3),
                "r": st.none() | st.fixed_dictionaries({"x": st.none() | st.integers(0, 9)}),
            }
        ),
        min_size=1,
        max_size=20,
    ),
    st.data(),
)
@settings(max_examples=50, deadline=None)
def test_spread_equals_a_gather_with_null_indices(rows: list[Any], data: st.DataObject) -> None:
    kind = pa.struct(
        {
            "s": pa.large_string(),
            "i": pa.int64(),
            "f": pa.float64(),
            "b": pa.bool_(),
            "l": pa.large_list(pa.large_string()),
            "r": pa.struct({"x": pa.int32()}),
        }
    )
    start = data.draw(st.integers(0, len(rows) - 1))
    array = pa.array(rows, kind).slice(start)  # offsets into the buffers, as a sliced child has
    n = data.draw(st.integers(len(array), len(array) + 10))
    positions = np.sort(data.draw(st.permutations(range(n)))[: len(array)]).astype(np.int64)
    index = np.zeros(n, np.int64)
    index[positions] = np.arange(len(array))
    mask = np.ones(n, bool)
    mask[positions] = False
    got = spread(array, positions, n)
    got.validate(full=True)
    assert got.equals(array.take(pa.array(index, mask=mask)))


@pytest.mark.slow
@given(
    st.lists(event_strategy(), min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 11), st.sampled_from(["flip", "cut", "append"]), st.integers(0, 10_000))),
)
@settings(max_examples=25, deadline=None)
def test_random_events_and_mutations_match_decode_event(
    decoder: BatchDecoder, events: list[dict], mutations: list
) -> None:
    values = [encode_event(event) for event in events]
    for target, how, where in mutations:
        value = bytearray(values[target % len(values)])
        position = HEADER_LEN + where % max(len(value) - HEADER_LEN, 1)
        if how == "flip" and position < len(value):
            value[position] ^= 0xFF
        elif how == "cut":
            value = value[:position]
        else:
            value += bytes([where % 256])
        values[target % len(values)] = bytes(value)
    assert_same(values, decoder)


def test_isolated_decoder_survives_a_block_the_reader_cannot_finish() -> None:
    good = [encode_event(event) for event in sample_events(5)]
    values = good[:20] + [good[0] + good[1][HEADER_LEN:]] + good[20:]
    with BatchDecoder(TARGET, MAX_BYTES, isolate=True, timeout_s=3.0) as isolated:
        assert_same(values, isolated)
        assert_same(good, isolated)  # the decoder process is replaced after a timeout


@pytest.mark.slow
def test_a_decoder_child_that_stops_reading_is_killed_and_replaced() -> None:
    """A stopped child neither reads its pipe nor acts on SIGTERM: the deadline must still hold.

    The batch is larger than a pipe buffer, so the request's write blocks until the child is
    killed; SIGSTOP stands in for a reader wedged in native code.
    """
    good = [encode_event(event) for event in sample_events(40)]
    assert sum(len(value) for value in good) > 256 * 1024
    with BatchDecoder(TARGET, 1 << 20, isolate=True, timeout_s=1.0, timeout_per_mb_s=0.0) as isolated:
        assert_same(good, isolated, max_bytes=1 << 20)  # warm: the child is up and has answered
        assert isolated._decoder is not None
        stuck = isolated._decoder.pid
        assert stuck is not None
        os.kill(stuck, signal.SIGSTOP)
        started = time.monotonic()
        assert_same(good, isolated, max_bytes=1 << 20)  # record by record after the deadline
        assert time.monotonic() - started < 20
        with pytest.raises(ProcessLookupError):
            os.kill(stuck, 0)  # killed and reaped, not left behind stopped
        assert_same(good, isolated, max_bytes=1 << 20)  # a fresh child serves the next batch
        assert isolated._decoder.pid not in (None, stuck)


def test_binary_array_and_concatenated_keep_every_byte() -> None:
    values = [b"", b"a", b"\x00" * 300, bytes(range(256)), b"z"]
    array = binary_array(values)
    assert array.to_pylist() == values
    assert concatenated(array, range(len(values))) == b"".join(values)
    assert concatenated(array, [3, 1]) == values[3] + values[1]
    assert concatenated(array.slice(2), [0, 2]) == values[2] + values[4]  # offsets of a sliced array
