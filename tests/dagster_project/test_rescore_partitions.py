"""A full rescore fanned out as Dagster day partitions, run in parallel processes, equals one run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.score import score_all
from producers.session_generator import synthetic_sessions
from tests.helpers import BASE, BASE_US, DAY_US, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.sql import open_views

DAYS = 3
QUERIES = {
    "scores": "SELECT * EXCLUDE (scored_at) FROM scores ORDER BY session_id",
    "flags": "SELECT * EXCLUDE (scored_at) FROM flags ORDER BY session_id, flag, evidence",
    "duplicates": "SELECT * EXCLUDE (scored_at) FROM duplicates ORDER BY session_id",
    "profiles": "SELECT * EXCLUDE (scored_at, index_files) FROM profiles ORDER BY day, profile",
    "session_index": "SELECT * EXCLUDE (scored_at) FROM session_index ORDER BY session_id",
    "band_keys": "SELECT * FROM band_keys ORDER BY session_key, band_key",
}
MATERIALIZE = textwrap.dedent(
    """
    import sys
    from dagster import materialize
    from dagster_project.defs.quality import session_index
    from dagster_project.resources import LakehouseResource

    result = materialize([session_index], partition_key=sys.argv[1], resources={"lakehouse": LakehouseResource()})
    assert result.success
    """
)


def _tables(settings: Settings) -> dict[str, pl.DataFrame]:
    con = open_views(settings)
    try:
        return {name: con.sql(query).pl() for name, query in QUERIES.items()}
    finally:
        con.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_day_partitions_in_parallel_then_combine_equal_one_full_rescore(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for day in range(DAYS):
        events = synthetic_sessions(40, seed=day, start_us=BASE_US + day * DAY_US + 3_600_000_000)
        write_raw(settings, [e for s in events for e in s])
    assemble(Lakehouse.open(settings))
    assert score_all(Lakehouse.open(settings)).mode == "full"

    # a configuration change the facts depend on (the LSH bands): every session must be indexed again
    monkeypatch.setenv("TRAJLAKE_DEDUP_ROWS", "7")
    changed = load_settings()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", MATERIALIZE, (BASE + timedelta(days=d)).date().isoformat()],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for d in range(DAYS)
    ]  # all at once: the partitions commit to the same tables concurrently
    for run in runs:
        output = run.communicate(timeout=300)[0]
        assert run.returncode == 0, output.decode(errors="replace")[-3000:]
    combined = score_all(Lakehouse.open(changed))
    assert combined.mode == "full" and combined.changed_sessions == 0  # the partitions did level 1
    assert combined.rescored_sessions == DAYS * 40
    parallel = _tables(changed)
    assert parallel["session_index"].height == DAYS * 40

    single = score_all(Lakehouse.open(changed), force=True)  # one run, level 1 included
    assert single.changed_sessions == DAYS * 40
    one_run = _tables(changed)
    for name in QUERIES:
        assert parallel[name].equals(one_run[name]), (name, parallel[name].join(one_run[name], on="session_id"))
