"""Bloom filters in the Parquet files trajlake writes, and the local cache of object-store file tails."""

from __future__ import annotations

import warnings
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.settings import Settings
from warehouse.catalog import open_catalog
from warehouse.lakehouse import Lakehouse
from warehouse.object_store import FooterCache
from warehouse.parquet_writer import (
    BLOOM_ENABLED,
    BLOOM_MAX_BYTES,
    ROW_GROUP_LIMIT,
    distinct_columns,
    valueless_columns,
)
from warehouse.sql import local_path
from warehouse.tables import TRAJECTORIES, ensure_table
from warehouse.transactions import transaction


def _rows(n: int, prefix: str) -> pa.Table:
    schema = TRAJECTORIES.arrow_schema()
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns["session_id"] = pa.array([f"{prefix}-{i:06d}" for i in range(n)])
    return pa.table({f.name: columns[f.name].cast(f.type) for f in schema}, schema=schema)


def _files(table: object) -> list[str]:
    return [local_path(t.file.file_path) for t in table.scan().plan_files()]  # type: ignore[attr-defined]


def _probe(path: str, value: str) -> list[bool]:
    """Per row group: whether its Bloom filter on session_id excludes ``value`` (DuckDB's own check)."""
    con = duckdb.connect()
    rows = con.execute(
        "SELECT row_group_id, bloom_filter_excludes FROM parquet_bloom_probe(?, 'session_id', ?)", [path, value]
    )
    return [excludes for _, excludes in sorted(rows.fetchall())]


