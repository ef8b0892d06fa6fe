"""Calibration on real, honest agent runs: import every run in shared/, assemble, score.

No behavioural or security flag, the right failure causes, ``reasoning_content`` as the thought,
the submitted patch byte-identical, and an evaluation that arrives after the import counted once.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.score import score_all
from producers.importers import import_trajectory
from tests.helpers import AS_OF, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "real-trajectories"
pytestmark = [
    pytest.mark.skipif(not DATA.is_dir(), reason=f"real trajectories absent at {DATA}"),
    pytest.mark.slow,  # scoring every real run once for the module: ~10 s
]
MINI = DATA / "mini-swe-agent"
DEEPSEEK = MINI / "deepseek-reasoner-dev"


def real_runs() -> list[Path]:
    """Every recorded run in shared/ (trajectory files, not their reports, configs or licences)."""
    if not DATA.is_dir():
        return []
    return sorted(
        p
        for p in DATA.rglob("*")
        if p.is_file()
        and p.suffix in (".json", ".jsonl", ".traj")
        and p.name != "manifest.json"
        and not p.name.endswith(".report.json")
    )


def _settings(home: Path) -> Settings:
    return load_settings(home=home, topic="unused", kafka_bootstrap=None, catalog_uri=None)


def _by_file(settings: Settings) -> dict[str, dict]:
    columns, rows = run_query(
        settings,
        "SELECT t.task_id, t.task_family, t.status, t.exit_reason, t.completed, s.completion, s.failure_cause, "
        "s.retry_advice, s.exportable, s.flags, s.quality FROM trajectories t JOIN scores s USING (session_id)",
    )
    return {row[0]: dict(zip(columns, row, strict=True)) for row in rows}


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, list[dict]]:
    settings = _settings(tmp_path_factory.mktemp("real-runs"))
    events = [event for path in real_runs() for event in import_trajectory(path)]
    write_raw(settings, events, batch_size=5000)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    return settings, events


@pytest.mark.slow
def test_honest_real_runs_get_no_behavioural_or_security_flag(scored) -> None:
    settings, events = scored
    sessions = {e["session_id"] for e in events}
    assert len(sessions) >= 30  # 16 mini-swe-agent, 5 SWE-agent, 4 OpenHands event lists, 6 ProntoQA lines
    _, rows = run_query(settings, "SELECT session_id, flag, evidence FROM flags WHERE flag_class <> 'anomaly'")
    assert rows == []
    _, counted = run_query(settings, "SELECT count(*) FROM scores")
    assert counted[0][0] == len(sessions)


def test_failure_causes_of_real_runs(scored) -> None:
    settings, _ = scored
    rows = _by_file(settings)
    django = rows["django__django-11099"]
    assert django["status"] == "completed" and django["completed"] and django["completion"] == 1.0
    assert django["failure_cause"] == "success" and django["exportable"]
    for instance in ("pvlib__pvlib-python-1072", "sqlfluff__sqlfluff-1733", "pylint-dev__astroid-1196"):
        assert (rows[instance]["failure_cause"], rows[instance]["retry_advice"]) == ("infrastructure_error", "rerun")
        assert rows[instance]["exit_reason"].split(":")[0] in ("InternalServerError", "Timeout")  # the framework's own
    for instance in ("sqlfluff__sqlfluff-1625", "marshmallow-code__marshmallow-1343"):
        assert rows[instance]["failure_cause"] == "unevaluated" and rows[instance]["completion"] == 0.0
    causes = {r["failure_cause"] for r in rows.values()}
    assert "wrong_answer" in causes  # ProntoQA_1 was evaluated and wrong
    assert rows["ProntoQA_2"]["failure_cause"] == "success" and rows["ProntoQA_1"]["failure_cause"] == "wrong_answer"
    # every SWE-agent and OpenHands event-list run is unevaluated, never wrong
    assert all(r["failure_cause"] != "cheating" for r in rows.values())


def test_thought_is_reasoning_content_and_patch_is_verbatim(scored) -> None:
    settings, _ = scored
    path = DEEPSEEK / "sqlfluff__sqlfluff-1763.traj.json"
    raw = json.loads(path.read_text())
    reasoning = [m["reasoning_content"] for m in raw["messages"] if m["role"] == "assistant"]
    _, rows = run_query(
        settings,
        "SELECT s.thought, s.tool_call_id FROM steps s JOIN trajectories t USING (session_id) "
        "WHERE t.task_id = 'sqlfluff__sqlfluff-1763' ORDER BY s.step_index",
    )
    calls = [
        (m["reasoning_content"], c["id"]) for m in raw["messages"] if m["role"] == "assistant" for c in m["tool_calls"]
    ]
    assert [(t, c) for t, c in rows] == calls and len(set(reasoning)) > 10
    for instance in ("sqlfluff__sqlfluff-1763", "django__django-11099", "marshmallow-code__marshmallow-1343"):
        source = next(MINI.rglob(f"{instance}.traj.json"))
        submission = json.loads(source.read_text())["info"]["submission"]
        _, found = run_query(
            settings,
            "SELECT s.output FROM steps s JOIN trajectories t USING (session_id) "
            f"WHERE t.task_id = '{instance}' ORDER BY s.step_index DESC LIMIT 1",
        )
        assert found[0][0].encode() == submission.encode()


@pytest.mark.slow
def test_evaluation_arriving_after_import_is_added_once(tmp_path: Path) -> None:
    run = tmp_path / "django__django-11099.traj.json"
    shutil.copy(MINI / "django__django-11099.traj.json", run)
    settings = _settings(tmp_path / "home")
    before = import_trajectory(run)
    assert "evaluation" not in {e["event_type"] for e in before}
    write_raw(settings, before)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    assert _by_file(settings)["django__django-11099"]["failure_cause"] == "unevaluated"
    shutil.copy(MINI / "django__django-11099.report.json", tmp_path / "django__django-11099.report.json")
    after = import_trajectory(run)
    old = {e["event_id"]: e for e in before}
    new = [e for e in after if e["event_id"] not in old]
    assert [e["event_type"] for e in new] == ["evaluation"]  # nothing else changed id
    assert all(old[e["event_id"]] == e for e in after if e["event_id"] in old)  # nor payload
    write_raw(settings, after)  # the whole run again, as a re-import sends it
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    _, ends = run_query(settings, "SELECT count(*) FROM events WHERE event_type = 'session_end'")
    assert ends[0][0] == 2  # two raw copies of one event id (ingest keeps one; assembly dedups)
    _, counts = run_query(settings, "SELECT n_events, status, eval_passed, reward FROM trajectories")
    assert counts == [(len(after), "completed", True, 1.0)]
    row = _by_file(settings)["django__django-11099"]
    assert (row["failure_cause"], row["completion"], row["exportable"]) == ("success", 1.0, True)
