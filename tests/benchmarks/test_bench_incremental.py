"""``trajlake bench incremental`` at a tiny size: the history writer's rows, and the runs' figures (never timings)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from benchmarks.harness import BASE_US, bench_home
from benchmarks.incremental import SPACING_US, HistoryWriter, bench_incremental, parse_sizes
from common.errors import ConfigError
from warehouse.lakehouse import Lakehouse
from warehouse.tables import STEPS, TRAJECTORIES

BASE = datetime.fromtimestamp(BASE_US / 1e6, UTC)


def test_parse_sizes() -> None:
    assert parse_sizes("5000000, 1_000_000") == [1_000_000, 5_000_000]
    for bad in ("1M", "0", ""):
        with pytest.raises(ConfigError):
            parse_sizes(bad)


def test_history_writer_fills_real_tables_by_day(tmp_path: Path) -> None:
    with bench_home(tmp_path, kafka=False) as settings:
        lake = Lakehouse.open(settings)
        writer = HistoryWriter(lake, seed=3, batch=700)
        writer.write(1_500)  # three batches
        day, _ = writer.write_day(300)
        trajectories = lake.table(TRAJECTORIES.name)
        steps = lake.table(STEPS.name)
        t = pl.DataFrame(trajectories.scan().to_arrow()).sort("session_id")
        s = pl.DataFrame(steps.scan().to_arrow())
        partitions = {str(row["partition"]) for row in trajectories.inspect.files().to_pylist()}
    assert t.columns == TRAJECTORIES.arrow_schema().names and s.columns == STEPS.arrow_schema().names
    assert t.height == t["session_id"].n_unique() == writer.sessions == 1_800
    assert s.height == writer.steps_written == t["n_steps"].sum()
    # assembled after it ended, in the order written: the new day after all of history
    assert (t["assembled_at"] > t["ended_at"]).all()
    assert (t["assembled_at"].diff().drop_nulls() >= timedelta(0)).all()
    last_history, first_new = t["assembled_at"].head(1_500).max(), t["assembled_at"].tail(300).min()
    assert isinstance(last_history, datetime) and isinstance(first_new, datetime) and first_new > last_history
    # history at 35 sessions/s from BASE; the new day from the next midnight, in its own partition
    assert day == BASE + timedelta(days=1) and len(partitions) == 2
    started = t["started_at"].dt.epoch("us")
    assert (started.head(1_500).diff().drop_nulls() == SPACING_US).all()
    assert t["started_at"][1_500] == day
    # every step lies inside its session; per-session counters agree with the steps
    joined = s.join(t.select("session_id", "started_at", "ended_at", "n_tool_errors"), on="session_id")
    assert (
        joined.filter((pl.col("ts") <= pl.col("started_at")) | (pl.col("feedback_ts") >= pl.col("ended_at"))).height
        == 0
    )
    errors = s.group_by("session_id").agg((pl.col("exit_code") != 0).sum().alias("errors"))
    check = t.join(errors, on="session_id")
    assert (check["errors"] == check["n_tool_errors"]).all()
    # near-duplicates: sessions whose first command was changed repeat a pool trajectory after it
    ordered = s.sort("session_id", "step_index").group_by("session_id", maintain_order=True).agg("command")
    copies = ordered.filter(pl.col("command").list.first().str.starts_with("echo changed"))
    assert 0.005 * t.height <= copies.height <= 0.04 * t.height
    pool_n, pool_offsets, _, _ = writer._pool
    vocab = writer._vocab.to_pylist()
    pool = {
        tuple(vocab[c] for c in writer._pool[3][start + 1 : start + n])
        for start, n in zip(pool_offsets.tolist(), pool_n.tolist(), strict=True)
    }
    assert all(tuple(commands[1:]) in pool for commands in copies["command"].to_list())


@pytest.mark.slow
def test_bench_incremental_tiny(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the scoring children's watermark lag: 10 s of history (~350 sessions) instead of 120 s (all of a tiny one)
    monkeypatch.setenv("TRAJLAKE_SCORE_WATERMARK_LAG_S", "10")
    day = 500
    result = bench_incremental(history=[2_000, 6_000], day=day, batch=2_500, home=tmp_path)
    runs = result["runs"]
    assert [run["history"] for run in runs] == [2_000, 6_000] and result["sessions_written"] == 6_500
    assert runs[0]["day"] < runs[1]["day"]
    for run in runs:
        history = run["history"]
        assert run["catch_up"]["scores_rows"] == history
        new_day = run["new_day"]
        # every session scored once; the run looked at the new day and the watermark lag's tail, not all history
        assert new_day["scores_rows"] == new_day["scores_sessions"] == new_day["sessions"] == history + day
        assert new_day["mode"] == "incremental"
        assert day <= new_day["changed_sessions"] < history + day
        assert new_day["changed_sessions"] <= new_day["rescored_sessions"] <= history + day
        assert new_day["wall_s"] > 0 and new_day["peak_rss_mib"] > 50
    assert runs[0]["catch_up"]["mode"] == "full" and runs[1]["catch_up"]["mode"] == "incremental"
    rescore = result["force"]
    assert rescore["mode"] == "full" and rescore["changed_sessions"] == rescore["scores_rows"] == 6_500
    names = [f["name"] for f in result["figures"]]
    assert names == [
        "history writer",
        "new day of 500 wall, on 6,000 history vs on 2,000",
        "new day of 500 peak RSS, on 6,000 history vs on 2,000",
        "full rescore of 6,500 peak RSS vs the 4 GB target",
        "new day score vs full rescore, 6,000 history",
    ]
    assert all(f["value"] > 0 and f["ratio"] > 0 for f in result["figures"])
    printed = capsys.readouterr().out
    assert "== bench incremental ==" in printed
    assert "6000: new_day score sessions changed / rescored / scores rows" in printed