@pytest.mark.slow
def test_bloom_filters_are_written_as_the_table_properties_ask(settings: Settings) -> None:
    table = ensure_table(open_catalog(settings), settings, TRAJECTORIES.name)
    with transaction(table) as tx:
        tx.set_properties({f"{BLOOM_ENABLED}.session_id": "true", ROW_GROUP_LIMIT: "1000"})
    table = open_catalog(settings).load_table(table.name())
    rows = _rows(5_000, "s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pyiceberg's "not implemented" warning: the properties are handled
        table.append(rows)
    (path,) = _files(table)
    meta = pq.read_metadata(path)
    assert meta.num_row_groups == 5
    session = meta.schema.names.index("session_id")
    for i in range(meta.num_row_groups):
        assert meta.row_group(i).column(session).bloom_filter_length  # every row group has one
    # No false negative: each id is kept by the row group that holds it ...
    ids = rows.column("session_id").to_pylist()
    for i in range(0, len(ids), 97):
        assert not _probe(path, ids[i])[i // 1000], ids[i]
    # ... and an absent id is excluded by (nearly) every row group: 1 % false positives.
    absent = [_probe(path, f"t-{i:06d}") for i in range(200)]
    kept = sum(not excluded for groups in absent for excluded in groups)
    assert kept <= 30, kept
    # Sized for the row group (1,000 ids), not for pyarrow's default million: a few KB, not a MB.
    assert meta.row_group(0).column(session).bloom_filter_length < 8 << 10


def _dictionaries(path: str) -> dict[str, bool]:
    meta = pq.read_metadata(path)
    return {
        meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).has_dictionary_page
        for i in range(meta.num_columns)
    }


def test_columns_without_a_value_are_written_without_a_dictionary(settings: Settings) -> None:
    table = ensure_table(open_catalog(settings), settings, TRAJECTORIES.name)
    rows = _rows(3_000, "s")
    # Repeated ids: a column of distinct values has no dictionary either (distinct_columns).
    rows = rows.set_column(0, "session_id", pa.array([f"s-{i % 10}" for i in range(3_000)], rows.schema[0].type))
    table.append(rows)
    (path,) = _files(table)
    dictionary = _dictionaries(path)
    assert dictionary.pop("session_id")
    assert dictionary and not any(dictionary.values())  # every other column is null in every row
    assert valueless_columns(rows) == set(dictionary)
    assert pq.read_table(path).column("session_id").to_pylist() == rows.column("session_id").to_pylist()


def test_columns_of_mostly_distinct_values_are_written_without_a_dictionary(settings: Settings) -> None:
    # Judged on the file's first rows: more than half distinct → plain; repeated values keep their dictionary.
    table = ensure_table(open_catalog(settings), settings, TRAJECTORIES.name)
    n = 3_000
    rows = _rows(n, "s")  # every session id distinct
    for name, values in {
        "status": pa.array(["ok", "failed", None][i % 3] for i in range(n)),
        "reward": pa.array([i / 7 for i in range(n)]),  # distinct
        "n_events": pa.array([i % 5 for i in range(n)]),  # repeated
    }.items():
        rows = rows.set_column(rows.schema.get_field_index(name), name, values.cast(rows.schema.field(name).type))
    assert {"session_id", "reward"} <= distinct_columns(rows)
    assert not {"status", "n_events"} & distinct_columns(rows)
    table.append(rows)
    (path,) = _files(table)
    dictionary = _dictionaries(path)
    assert not dictionary["session_id"] and not dictionary["reward"]
    assert dictionary["status"] and dictionary["n_events"]
    written = pq.read_table(path)
    for name in ("session_id", "status", "reward", "n_events"):
        assert written.column(name).to_pylist() == rows.column(name).to_pylist(), name


def test_bloom_filter_size_is_capped_and_absent_without_the_property(settings: Settings) -> None:
    catalog = open_catalog(settings)
    table = ensure_table(catalog, settings, TRAJECTORIES.name)
    table.append(_rows(2_000, "plain"))
    (plain,) = _files(table)
    meta = pq.read_metadata(plain)
    session = meta.schema.names.index("session_id")
    assert not meta.row_group(0).column(session).bloom_filter_length
    with transaction(table) as tx:
        tx.set_properties({f"{BLOOM_ENABLED}.session_id": "true", BLOOM_MAX_BYTES: "1024"})
    table = catalog.load_table(table.name())
    table.append(_rows(50_000, "capped"))
    (capped,) = [p for p in _files(table) if p != plain]
    meta = pq.read_metadata(capped)
    assert 0 < meta.row_group(0).column(session).bloom_filter_length <= 1024 + 64  # + the filter's header


def _parquet_bytes(tmp_path: Path, rows: int) -> bytes:
    path = tmp_path / "f.parquet"
    table = pa.table({"session_id": [f"s{i:07d}" for i in range(rows)], "v": list(range(rows))})
    pq.write_table(table, path, row_group_size=rows // 4, bloom_filter_options={"session_id": {"ndv": rows}})
    return path.read_bytes()


def test_footer_cache_keeps_everything_after_the_data_and_serves_it_to_new_readers(tmp_path: Path) -> None:
    data = _parquet_bytes(tmp_path, 200_000)
    meta = pq.read_metadata(pa.BufferReader(data))
    data_end = max(
        meta.row_group(i).column(j).data_page_offset + meta.row_group(i).column(j).total_compressed_size
        for i in range(meta.num_row_groups)
        for j in range(meta.num_columns)
    )
    reads: list[tuple[int, int]] = []

    def read_at(n: int, offset: int) -> bytes:
        reads.append((offset, n))
        return data[offset : offset + n]

    cache = FooterCache(tmp_path / "cache", 1 << 30)
    offset, entry = cache.fill("s3://b/f.parquet", len(data), read_at) or (None, None)
    assert offset is not None and entry is not None
    assert offset <= data_end  # the Bloom filters (after the data) are in the entry
    assert entry.read_bytes() == data[offset:]
    assert len(reads) <= 3
    # Another process finds it by URI and size; another size (another file) is a miss.
    found = FooterCache(tmp_path / "cache", 1 << 30).lookup("s3://b/f.parquet", len(data))
    assert found == (offset, entry)
    assert cache.lookup("s3://b/f.parquet", len(data) + 1) is None
    assert cache.lookup("s3://b/g.parquet", len(data)) is None


def test_footer_cache_refuses_what_is_not_parquet_and_stays_within_its_limit(tmp_path: Path) -> None:
    cache = FooterCache(tmp_path / "cache", 1 << 30)
    junk = b"x" * 5000
    assert cache.fill("s3://b/junk", len(junk), lambda n, o: junk[o : o + n]) is None
    lying = b"PAR1" + b"x" * 100 + (10_000).to_bytes(4, "little") + b"PAR1"  # a footer longer than the file
    assert cache.fill("s3://b/lying", len(lying), lambda n, o: lying[o : o + n]) is None
    assert not list((tmp_path / "cache").glob("*/*.tail"))

    data = _parquet_bytes(tmp_path, 20_000)
    small = FooterCache(tmp_path / "small", 1)  # room for nothing: every fill evicts
    tail = len(data) - small.fill("s3://b/0", len(data), lambda n, o: data[o : o + n])[0]  # type: ignore[index]
    small.limit_bytes = tail * 3
    for i in range(1, 10):
        small.fill(f"s3://b/{i}", len(data), lambda n, o: data[o : o + n])
    kept = sum(p.stat().st_size for p in (tmp_path / "small").glob("*/*.tail"))
    assert 0 < kept <= tail * 3
    # Processes share the directory: a new one counts what the others left before adding its own.
    for process in range(3):
        other = FooterCache(tmp_path / "small", tail * 3)
        for i in range(2):
            other.fill(f"s3://b/p{process}-{i}", len(data), lambda n, o: data[o : o + n])
    kept = sum(p.stat().st_size for p in (tmp_path / "small").glob("*/*.tail"))
    assert 0 < kept <= tail * 3


def test_a_cold_table_is_created_with_bloom_filters_on_its_session_key(settings: Settings) -> None:
    from warehouse.cold import ensure_cold_table

    catalog = open_catalog(settings)
    for name in ("raw_events", "trajectories", "steps"):
        props = ensure_cold_table(catalog, settings, name).properties
        assert props[f"{BLOOM_ENABLED}.session_id"] == "true"
        assert props[ROW_GROUP_LIMIT] == str(settings.cold_row_group_rows)


@pytest.mark.parametrize("rows", [1, 3])
def test_tiny_tables_still_write(settings: Settings, rows: int) -> None:
    table = ensure_table(open_catalog(settings), settings, TRAJECTORIES.name)
    with transaction(table) as tx:
        tx.set_properties({f"{BLOOM_ENABLED}.session_id": "true"})
    table = open_catalog(settings).load_table(table.name())
    table.append(_rows(rows, "tiny"))
    assert table.scan().to_arrow().num_rows == rows


@pytest.mark.slow
def test_maintain_rewrites_the_cold_files_written_before_bloom_filters(settings: Settings) -> None:
    from warehouse.cold import FILTERS_SINCE, ensure_cold_table
    from warehouse.maintenance import maintain, rewrite_unfiltered

    catalog = open_catalog(settings)
    cold = ensure_cold_table(catalog, settings, TRAJECTORIES.name)
    bloom = f"{BLOOM_ENABLED}.session_id"
    with transaction(cold) as tx:  # a cold table from before the filters
        tx.remove_properties(bloom)
    cold = catalog.load_table(cold.name())
    cold.append(_rows(3_000, "old"))
    cold = ensure_cold_table(catalog, settings, TRAJECTORIES.name)  # an upgraded trajlake opens it
    assert cold.properties[bloom] == "true" and FILTERS_SINCE in cold.properties
    cold.append(_rows(2_000, "new"))
    cold = catalog.load_table(cold.name())
    (unfiltered,) = [p for p in _files(cold) if not _has_bloom(p)]
    (filtered,) = [p for p in _files(cold) if _has_bloom(p)]
    before = sorted(cold.scan(selected_fields=("session_id",)).to_arrow().column("session_id").to_pylist())

    maintain(Lakehouse.open(settings))
    cold = catalog.load_table(cold.name())
    files = _files(cold)
    assert unfiltered not in files and filtered in files  # only the old file was rewritten
    assert all(_has_bloom(p) for p in files)
    assert sorted(cold.scan(selected_fields=("session_id",)).to_arrow().column("session_id").to_pylist()) == before
    assert rewrite_unfiltered(catalog, cold) == (0, 0)  # done: the next run has nothing to do


def _has_bloom(path: str) -> bool:
    meta = pq.read_metadata(path)
    column = meta.schema.names.index("session_id")
    return all(meta.row_group(i).column(column).bloom_filter_length for i in range(meta.num_row_groups))
