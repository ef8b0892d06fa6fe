"""The cold tier on S3 is read where it lies: ranged reads of the row groups a query needs, never a whole table."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from tests.helpers import BASE, BASE_US, day_events, lake_state, tier_split, write_raw
from warehouse.catalog import open_catalog
from warehouse.cold import ensure_cold_table
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.sql import open_views
from warehouse.tables import RAW_EVENTS
from warehouse.tiering import tier
from warehouse.transactions import transaction

pytestmark = pytest.mark.integration

BUCKET = "trajlake-inplace"


@dataclass
class Recorder:
    """Requests a moto S3 server received: (method, path) counts and bytes sent per path."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.sent.clear()

    def data_bytes(self) -> int:
        """Bytes of Parquet data files sent (not Iceberg metadata)."""
        return sum(n for path, n in self.sent.items() if "/data/" in path and path.endswith(".parquet"))


@pytest.fixture(scope="module")
def counting_s3() -> Iterator[tuple[str, Recorder]]:
    """A moto S3 server whose requests and response bytes are counted (a WSGI wrapper around moto's app)."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is a dev extra: pip install -e '.[dev]'")
    from werkzeug.serving import make_server

    app = server_mod.DomainDispatcherApplication(server_mod.create_backend_app)
    recorder = Recorder()

    def counted(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        chunks = list(app(environ, start_response))
        with recorder.lock:
            recorder.requests[(environ["REQUEST_METHOD"], path)] += 1
            recorder.sent[path] += sum(len(c) for c in chunks)
        return chunks

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", 0, counted, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", recorder
    server.shutdown()


@pytest.fixture
def cold_lake(
    settings: Settings, counting_s3: tuple[str, Recorder], monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, dict[str, Any]]:
    """Three days tiered to S3; returns the settings and the answers read before tiering."""
    import boto3

    endpoint, _ = counting_s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    monkeypatch.setenv("TRAJLAKE_COLD_WAREHOUSE", f"s3://{BUCKET}/{settings.topic}")
    # Only the endpoint is configured: region and credentials come from the AWS environment.
    monkeypatch.setenv("TRAJLAKE_CATALOG_PROPERTIES", json.dumps({"s3.endpoint": endpoint}))
    settings = load_settings()
    write_raw(settings, day_events(3, 6), batch_size=2000)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    con = open_views(settings)
    session = con.execute("SELECT min(session_id) FROM trajectories").fetchone()
    assert session is not None
    sid = session[0]
    expected = {
        "session": sid,
        "events": sorted(con.execute("SELECT event_id FROM events WHERE session_id = ?", [sid]).fetchall()),
        "trajectory": con.execute("SELECT n_events FROM trajectories WHERE session_id = ?", [sid]).fetchall(),
        "day": con.execute(
            "SELECT count(*), count(DISTINCT session_id) FROM events WHERE ts >= $a AND ts < $b",
            {"a": BASE + timedelta(days=1), "b": BASE + timedelta(days=2)},
        ).fetchall(),
        "state": lake_state(settings),
    }
    con.close()
    tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))  # every day is past the hot retention
    split = tier_split(settings)
    assert split["hot_events"] == 0 and split["cold_trajectories"] == 18
    return settings, expected


@pytest.mark.slow
def test_cold_views_on_s3_read_in_place(
    cold_lake: tuple[Settings, dict[str, Any]], counting_s3: tuple[str, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, expected = cold_lake
    _, recorder = counting_s3
    # Nothing loads a whole table: pyiceberg's Arrow scan is what used to read every cold file into memory.
    from pyiceberg.io.pyarrow import ArrowScan

    def no_whole_table(*args: object, **kwargs: object) -> None:
        raise AssertionError("a view loaded a whole table into memory")

    monkeypatch.setattr(ArrowScan, "to_table", no_whole_table)
    sid = expected["session"]
    day = (BASE + timedelta(days=1)).isoformat()
    next_day = (BASE + timedelta(days=2)).isoformat()
    # These files are small enough to sit whole in the footer cache (its tail is from a 64 KiB boundary):
    # first without it, to see the data fetched from the store, then with it, for the same answers.
    for cache_bytes in ("0", str(1 << 30)):
        monkeypatch.setenv("TRAJLAKE_FOOTER_CACHE_BYTES", cache_bytes)
        settings = load_settings()
        # A one-session lookup and a day aggregate, on the locked connection user SQL runs on.
        recorder.clear()
        query = f"SELECT event_id FROM cold_events WHERE session_id = '{sid}' ORDER BY event_id"
        _, rows = run_query(settings, query)
        assert sorted(rows) == expected["events"] and rows
        _, rows = run_query(settings, f"SELECT n_events FROM trajectories WHERE session_id = '{sid}'")
        assert rows == expected["trajectory"]
        _, rows = run_query(
            settings,
            "SELECT count(*), count(DISTINCT session_id) FROM cold_events "
            f"WHERE ts >= TIMESTAMPTZ '{day}' AND ts < TIMESTAMPTZ '{next_day}'",
        )
        assert rows == expected["day"] and rows[0][0] > 0
        # Objects are fetched by key (Iceberg metadata and the planned data files): nothing is listed.
        assert recorder.data_bytes() > 0 or cache_bytes != "0"
        assert not any(method == "GET" and path.endswith(("/", BUCKET)) for method, path in recorder.requests)
    # Every row of every view is still counted once.
    monkeypatch.undo()
    assert lake_state(settings) == expected["state"]


@pytest.mark.slow
def test_locked_connection_reads_only_the_planned_objects(cold_lake: tuple[Settings, dict[str, Any]]) -> None:
    settings, _ = cold_lake
    from warehouse.errors import QueryError

    cold = ensure_cold_table(open_catalog(settings), settings, RAW_EVENTS.name)
    metadata = cold.metadata_location  # an object in the same bucket, not a planned data file
    for query in (
        f"SELECT * FROM read_parquet('s3://{BUCKET}/{settings.topic}/other.parquet')",
        f"SELECT * FROM read_text('{metadata}')",
        f"SELECT * FROM glob('s3://{BUCKET}/*')",
    ):
        with pytest.raises(QueryError):
            run_query(settings, query)


def _synthetic_day(day: int, rows: int, seed: int, interleaved: bool = False) -> pa.Table:
    """``rows`` raw events of one day, sorted by session like tiered files (random ids: a file of several MB).

    ``interleaved``: session ids of every day cover the same range (as random UUIDs do), so a file's
    statistics cannot tell which day a session is on.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    schema = RAW_EVENTS.arrow_schema()
    columns = {f.name: pa.nulls(rows, f.type) for f in schema}
    sessions = rows // 50
    ids = [f"s{i // 50:06d}-d{day:02d}" if interleaved else f"d{day:02d}-s{i // 50:06d}" for i in range(rows)]
    columns["session_id"] = pa.array(ids)
    columns["seq"] = pa.array(np.arange(rows) % 50, schema.field("seq").type)
    columns["event_id"] = pa.array([rng.bytes(16).hex() for _ in range(rows)])
    columns["event_type"] = pa.array(rng.choice(["agent_action", "env_feedback"], rows))
    start = BASE_US + day * 86_400_000_000
    offsets = np.sort(rng.integers(0, 86_300_000_000, sessions)).repeat(50) + np.arange(rows) % 50 * 1_000_000
    columns["ts"] = pa.array(start + offsets).cast(pa.timestamp("us")).cast(schema.field("ts").type)
    return pa.table({f.name: columns[f.name].cast(f.type) for f in schema}, schema=schema)


