"""Governance through the pipeline: a weight change rescores, shows in the manifest, and flags travel with records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set, read_export
from pipelines.score import score_all
from producers.sdk import SessionEmitter
from schemas import typed
from tests.helpers import AS_OF, BASE_US, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too


def _session(events: list[dict[str, Any]], name: str, edits_test: bool, offset: int) -> None:
    clock = iter(range(BASE_US + offset * 60_000_000, BASE_US + (offset + 1) * 60_000_000, 1_000_000))
    ids = iter(f"{name}-e{i}" for i in range(100))
    emitter = SessionEmitter(
        events.append,
        session_id=name,
        clock=lambda: next(clock),
        id_factory=lambda: next(ids),
        task_id=f"bugfix.clamp-{name}",
        task_type="bugfix",
        extra={"task_family": f"bugfix.clamp.{name}"},
    )
    emitter.start(
        cpu_limit=1.0,
        memory_limit_bytes=1 << 28,
        pids_limit=64,
        timeout_s=20.0,
        network_enabled=False,
        egress_allowlist=[],
        config_digest="c",
        instruction="Fix the bug in clamp_mod.py.",
    )
    for command in ("cat clamp_mod.py", "python3 run_tests.py", f"echo fix {name} > clamp_mod.py"):
        action = emitter.action("bash", command=command, thought="work")
        emitter.feedback(action, output="ok", exit_code=0)
    emitter.file_op("write", "/workspace/clamp_mod.py", size_bytes=10, in_workspace=True)
    if edits_test:
        emitter.file_op("write", "/workspace/tests/test_visible.py", size_bytes=10, in_workspace=True)
    changes = ["tests/test_visible.py"] if edits_test else []
    emitter.evaluation(
        passed=True,
        tests_total=5,
        tests_passed=5,
        reward=1.0,
        fresh_sandbox=True,
        evaluator="t",
        duration_ms=1.0,
        details=json.dumps({"deliverable": {"clamp_mod.py": "x"}, "ignored_changes": changes}),
    )
    payload: typed.SessionEnd = {
        "status": "completed",
        "runtime_s": 3.0,
        "reward": 1.0,
        "exit_reason": "agent_finished",
    }
    emitter.emit("session_end", payload, "system", extra={"processes_started": "7", "exit_codes": '{"0": 3}'})


def _settings(home: Path, **overrides: Any) -> Settings:
    return load_settings(home=home, topic="unused", kafka_bootstrap=None, catalog_uri=None, **overrides)


@pytest.mark.slow
def test_weight_change_rescores_and_is_in_the_manifest(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    _session(events, "honest", False, 0)
    _session(events, "suspect", True, 1)
    settings = _settings(tmp_path / "home")
    write_raw(settings, events)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    first = score_all(Lakehouse.open(settings))
    assert not first.skipped and score_all(Lakehouse.open(settings)).skipped  # nothing changed: nothing to redo
    # the host's process and exit-code counts are columns, and the profile of each task family has them
    _, rows = run_query(settings, "SELECT DISTINCT processes_started, exit_codes, task_family FROM trajectories")
    assert sorted(rows) == [(7, '{"0": 3}', "bugfix.clamp.honest"), (7, '{"0": 3}', "bugfix.clamp.suspect")]
    _, rows = run_query(settings, "SELECT profile, sessions, processes_started_p50, exit_codes FROM profiles")
    assert sorted(rows) == [
        ("sdk/bugfix.clamp.honest", 1, 7.0, '{"0": 1.0}'),
        ("sdk/bugfix.clamp.suspect", 1, 7.0, '{"0": 1.0}'),
    ]
    _, rows = run_query(settings, "SELECT session_id, quality, flags, exportable FROM scores ORDER BY 1")
    assert rows == [("honest", 1.0, "", True), ("suspect", 0.5, "edited_tests", True)]
    export_training_set(Lakehouse.open(settings), "hf", tmp_path / "out1", filters=ALL_ORIGINS)
    manifest = json.loads((tmp_path / "out1" / "manifest.json").read_text())
    assert manifest["scoring"]["governance"]["edited_tests"]["weight"] == 0.5
    assert manifest["scoring"]["digest"] == first.config_digest
    assert manifest["scoring"]["weights"] == {"completion": 0.5, "validity": 0.3, "novelty": 0.2}
    records = {r["session_id"]: r for r in read_export(tmp_path / "out1")}
    (flag,) = records["suspect"]["flags"]  # exported with the record, not dropped
    assert (flag["flag"], flag["flag_class"], flag["weight"]) == ("edited_tests", "behavioural", 0.5)
    assert records["honest"]["flags"] == []

    # the same lakehouse, another weight: the scorer version is unchanged, yet everything is rescored
    lighter = _settings(tmp_path / "home", quality_governance={"edited_tests": {"weight": 0.9}})
    second = score_all(Lakehouse.open(lighter))
    assert not second.skipped and second.config_digest != first.config_digest
    _, rows = run_query(lighter, "SELECT session_id, quality, config_digest FROM scores ORDER BY 1")
    assert [r[:2] for r in rows] == [("honest", 1.0), ("suspect", 0.9)]
    assert {r[2] for r in rows} == {second.config_digest}
    export_training_set(Lakehouse.open(lighter), "hf", tmp_path / "out2", filters=ALL_ORIGINS)
    manifest = json.loads((tmp_path / "out2" / "manifest.json").read_text())
    assert manifest["scoring"]["governance"]["edited_tests"]["weight"] == 0.9
    assert manifest["scoring"]["digest"] == second.config_digest
    # the weight in force when scoring is what the manifest reports, not the exporter's settings
    export_training_set(Lakehouse.open(settings), "hf", tmp_path / "out3", filters=ALL_ORIGINS)
    manifest = json.loads((tmp_path / "out3" / "manifest.json").read_text())
    assert manifest["scoring"]["governance"]["edited_tests"]["weight"] == 0.9
