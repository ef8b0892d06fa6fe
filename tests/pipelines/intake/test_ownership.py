"""Session ownership and verdict provenance: no import or other host takes over a session or forges its verdict."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.intake.admission import admit_verdict, door_key
from pipelines.intake.verdicts import attach_verdicts
from producers.importers import import_trajectory
from tests.helpers import AS_OF, sample_events, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

FIXTURES = Path(__file__).resolve().parents[2] / "producers" / "importers" / "fixtures"


def _lake(home: Path, **overrides: object) -> Settings:
    return load_settings(home=home, topic="unused", kafka_bootstrap=None, **overrides)


def _row(settings: Settings, session_id: str) -> dict:
    columns, rows = run_query(
        settings,
        "SELECT n_steps, n_events, eval_passed, reward, status, verdict_provenance, max_seq FROM trajectories "
        f"WHERE session_id = '{session_id}'",
    )
    return dict(zip(columns, rows[0], strict=True)) if rows else {}


def _quarantine(settings: Settings) -> list[tuple]:
    _, rows = run_query(settings, "SELECT session_id, reason, action, event_id FROM quarantine ORDER BY event_id")
    return rows


def _failed_fleet_session() -> tuple[str, list[dict]]:
    events = sample_events(3)
    failed = next(e["session_id"] for e in events if e["event_type"] == "evaluation" and not e["payload"]["passed"])
    return failed, [e for e in events if e["session_id"] == failed]


def _atif_claiming(session_id: str, steps: int = 40) -> dict:
    agent_steps = [
        {
            "step_id": i + 3,
            "source": "agent",
            "message": f"step {i}",
            "tool_calls": [{"tool_call_id": f"c{i}", "function_name": "bash", "arguments": {"command": f"echo {i}"}}],
            "observation": {"results": [{"source_call_id": f"c{i}", "content": str(i)}]},
        }
        for i in range(steps)
    ]
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": session_id,
        "agent": {"name": "forger", "version": "1"},
        "steps": [{"step_id": 1, "source": "system", "message": "s"}, {"step_id": 2, "source": "user", "message": "u"}]
        + agent_steps,
        "extra": {"reward": 1.0, "stop_reason": "terminal"},
    }


@pytest.mark.slow
def test_an_atif_file_claiming_a_fleet_session_id_does_not_take_it_over(tmp_path: Path) -> None:
    sid, fleet = _failed_fleet_session()
    alone = _lake(tmp_path / "alone")
    write_raw(alone, fleet)
    assemble(Lakehouse.open(alone), as_of=AS_OF)
    before = _row(alone, sid)
    assert before["eval_passed"] is False

    path = tmp_path / "forged.json"
    path.write_text(json.dumps(_atif_claiming(sid)))
    forged = import_trajectory(path)
    both = _lake(tmp_path / "both")
    write_raw(both, fleet + forged)
    assemble(Lakehouse.open(both), as_of=AS_OF)
    assert _row(both, sid) == before  # 40 steps and a reward of 1.0 claimed, nothing taken
    imported = forged[0]["session_id"]
    assert imported != sid and _row(both, imported)["n_steps"] == 40
    # the file's own reward is self-reported: kept in the events, not counted
    assert _row(both, imported)["eval_passed"] is None
    assert [r[1] for r in _quarantine(both)] == ["untrusted_verdict"]


@pytest.mark.slow
def test_an_atif_export_names_an_imported_run_by_its_own_id_only_when_no_other_session_has_it(tmp_path: Path) -> None:
    from pipelines.export import ExportFilters, export_training_set
    from pipelines.score import score_all

    sid, fleet = _failed_fleet_session()
    events = list(fleet)
    claims = {"forged": sid, "twin-a": "twin", "twin-b": "twin", "solo": "solo"}
    lake_ids = {}
    for name, claimed in claims.items():
        path = tmp_path / f"{name}.json"
        document = _atif_claiming(claimed, steps=2)
        document["steps"][1]["message"] = f"task of {name}"  # other bytes: another session
        path.write_text(json.dumps(document))
        imported = import_trajectory(path)
        lake_ids[name] = imported[0]["session_id"]
        events += imported
    settings = _lake(tmp_path / "lake")
    write_raw(settings, events)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    score_all(Lakehouse.open(settings))
    export_training_set(
        Lakehouse.open(settings),
        "atif",
        tmp_path / "out",
        filters=ExportFilters(origins=(), min_quality=0.0, outcome="all"),
    )
    lines = [line for path in sorted((tmp_path / "out" / "data").iterdir()) for line in path.read_text().splitlines()]
    by_task = {json.loads(line)["steps"][1]["message"]: json.loads(line)["session_id"] for line in lines}
    # the only run that owns its id in this lake keeps it; a twin or a claim to another session's id does not
    assert by_task["task of solo"] == "solo"
    for name in ("forged", "twin-a", "twin-b"):
        assert by_task[f"task of {name}"] == lake_ids[name]
    ids = [json.loads(line)["session_id"] for line in lines]
    assert sid in ids and len(ids) == len(set(ids)) == len(claims) + 1


@pytest.mark.slow
def test_foreign_events_after_the_owners_first_are_quarantined_in_any_order(tmp_path: Path) -> None:
    sid, fleet = _failed_fleet_session()
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(_atif_claiming("x", steps=5)))
    # a producer that sends its events under the fleet session's id (no session_start of its own)
    foreign = [{**e, "session_id": sid} for e in import_trajectory(path) if e["event_type"] != "session_start"]
    alone, mixed, reversed_, forger_first = (
        _lake(tmp_path / name) for name in ("alone", "mixed", "reversed", "forger_first")
    )
    write_raw(alone, fleet)
    write_raw(mixed, fleet + foreign)
    # the owner's first event is admitted first; everything after it in any order and batching
    write_raw(reversed_, fleet[-1:])
    write_raw(reversed_, list(reversed(foreign + fleet[:-1])), batch_size=7)
    # arrival decides, not the claimed seq: whoever's event was admitted first owns the session
    write_raw(forger_first, foreign[:1])
    write_raw(forger_first, fleet + foreign[1:])
    for settings in (alone, mixed, reversed_, forger_first):
        assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert _row(mixed, sid) == _row(alone, sid) == _row(reversed_, sid)
    reasons = [r[1] for r in _quarantine(mixed)]
    assert len(reasons) == len(foreign) and set(reasons) == {"foreign_producer"}
    assert _quarantine(mixed) == _quarantine(reversed_)
    taken = {r[3]: r[1] for r in _quarantine(forger_first)}
    assert {e["event_id"] for e in fleet} <= set(taken)
    assert taken[next(e["event_id"] for e in fleet if e["event_type"] == "session_start")] == "ownership_conflict"


@pytest.mark.slow
def test_a_second_hosts_session_start_with_seq_0_cannot_take_a_running_session(tmp_path: Path) -> None:
    """The probe of issue 42: seq 0 and an all-zero event id, then a passing evaluation, from another host."""
    sid, fleet = _failed_fleet_session()
    start = next(e for e in fleet if e["event_type"] == "session_start")
    own = next(e for e in fleet if e["event_type"] == "evaluation")
    forged_start = {**start, "event_id": "0" * 32, "seq": 0, "host_id": "host-b"}
    forged_eval = {
        **own,
        "event_id": uuid.uuid4().hex,
        "seq": 1,
        "host_id": "host-b",
        "payload": {**own["payload"], "passed": True, "reward": 1.0, "tests_passed": own["payload"]["tests_total"]},
    }
    alone, attacked = _lake(tmp_path / "alone"), _lake(tmp_path / "attacked")
    write_raw(alone, fleet)
    running = [e for e in fleet if e["event_type"] not in ("evaluation", "session_end")]
    write_raw(attacked, running)
    write_raw(attacked, [forged_start, forged_eval])  # mid-session, with the lowest seq and event id there are
    write_raw(attacked, [e for e in fleet if e not in running])
    for settings in (alone, attacked):
        assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert _row(attacked, sid) == _row(alone, sid) and _row(attacked, sid)["eval_passed"] is False
    assert sorted(r[1:] for r in _quarantine(attacked)) == sorted(
        [("ownership_conflict", "excluded", "0" * 32), ("foreign_producer", "excluded", forged_eval["event_id"])]
    )


@pytest.mark.slow
def test_a_copy_of_the_owners_event_id_from_another_host_is_quarantined_not_taken_for_it(tmp_path: Path) -> None:
    sid, fleet = _failed_fleet_session()
    own = next(e for e in fleet if e["event_type"] == "evaluation")
    # the forger's copy arrives before the owner's own evaluation, under the owner's event id
    forged = {**own, "host_id": "host-b", "payload": {**own["payload"], "passed": True, "reward": 1.0}}
    alone, attacked = _lake(tmp_path / "alone"), _lake(tmp_path / "attacked")
    write_raw(alone, fleet)
    write_raw(attacked, [e for e in fleet if e is not own])
    write_raw(attacked, [forged])
    write_raw(attacked, [own])
    for settings in (alone, attacked):
        assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert _row(attacked, sid) == _row(alone, sid)
    assert [r[1:] for r in _quarantine(attacked)] == [("foreign_producer", "excluded", own["event_id"])]


@pytest.mark.slow
def test_a_foreign_event_cannot_claim_the_owners_evaluator(tmp_path: Path) -> None:
    sid, fleet = _failed_fleet_session()
    own = next(e for e in fleet if e["event_type"] == "evaluation")
    forged = {
        **own,
        "event_id": uuid.uuid4().hex,
        "seq": own["seq"] + 100,
        "host_id": "another-host",
        "payload": {**own["payload"], "passed": True, "reward": 1.0, "provenance": "fleet_evaluator"},
    }
    settings = _lake(tmp_path)
    write_raw(settings, [*fleet, forged])
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert _row(settings, sid)["eval_passed"] is False
    assert [r[1:3] for r in _quarantine(settings)] == [("foreign_producer", "excluded")]


@pytest.mark.slow
def test_which_provenances_count_is_configuration(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_atif_claiming("own-run", steps=2)))
    events = import_trajectory(path)
    sid = events[0]["session_id"]
    default, trusting = _lake(tmp_path / "default"), _lake(tmp_path / "trusting", trusted_verdicts="self_reported")
    for settings in (default, trusting):
        write_raw(settings, events)
        assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert _row(default, sid)["eval_passed"] is None and _row(default, sid)["reward"] is None
    row = _row(trusting, sid)
    assert (row["eval_passed"], row["reward"], row["verdict_provenance"]) == (True, 1.0, "self_reported")
    assert _row(default, sid)["n_events"] == row["n_events"]  # the uncounted verdict stays in the session


@pytest.mark.slow
def test_a_late_harness_report_is_attached_once_and_unknown_instances_are_reported(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "acme__widgets-102.traj.json"
    run.parent.mkdir()
    shutil.copy(FIXTURES / "mini_swe_agent_v2" / "acme__widgets-102" / "acme__widgets-102.traj.json", run)
    events = import_trajectory(run)  # no report beside it yet
    sid = events[0]["session_id"]
    settings = _lake(tmp_path / "home")
    write_raw(settings, events)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    assert _row(settings, sid)["eval_passed"] is None

    report = tmp_path / "report.json"  # a flat report in a harness layout, plus a summary naming another instance
    (tmp_path / "eval" / "acme__widgets-102").mkdir(parents=True)
    flat = tmp_path / "eval" / "acme__widgets-102" / "report.json"
    flat.write_text(json.dumps({"patch_successfully_applied": True, "resolved": True, "tests_status": {}}))
    report.write_text(json.dumps({"resolved_ids": ["acme/widgets:pr-999"], "unresolved_ids": []}))
    sent: list[dict] = []
    first = attach_verdicts(Lakehouse.open(settings), tmp_path / "eval", sent.append)
    assert [(i, s, p) for i, s, p in first.attached] == [("acme__widgets-102", sid, True)]
    second = attach_verdicts(Lakehouse.open(settings), tmp_path / "eval", sent.append)
    assert [e["event_id"] for e in sent[:1]] == [e["event_id"] for e in sent[1:]]  # the same event again
    write_raw(settings, sent)
    assemble(Lakehouse.open(settings), as_of=AS_OF)
    row = _row(settings, sid)
    assert (row["eval_passed"], row["reward"], row["verdict_provenance"]) == (True, 1.0, "harness_report")
    assert row["max_seq"] == len(events)  # the verdict follows the session's last event
    unknown = attach_verdicts(Lakehouse.open(settings), report, sent.append)
    assert [v.instance_id for v in unknown.unknown] == ["acme/widgets:pr-999"] and not unknown.attached
    assert second.files == 1 and unknown.quarantine_records()[0].reason == "unknown_instance"


@pytest.mark.slow
@pytest.mark.parametrize("provenance", ["harness_report", "harbor_verifier"])
@pytest.mark.parametrize("door", ["verdicts", "forged-verdicts", "another-host"])
def test_a_harness_verdict_never_replaces_the_fleet_evaluators(tmp_path: Path, provenance: str, door: str) -> None:
    """The probe of issue 42: false/0.44 from the fleet evaluator stays, whoever claims a harness report."""
    sid, fleet = _failed_fleet_session()
    own = next(e for e in fleet if e["event_type"] == "evaluation")
    late = {
        **own,
        "event_id": uuid.uuid4().hex,
        "seq": max(e["seq"] for e in fleet) + 1,
        "host_id": door.removeprefix("forged-"),
        "extra": {"source_kind": "verdicts"} if door.endswith("verdicts") else {},
        "payload": {**own["payload"], "passed": True, "reward": 1.0, "provenance": provenance},
    }
    alone, attacked = _lake(tmp_path / "alone"), _lake(tmp_path / "attacked")
    if door == "verdicts":  # the real door signs with the installation's key; a forger on the wire cannot
        late = admit_verdict(late, door_key(attacked.home_dir))
    write_raw(alone, fleet)
    write_raw(attacked, [*fleet, late])
    for settings in (alone, attacked):
        assemble(Lakehouse.open(settings), as_of=AS_OF)
    row = _row(attacked, sid)
    assert (row["eval_passed"], row["verdict_provenance"]) == (False, "fleet_evaluator")
    assert row == _row(alone, sid)
    reason = {"verdicts": "lower_verdict", "forged-verdicts": "unverified_door"}.get(door, "foreign_producer")
    assert [r[1] for r in _quarantine(attacked)] == [reason]
