"""The cold tier on object storage: a local S3-compatible endpoint (moto's server mode)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from tests.helpers import BASE, day_events, lake_state, tier_split, write_raw
from warehouse.catalog import open_catalog
from warehouse.cold import ensure_cold_table
from warehouse.lakehouse import Lakehouse
from warehouse.maintenance import maintain
from warehouse.query import run_query
from warehouse.tiering import tier

pytestmark = pytest.mark.integration

BUCKET = "trajlake-cold"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free local port, for the module's tests."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is a dev extra: pip install -e '.[dev]'")
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_client(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:  # boto3 ships no types
    """A boto3 client of the endpoint, with BUCKET created; AWS credentials set in the environment."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def s3_settings(settings: Settings, s3_endpoint: str, s3_client: object, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings whose cold warehouse is on the S3 endpoint; credentials come from the AWS environment."""
    prefix = settings.topic  # unique per test
    monkeypatch.setenv("TRAJLAKE_COLD_WAREHOUSE", f"s3://{BUCKET}/{prefix}")
    properties = {"s3.endpoint": s3_endpoint, "s3.region": "us-east-1"}
    monkeypatch.setenv("TRAJLAKE_CATALOG_PROPERTIES", json.dumps(properties))
    return load_settings()


@pytest.mark.slow
def test_tier_and_maintain_on_s3(s3_settings: Settings, s3_client: Any) -> None:
    settings = s3_settings
    write_raw(settings, day_events(4, 2), batch_size=200)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    before = lake_state(settings)
    for day in (9, 10):  # two runs: several small cold files to compact
        tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=day))
    assert lake_state(settings) == before
    split = tier_split(settings)
    assert split["cold_events"] > 0 and split["cold_trajectories"] == 6
    # User SQL runs on a locked connection (no external access): the s3:// tier stays readable there.
    query = "SELECT (SELECT count(*) FROM cold_events), (SELECT count(*) FROM cold_trajectories)"
    assert run_query(settings, query)[1] == [(split["cold_events"], 6)]
    cold = ensure_cold_table(open_catalog(settings), settings, "raw_events")
    assert cold.location().startswith(f"s3://{BUCKET}/")
    assert all(t.file.file_path.startswith("s3://") for t in cold.scan().plan_files())
    client = s3_client
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=settings.topic).get("KeyCount", 0)
    assert listed > 0
    # Maintenance lists and deletes through the same S3 filesystem: an orphan object goes.
    orphan_key = f"{cold.location().removeprefix(f's3://{BUCKET}/')}/data/orphan.parquet"
    client.put_object(Bucket=BUCKET, Key=orphan_key, Body=b"stray")
    reports = {
        r.table: r
        for r in maintain(Lakehouse.open(load_settings(snapshot_retention_hours=0)), orphan_min_age=timedelta(0))
    }
    cold_raw = reports[f"{settings.namespace}_cold.raw_events"]
    assert cold_raw.orphans_removed >= 1 and cold_raw.after.max_files_per_partition <= 1
    assert "Contents" not in client.list_objects_v2(Bucket=BUCKET, Prefix=orphan_key)
    assert lake_state(settings) == before
