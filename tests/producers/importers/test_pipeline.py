"""Every fixture format through the lakehouse: import, assemble, score, export.

A run its harness resolved ends with completion 1, unflagged and exported with its submission
byte-identical; a run evaluated as unresolved is failed; nobody honest is flagged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set, read_export
from pipelines.score import score_all
from producers.importers import import_file
from tests.helpers import AS_OF, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

FIXTURES = Path(__file__).parent / "fixtures"
FORMATS = [
    "mini_swe_agent_v1",
    "mini_swe_agent_v2",
    "swe_agent",
    "openhands_v0",
    "openhands_v1",
    "harbor_job",
    "atif",
    "otel",
]
#: instance -> the harness's verdict (None: nobody evaluated it)
VERDICTS = {
    "acme__widgets-101": True,
    "acme__widgets-102": False,
    "acme__widgets-103": True,
    "acme__widgets-104": True,
    "acme__widgets-105": False,
    "acme__widgets-106": None,
    "acme__widgets-107": None,
    "acme__widgets-108": False,
    "enigma_rev_crackme": None,
    "hello-world": True,
    "fix-git": False,
}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, dict[str, dict]]:
    settings = load_settings(home=tmp_path_factory.mktemp("formats"), topic="unused", kafka_bootstrap=None)
    sessions = [s for name in FORMATS for s in import_file(FIXTURES / name).sessions]
    write_raw(settings, [e for s in sessions for e in s.events], batch_size=5000)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    columns, rows = run_query(
        settings,
        "SELECT t.session_id, t.task_id, t.n_steps, t.eval_passed, t.verdict_provenance, t.status, s.completion, "
        "s.exportable, s.flags, s.failure_cause FROM trajectories t JOIN scores s USING (session_id)",
    )
    by_id = {row[0]: dict(zip(columns, row, strict=True)) for row in rows}
    return settings, {s.session_id: {**by_id[s.session_id], "imported": s} for s in sessions}


@pytest.mark.slow
def test_every_session_lands_with_its_actions_as_steps(lake) -> None:
    _, sessions = lake
    assert len(sessions) >= 13
    for row in sessions.values():
        assert row["n_steps"] == row["imported"].steps, row["task_id"]


@pytest.mark.slow  # imports, assembles and scores real runs: over 5 s on a loaded 2-core host
def test_verdicts_count_by_their_provenance(lake) -> None:
    _, sessions = lake
    for row in sessions.values():
        expected = VERDICTS.get(row["task_id"])
        assert row["eval_passed"] == expected, row["task_id"]
        if expected:
            assert row["completion"] == 1.0 and row["exportable"] and not row["flags"], row
        if expected is not None:
            assert row["verdict_provenance"] in ("harness_report", "harbor_verifier")
    causes = {row["task_id"]: row["failure_cause"] for row in sessions.values()}
    assert causes["acme__widgets-105"] == causes["acme__widgets-108"] == "limit_reached"
    assert causes["acme__widgets-107"] == "configuration_error"  # a rejected API key: fix it, then rerun


def test_no_honest_run_is_flagged(lake) -> None:
    settings, _ = lake
    _, rows = run_query(settings, "SELECT session_id, flag, evidence FROM flags WHERE flag_class <> 'anomaly'")
    assert rows == []


def test_resolved_runs_export_with_their_submission_byte_identical(lake, tmp_path: Path) -> None:
    settings, sessions = lake
    export_training_set(Lakehouse.open(settings), "openai", tmp_path / "out", min_quality=0.0, filters=ALL_ORIGINS)
    records = read_export(tmp_path / "out")
    exported = {r["session_id"]: r for r in records}
    resolved = {sid for sid, row in sessions.items() if VERDICTS.get(row["task_id"])}
    assert resolved <= set(exported)
    for sid in resolved:
        events = sessions[sid]["imported"].events
        end = next(e for e in events if e["event_type"] == "session_end")
        submission_id = (end.get("extra") or {}).get("submission_event_id")
        if submission_id:
            original = next(e for e in events if e["event_id"] == submission_id)["payload"]["output"]
            assert exported[sid]["submission"].encode() == original.encode()
