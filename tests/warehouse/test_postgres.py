"""The SQL catalog on PostgreSQL: a private cluster per test module, concurrent writers, tiering on top."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from glob import glob
from pathlib import Path

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from tests.helpers import BASE, day_events, lake_state, open_lakehouse_at_once, tier_split
from warehouse.catalog import open_catalog
from warehouse.lakehouse import Lakehouse
from warehouse.tables import RAW_EVENTS, ensure_table
from warehouse.tiering import tier

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_uri() -> Iterator[str]:
    """SQLAlchemy URI of a throwaway PostgreSQL cluster (initdb + pg_ctl in a temp dir, a free port).

    PostgreSQL refuses to run as root, so as root the cluster runs as the ``postgres`` user.
    """
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found: apt-get install -y postgresql")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver is a dev extra: pip install -e '.[dev]'")
    prefix: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="trajlake-pg-"))
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the cluster as")
        os.chown(root, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()
    subprocess.run(
        [*prefix, initdb, "-D", str(data), "-U", "trajlake", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=50"
    started = subprocess.run(
        [*prefix, pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"],
        capture_output=True,
        text=True,
    )
    if started.returncode != 0:
        log = (root / "log").read_text() if (root / "log").exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {started.stderr}\n{log}")
    try:
        yield f"postgresql+psycopg://trajlake@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_settings(settings: Settings, postgres_uri: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings using the PostgreSQL catalog, with a namespace of their own (tests share the cluster)."""
    monkeypatch.setenv("TRAJLAKE_CATALOG_URI", postgres_uri)
    monkeypatch.setenv("TRAJLAKE_NAMESPACE", f"t_{settings.topic.replace('-', '_')}")
    return load_settings()


@pytest.mark.slow
def test_machines_opening_one_new_namespace_at_once_on_postgres_all_open_it(pg_settings: Settings) -> None:
    """Namespaces, tables and cold properties made by four openers at once: unique keys refuse all but one."""
    assert open_lakehouse_at_once(pg_settings, openers=4) == []
    lake = Lakehouse.open(pg_settings)
    assert {name for _, name in lake.catalog.list_tables(lake.namespace)} >= {RAW_EVENTS.name}


WRITER = """
import sys, time
import pyarrow as pa
from datetime import datetime, UTC
from pyiceberg.exceptions import CommitFailedException
from pipelines.ingest import event_row
from common.settings import load_settings
from schemas.registry import decode_event, encode_event
from tests.helpers import day_events
from warehouse.catalog import open_catalog
from warehouse.tables import RAW_EVENTS, ensure_table

writer, commits = int(sys.argv[1]), int(sys.argv[2])
settings = load_settings()
catalog = open_catalog(settings)
events = day_events(1, 2)[:10]
conflicts = 0
for n in range(commits):
    base = (writer * commits + n) * 100
    rows = [event_row(decode_event(encode_event(e)), f"w{writer}", 0, base + i, datetime.now(UTC))
            for i, e in enumerate(events)]
    batch = pa.Table.from_pylist(rows, schema=RAW_EVENTS.arrow_schema())
    while True:  # optimistic concurrency: reload and retry on a lost race
        try:
            ensure_table(catalog, settings, RAW_EVENTS.name).append(batch)
            break
        except CommitFailedException:
            conflicts += 1
            time.sleep(0.01)
print(conflicts)
"""


@pytest.mark.slow
def test_concurrent_writers_on_postgres_lose_nothing(pg_settings: Settings) -> None:
    ensure_table(open_catalog(pg_settings), pg_settings, RAW_EVENTS.name)
    writers, commits = 3, 6
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(w), str(commits)], env=env, stdout=subprocess.PIPE, text=True
        )
        for w in range(writers)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    table = ensure_table(open_catalog(pg_settings), pg_settings, RAW_EVENTS.name)
    rows = table.scan(selected_fields=("kafka_topic", "kafka_offset")).to_arrow()
    assert rows.num_rows == writers * commits * 10
    assert (
        len(set(zip(rows["kafka_topic"].to_pylist(), rows["kafka_offset"].to_pylist(), strict=True))) == rows.num_rows
    )
    assert len(table.snapshots()) == writers * commits


@pytest.mark.slow
def test_tiering_and_views_on_postgres(pg_settings: Settings) -> None:
    from tests.helpers import write_raw

    write_raw(pg_settings, day_events(3, 2), batch_size=300)
    assemble(Lakehouse.open(pg_settings), as_of=BASE + timedelta(days=30))
    before = lake_state(pg_settings)
    tier(Lakehouse.open(pg_settings), as_of=BASE + timedelta(days=9))
    assert lake_state(pg_settings) == before
    assert tier_split(pg_settings)["cold_trajectories"] == 4  # days 0 and 1 of 0..2
    catalog = open_catalog(pg_settings)
    assert (f"{pg_settings.namespace}_cold",) in catalog.list_namespaces()


@pytest.mark.slow
def test_two_machines_assembling_at_once_on_postgres_write_each_session_once(
    pg_settings: Settings, tmp_path: Path
) -> None:
    """Two `trajlake assemble` with separate TRAJLAKE_HOMEs (no shared local lock) on one PostgreSQL catalog."""
    import time

    from tests.helpers import write_raw
    from warehouse.locks import job_lock

    write_raw(pg_settings, day_events(2, 6), batch_size=100)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    base.update(
        PYTHONPATH=str(ROOT),
        TRAJLAKE_CATALOG_URI=pg_settings.catalog_uri or "",
        TRAJLAKE_NAMESPACE=pg_settings.namespace,
    )
    homes = [pg_settings.home, tmp_path / "machine-b"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trajlake.cli", "assemble"],
            env={**base, "TRAJLAKE_HOME": str(home)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for home in homes
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    con_rows = lake_state(pg_settings)["trajectories"]
    assert len(con_rows) == len({row[0] for row in con_rows}) == 12
    # a lease held by a holder on another machine blocks until it expires, then is taken over
    catalog = open_catalog(pg_settings)
    with job_lock(pg_settings, catalog, "score", lease_s=1.0):
        pass
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy import text

    assert isinstance(catalog, SqlCatalog)  # TRAJLAKE_CATALOG_URI is a PostgreSQL URL here
    with catalog.engine.begin() as con:
        con.execute(
            text("INSERT INTO trajlake_locks VALUES (:n, 'other', 'machine-b', 1, :t)"),
            {"n": f"{pg_settings.namespace}:score", "t": time.time() + 2},
        )
    started = time.monotonic()
    with job_lock(pg_settings, catalog, "score", wait_s=30):
        assert 1.5 < time.monotonic() - started < 30
