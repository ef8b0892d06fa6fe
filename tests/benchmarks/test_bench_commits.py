"""``trajlake bench commits``: a tiny run, so the bench cannot rot (figures are printed, never asserted as timings)."""

from __future__ import annotations

import warehouse.catalog as catalog_module
import warehouse.transactions as transactions_module
from benchmarks.commits import bench_commits


def test_bench_commits_measures_both_stagings_and_leaves_trajlake_s_in_place() -> None:
    ours = transactions_module.apply_updates, catalog_module._LeanSqlCatalog._update_and_stage_table
    result = bench_commits(snapshots=(12, 40), rounds=2)
    assert {f["name"].split(" with ")[1] for f in result["figures"]} == {
        "12 snapshots of history",
        "40 snapshots of history",
    }
    assert all(result[f"{staging}_ms @{n}"] > 0 for staging in ("trajlake", "pyiceberg") for n in (12, 40))
    assert (transactions_module.apply_updates, catalog_module._LeanSqlCatalog._update_and_stage_table) == ours