def _cold_on_s3(endpoint: str, warehouse: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings with the cold tier at ``warehouse`` on the counting server, one file per day partition."""
    import boto3

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # The endpoint from the standard AWS variable, not from the catalog's properties.
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    monkeypatch.setenv("TRAJLAKE_COLD_WAREHOUSE", warehouse)
    monkeypatch.delenv("TRAJLAKE_CATALOG_PROPERTIES", raising=False)
    # pyiceberg cuts files by Arrow size, which these mostly-null rows inflate: one file per day.
    monkeypatch.setenv("TRAJLAKE_COLD_TARGET_FILE_BYTES", str(4 << 30))
    return load_settings()


@pytest.mark.slow
def test_queries_fetch_only_the_row_groups_they_need(
    settings: Settings, counting_s3: tuple[str, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files of several MB, so that a row group is a small part of one: two days of 300k events."""
    endpoint, recorder = counting_s3
    settings = _cold_on_s3(endpoint, f"s3://{BUCKET}/{settings.topic}", monkeypatch)
    cold = ensure_cold_table(open_catalog(settings), settings, RAW_EVENTS.name)
    with transaction(cold) as tx:
        tx.set_properties({"write.parquet.row-group-limit": "10000"})
    cold = open_catalog(settings).load_table(cold.name())
    for day in (0, 1):
        cold.append(_synthetic_day(day, 300_000, seed=day))
    files = {t.file.file_path.split("://", 1)[1]: t.file.file_size_in_bytes for t in cold.scan().plan_files()}
    assert len(files) == 2 and min(files.values()) > 4 << 20, files
    total = sum(files.values())
    recorder.clear()
    _, rows = run_query(
        settings, "SELECT count(*), min(seq), max(seq) FROM cold_events WHERE session_id = 'd01-s001234'"
    )
    assert rows == [(50, 0, 49)]
    lookup = dict(recorder.sent)
    recorder.clear()
    second_day = (BASE + timedelta(days=1)).isoformat()
    _, rows = run_query(settings, f"SELECT count(*) FROM cold_events WHERE ts >= TIMESTAMPTZ '{second_day}'")
    assert rows == [(300_000,)]
    aggregate = dict(recorder.sent)

    def fetched(sent: dict[str, int]) -> int:
        return sum(n for path, n in sent.items() if path.lstrip("/") in files)

    # The lookup fetches footers and one row group of the session's columns: a small fraction of the tier.
    assert 0 < fetched(lookup) < total / 8, (fetched(lookup), total)
    # The day aggregate reads one column of one day: the other day's file gives its footer only.
    assert 0 < fetched(aggregate) < total / 4, (fetched(aggregate), total)


@pytest.mark.slow
def test_a_lookup_in_a_new_process_fetches_only_its_own_day(
    settings: Settings, counting_s3: tuple[str, Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Footers come from the local footer cache and the other days' row groups are skipped by their Bloom filters."""
    endpoint, recorder = counting_s3
    monkeypatch.setenv("TRAJLAKE_COLD_ROW_GROUP_ROWS", "5000")
    settings = _cold_on_s3(endpoint, f"s3://{BUCKET}/{settings.topic}-bloom", monkeypatch)
    cold = ensure_cold_table(open_catalog(settings), settings, RAW_EVENTS.name)
    days = 4
    for day in range(days):
        cold.append(_synthetic_day(day, 40_000, seed=10 + day, interleaved=True))
    cold = open_catalog(settings).load_table(cold.name())
    by_day = {
        t.file.file_path.split("://", 1)[1]: t.file.partition[0]
        for t in cold.scan().plan_files()  # day partition of each file
    }
    assert len(by_day) == days
    own = {path for path, day in by_day.items() if day == max(by_day.values())}

    def lookup(session: str) -> dict[str, int]:
        recorder.clear()
        _, rows = run_query(settings, f"SELECT count(*), max(seq) FROM cold_events WHERE session_id = '{session}'")
        assert rows == [(50, 49)]
        return {path.lstrip("/"): n for path, n in recorder.sent.items() if path.lstrip("/") in by_day}

    first = lookup("s000100-d03")  # fills the footer cache: every file's tail is fetched once
    assert set(first) == set(by_day)
    again = lookup("s000010-d03")  # a new connection and filesystem, as a new `trajlake sql` process
    assert set(again) == own, again  # the three other days: not one byte, footers included
    assert sum(again.values()) < sum(cold.inspect.files().column("file_size_in_bytes").to_pylist()) / days / 4

    # Without the cache every file's footer is fetched again.
    monkeypatch.setenv("TRAJLAKE_FOOTER_CACHE_BYTES", "0")
    settings = load_settings()
    assert set(lookup("s000300-d03")) == set(by_day)
