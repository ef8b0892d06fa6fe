"""Other engines read trajlake's tables: proof that the lakehouse is standard Iceberg.

DuckDB's Iceberg extension (DuckDB 1.5.5, in its own cached venv: the project uses
DuckDB 2.x) and Apache Spark with the Iceberg runtime (pyspark in its own cached
venv plus the runtime jar from Maven Central) read every hot and cold table by its
metadata file, and must agree with trajlake's own views on counts and checksums.
Downloads are cached under ``~/.cache/trajlake``; without network on first use the
tests skip with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from tests.helpers import BASE, day_events, one_row, write_raw
from warehouse.catalog import open_catalog
from warehouse.cold import ensure_cold_table
from warehouse.lakehouse import Lakehouse
from warehouse.sql import open_views
from warehouse.tables import ensure_table
from warehouse.tiering import tier

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TRAJLAKE_CACHE", Path.home() / ".cache" / "trajlake"))
DUCKDB_VERSION = "1.5.5"
SPARK_VERSION = "3.5.9"
ICEBERG_VERSION = "1.10.0"
RUNTIME = f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"
MAVEN = "https://repo1.maven.org/maven2/org/apache/iceberg/iceberg-spark-runtime-3.5_2.12"

#: Per view: a select list both engines and DuckDB 2.x evaluate identically (counts and sums as checksums).
CHECKS = {
    "events": "count(*), sum(kafka_offset), sum(seq), count(DISTINCT event_id), count(DISTINCT session_id)",
    "trajectories": "count(*), sum(n_events), sum(n_steps), count(DISTINCT session_id), sum(max_seq)",
    "steps": "count(*), sum(step_index), sum(seq), count(DISTINCT action_event_id), count(DISTINCT session_id)",
}
TABLE_OF = {"events": "raw_events", "trajectories": "trajectories", "steps": "steps"}


def _venv(path: Path, packages: list[str]) -> Path:
    """A cached virtual environment with ``packages``; its python."""
    python = path / "bin" / "python"
    marker = path / ".trajlake-ready"
    if marker.exists() and marker.read_text() == " ".join(packages):
        return python
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *packages], capture_output=True, text=True, timeout=900
    )
    if result.returncode != 0:
        pytest.skip(f"cannot install {packages} into {path}: {result.stderr.strip()[-300:]}")
    marker.write_text(" ".join(packages))
    return python


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Four days of sessions, half tiered: both hot and cold tables hold rows."""
    settings = load_settings(home=tmp_path_factory.mktemp("engines") / "home", catalog_uri=None)
    write_raw(settings, day_events(4, 3), batch_size=300)
    assemble(Lakehouse.open(settings), as_of=BASE + timedelta(days=30))
    tier(Lakehouse.open(settings), as_of=BASE + timedelta(days=9))
    return settings


def _requests(settings: Settings) -> tuple[dict[str, dict[str, str]], dict[str, list[int]]]:
    """What to ask the other engine (per tier table) and what trajlake's views answer."""
    catalog = open_catalog(settings)
    con = open_views(settings)
    requests: dict[str, dict[str, str]] = {}
    expected: dict[str, list[int]] = {}
    for view, select in CHECKS.items():
        for tier_name in ("hot", "cold"):
            if tier_name == "hot":
                table = ensure_table(catalog, settings, TABLE_OF[view])
            else:
                table = ensure_cold_table(catalog, settings, TABLE_OF[view])
            key = f"{tier_name}_{view}"
            requests[key] = {"metadata": table.metadata_location, "select": select}
            expected[key] = [int(v or 0) for v in one_row(con, f"SELECT {select} FROM {key}")]
    for view in CHECKS:  # both tiers hold data, so agreement covers both
        assert expected[f"hot_{view}"][0] > 0 and expected[f"cold_{view}"][0] > 0, view
    return requests, expected


def _as_ints(answer: dict[str, list]) -> dict[str, list[int]]:
    return {key: [int(float(v)) if v is not None else 0 for v in values] for key, values in answer.items()}


@pytest.mark.slow
def test_duckdb_iceberg_extension_reads_the_same_rows(lake: Settings) -> None:
    python = _venv(
        CACHE / "duckdb155",
        [
            f"duckdb=={DUCKDB_VERSION}",
            f"duckdb-extension-iceberg=={DUCKDB_VERSION}",
            f"duckdb-extension-avro=={DUCKDB_VERSION}",
        ],
    )
    requests, expected = _requests(lake)
    result = subprocess.run(
        [str(python), str(ROOT / "scripts" / "iceberg_read_duckdb.py")],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert _as_ints(json.loads(result.stdout)) == expected


def _runtime_jar() -> Path:
    jar = CACHE / "spark" / RUNTIME
    if not jar.exists():
        jar.parent.mkdir(parents=True, exist_ok=True)
        try:
            urllib.request.urlretrieve(f"{MAVEN}/{ICEBERG_VERSION}/{RUNTIME}", jar.with_suffix(".part"))
        except OSError as exc:
            pytest.skip(f"cannot download {RUNTIME} from Maven Central: {exc}")
        jar.with_suffix(".part").rename(jar)
    return jar


@pytest.mark.stress  # a JVM plus a Spark session: about a minute on 2 cores once cached, minutes on first download
def test_spark_reads_the_same_rows(lake: Settings) -> None:
    if shutil.which("java") is None:
        pytest.skip("Spark needs java on PATH (Java 17)")
    python = _venv(CACHE / "spark" / "venv", [f"pyspark=={SPARK_VERSION}"])
    jar = _runtime_jar()
    requests, expected = _requests(lake)
    result = subprocess.run(
        [str(python), str(ROOT / "scripts" / "iceberg_read_spark.py"), "--jar", str(jar)],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _as_ints(json.loads(result.stdout.strip().splitlines()[-1])) == expected
