"""Quality definitions: graph, partitions and schedule snapshot; assets and checks materialize in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dagster import AssetKey, DailyPartitionsDefinition, materialize

from common.settings import load_settings
from dagster_project.definitions import defs
from dagster_project.defs.quality import duplicate_rate, flag_rate, quality_tables, scores_in_range, training_set
from dagster_project.resources import LakehouseResource
from pipelines.assemble import assemble
from producers.fleet import run_fleet
from tests.helpers import plain, write_raw
from warehouse.lakehouse import Lakehouse


def test_quality_definitions_snapshot() -> None:
    graph = defs.resolve_asset_graph()
    parents = {
        key.to_user_string(): sorted(p.to_user_string() for p in graph.get(key).parent_keys)
        for key in graph.get_all_asset_keys()
    }
    assert parents["scores"] == ["steps", "trajectories"]
    assert parents["flags"] == ["raw_events", "steps", "trajectories"]
    assert parents["duplicates"] == ["steps", "trajectories"]
    assert parents["training_set"] == ["duplicates", "flags", "scores"]
    partitions = graph.get(AssetKey("training_set")).partitions_def
    assert isinstance(partitions, DailyPartitionsDefinition)
    assert partitions.start.strftime("%Y-%m-%d") == "2026-01-01" and partitions.timezone == "UTC"
    schedule = defs.resolve_schedule_def("nightly_training_set_schedule")
    assert schedule.cron_schedule == "30 2 * * *" and schedule.job_name == "nightly_training_set"
    checks = sorted((key.asset_key.to_user_string(), key.name) for key in graph.asset_check_keys)
    assert [c for c in checks if c[0] in {"scores", "flags", "duplicates"}] == [
        ("duplicates", "duplicate_rate"),
        ("flags", "flag_rate"),
        ("scores", "score_drift"),
        ("scores", "scores_in_range"),
    ]


@pytest.mark.slow
def test_quality_assets_and_checks_materialize(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home")
    events: list[dict] = []
    run_fleet(
        settings,
        backend="synthetic",
        sessions=40,
        seed=9,
        cheat_rate=0.2,
        sink=events.append,
        start_us=1_767_225_600_000_000 + 3_600_000_000,
    )  # 2026-01-01 01:00 UTC
    write_raw(settings, events, batch_size=5000)
    assemble(Lakehouse.open(settings))
    resources = {"lakehouse": LakehouseResource(home=str(settings.home))}
    result = materialize([quality_tables, scores_in_range, flag_rate, duplicate_rate], resources=resources)
    assert result.success
    meta = result.asset_materializations_for_node("quality_tables")
    scores_meta = plain(next(m for m in meta if m.asset_key == AssetKey("scores")).metadata)
    assert scores_meta["row_count"] == 40
    assert 0 <= scores_meta["quality_distribution"]["p50"] <= 1
    assert 0 < scores_meta["inference_share"] <= 1 and scores_meta["cost_per_exportable_usd"] > 0
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["scores_in_range"].passed
    assert set(evaluations) == {"scores_in_range", "flag_rate", "duplicate_rate"}
    exported = materialize([training_set], resources=resources, partition_key="2026-01-01")
    assert exported.success
    day_dir = settings.home_dir / "exports" / "hf" / "2026-01-01"
    assert (day_dir / "manifest.json").is_file() and (day_dir / "README.md").is_file()
    # the synthetic fleet's sessions are never training data: the nightly set leaves them out and counts them
    manifest = json.loads((day_dir / "manifest.json").read_text())
    assert manifest["counts"]["left_out"]["origin"].get("synthetic", 0) > 0
