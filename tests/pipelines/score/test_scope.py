"""The scope of a run, from what the last run recorded: skipped, full or incremental from the watermark."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.score.record import SCORED_DIGEST, SCORED_SNAPSHOT, SCORED_VERSION, SCORED_WATERMARK
from pipelines.score.scope import max_watermark, plan_run

RECORDED = {
    SCORED_SNAPSHOT: "7",
    SCORED_VERSION: "v1",
    SCORED_DIGEST: "d1",
    SCORED_WATERMARK: "5000000",
}


@pytest.mark.parametrize(
    ("change", "snapshot", "force", "mode"),
    [
        ({}, 7, False, "skipped"),  # this snapshot under this configuration: nothing to do
        ({}, 7, True, "full"),
        ({}, 8, False, "incremental"),  # a new snapshot
        ({}, None, False, "incremental"),  # no trajectories table snapshot is never "already covered"
        ({SCORED_VERSION: "v0"}, 7, False, "full"),  # another scorer
        ({SCORED_DIGEST: "d0"}, 8, False, "full"),  # another configuration
        ({SCORED_WATERMARK: None}, 8, False, "full"),  # nothing scored yet
    ],
)
def test_a_run_is_skipped_full_or_incremental(
    change: dict[str, str | None], snapshot: int | None, force: bool, mode: str
) -> None:
    props = {k: v for k, v in {**RECORDED, **change}.items() if v is not None}
    scope = plan_run(props, "v1", "d1", snapshot, force, lag_s=2.0)
    assert scope.mode == mode
    assert scope.full == (mode == "full")
    assert scope.watermark == props.get(SCORED_WATERMARK)
    # only an incremental run starts from the watermark, less the lag for other machines' clocks
    assert scope.since_us == (5_000_000 - 2_000_000 if mode == "incremental" else None)


@given(st.integers(0, 2**62), st.floats(0, 3600))
def test_an_incremental_run_looks_back_the_lag_from_the_watermark(watermark: int, lag_s: float) -> None:
    props = {**RECORDED, SCORED_WATERMARK: str(watermark)}
    scope = plan_run(props, "v1", "d1", 8, False, lag_s)
    assert scope.mode == "incremental"
    assert scope.since_us is not None and watermark - scope.since_us == int(lag_s * 1_000_000)


@given(st.lists(st.integers(0, 2**62), max_size=10), st.none() | st.integers(0, 2**62).map(str))
def test_the_watermark_is_the_latest_assembly_and_never_moves_back(assembled: list[int], previous: str | None) -> None:
    changed = pl.DataFrame({"assembled_us": pl.Series(assembled, dtype=pl.Int64)})
    after = max_watermark(changed, previous)
    if not assembled:
        assert after == previous
    else:
        assert after == str(max([*assembled, int(previous or 0)]))
