"""Every shape a run is saved in, and no path that silently gives nothing.

OpenHands conversations saved one event per file (the SDK's ``events/`` beside ``base_state.json``,
the CLI's bare event files, V0 sessions), recognised by what the files hold; a Harbor trajectory
given alone with its trial's verdict; harness reports found above a run; a forced ``--format``
that does not fit; sessions yielded one at a time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from producers.importers import ImportFormatError, detect_format, import_file, import_paths, iter_import
from producers.importers import harbor as harbor_module
from producers.importers._builder import ImportedSession
from producers.importers.verdicts import parse_verdicts, verdict_beside

FIXTURES = Path(__file__).parent / "fixtures"
REAL = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "real-trajectories"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"real trajectories absent at {REAL}")


def _kinds(session: ImportedSession) -> list[str]:
    return [e["event_type"] for e in session.events]


def _steps(session: ImportedSession) -> list[tuple[str, str]]:
    return [
        (e["payload"]["tool_name"], e["payload"]["arguments"])
        for e in session.events
        if e["event_type"] == "agent_action"
    ]


def _split(events: list[dict], directory: Path, name: str) -> None:
    directory.mkdir(parents=True)
    for index, event in enumerate(events):
        (directory / name.format(index=index)).write_text(json.dumps(event))


def test_openhands_cli_bare_event_files_and_sdk_directory_import_like_the_event_array(tmp_path: Path) -> None:
    events = json.loads((FIXTURES / "openhands_v1" / "acme__widgets-106.events.json").read_text())
    (array,) = import_file(FIXTURES / "openhands_v1" / "acme__widgets-106.events.json").sessions
    cli = tmp_path / "conversations" / "5f0c2a"
    _split(events, cli, "event-{index:05d}-x.json")  # the CLI's bare event files, no base_state.json
    sdk = tmp_path / "sdk" / "7a1b"
    _split(events, sdk / "events", "event-{index:05d}-y.json")
    (sdk / "base_state.json").write_text(json.dumps({"id": "7a1b", "execution_status": "finished"}))
    renamed = tmp_path / "renamed"
    _split(events, renamed, "{index}.json")  # recognised by content, not by the file names
    for directory in (cli, sdk, renamed):
        assert detect_format(directory) == "openhands-v1"
        (session,) = import_file(directory).sessions
        assert session.steps == array.steps > 0
        assert _steps(session) == _steps(array)
        assert _kinds(session).count("env_feedback") == _kinds(array).count("env_feedback")
    with pytest.raises(ImportFormatError, match="one openhands-v1 event of a conversation.*import its directory"):
        import_file(next(cli.iterdir()))
    # the tree that holds them: each conversation once, nothing skipped
    result = import_file(tmp_path)
    assert len(result.sessions) == 3 and not result.quarantined and not result.skipped


def test_condensation_pause_and_rejection_are_read(tmp_path: Path) -> None:
    events = json.loads((FIXTURES / "openhands_v1" / "acme__widgets-106.events.json").read_text())
    summary = "Earlier the agent read size.py and units.py."
    extra = [
        {"id": "c1", "kind": "Condensation", "source": "environment", "timestamp": events[-1]["timestamp"],
         "forgotten_event_ids": [events[1]["id"], events[2]["id"]], "summary": summary, "llm_response_id": "r9"},
        {"id": "m1", "kind": "MessageEvent", "source": "agent", "timestamp": events[-1]["timestamp"],
         "llm_message": {"role": "assistant", "content": [{"type": "text", "text": "Done: sizes parse."}]},
         "llm_response_id": "r10"},
        {"id": "p1", "kind": "PauseEvent", "source": "user", "timestamp": events[-1]["timestamp"]},
    ]  # fmt: skip
    directory = tmp_path / "conv"
    _split([*events, *extra], directory, "event-{index:05d}-z.json")
    (session,) = import_file(directory).sessions
    (plain,) = import_file(FIXTURES / "openhands_v1" / "acme__widgets-106.events.json").sessions
    (end,) = [e for e in session.events if e["event_type"] == "session_end"]
    assert "paused" in end["payload"]["exit_reason"]
    inputs = [e["payload"] for e in session.events if e["event_type"] == "agent_input"]
    assert len(inputs) == _kinds(plain).count("agent_input") + 1  # the agent's reply is a model call of its own
    assert "history condensed: 2 events summarised" in (inputs[-1]["content"] or "")
    assert session.steps == plain.steps


@needs_real
def test_openhands_v0_session_saved_one_event_per_file(tmp_path: Path) -> None:
    path = REAL / "openhands" / "basic.json"
    (whole,) = import_file(path).sessions
    session_dir = tmp_path / "sessions" / "abc123" / "events"
    _split(json.loads(path.read_text()), session_dir, "{index}.json")  # 10.json after 9.json
    assert detect_format(session_dir.parent) == "openhands"
    (session,) = import_file(session_dir.parent).sessions
    assert session.steps == whole.steps > 0 and _steps(session) == _steps(whole)


def test_a_harbor_trajectory_given_alone_finds_its_trials_result(tmp_path: Path) -> None:
    trial = FIXTURES / "harbor_job" / "hello-world__Xy7aQ"
    (whole,) = import_file(trial).sessions
    alone = import_file(trial / "agent" / "trajectory.json")
    (session,) = alone.sessions
    assert session.session_id == whole.session_id and session.task_id == "hello-world"
    (verdict,) = [e["payload"] for e in session.events if e["event_type"] == "evaluation"]
    assert verdict["passed"] and verdict["provenance"] == "harbor_verifier"


def test_swe_smith_run_report_and_timed_out_instance(tmp_path: Path) -> None:
    report = {"resolved": 1, "unresolved": 1, "total": 2, "ids_resolved": ["a__b.1"], "ids_unresolved": ["c__d.2"]}
    found = parse_verdicts(tmp_path / "report.json", report)
    assert found is not None
    assert {i: v.passed for i, v in found.verdicts.items()} == {"a__b.1": True, "c__d.2": False}
    timed_out = parse_verdicts(tmp_path / "e__f.3" / "report.json", {"timed_out": True, "timeout": 240})
    assert timed_out is not None and timed_out.unevaluated == ["e__f.3"] and not timed_out.verdicts


@needs_real
def test_a_run_report_above_the_run_gives_its_verdict_by_exact_instance(tmp_path: Path) -> None:
    run = tmp_path / "run-7" / "django__django-11099"
    run.mkdir(parents=True)
    shutil.copy(REAL / "mini-swe-agent" / "django__django-11099.traj.json", run)
    report = {"ids_resolved": [], "ids_unresolved": ["django__django-11099"], "resolved": 0, "unresolved": 1}
    (tmp_path / "run-7" / "report.json").write_text(json.dumps(report))
    (session,) = import_file(run / "django__django-11099.traj.json").sessions
    (verdict,) = [e["payload"] for e in session.events if e["event_type"] == "evaluation"]
    assert verdict["passed"] is False and verdict["provenance"] == "harness_report"
    # a report on a family or a prefix of the id judges nothing
    (tmp_path / "run-7" / "report.json").write_text(json.dumps({"ids_resolved": ["django__django", "django"]}))
    assert verdict_beside(run / "django__django-11099.traj.json", "django__django-11099") is None


@needs_real
def test_a_forced_format_that_does_not_fit_says_what_the_file_looks_like() -> None:
    with pytest.raises(ImportFormatError, match="does not fit.*looks like swe-agent"):
        import_file(REAL / "swe-agent" / "v0_gpt4__pydicom__pydicom-1458.traj", format="openhands")
    with pytest.raises(ImportFormatError, match="looks like a verdict report"):
        import_file(REAL / "mini-swe-agent" / "django__django-11099.report.json", format="mini-swe-agent")


def test_every_path_that_gives_no_session_is_named_with_the_reason(tmp_path: Path) -> None:
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "notes.json").write_text(json.dumps({"hello": "world"}))
    empty = tmp_path / "empty"
    empty.mkdir()
    report = import_paths([FIXTURES / "openhands_v1" / "acme__widgets-106.events.json", nothing, empty])
    assert len(report.summaries) == 1
    assert [path for path, _ in report.empty] == [str(nothing), str(empty)]
    assert "notes.json" in report.empty[0][1] and "unknown trajectory format" in report.empty[0][1]


def test_a_job_is_sent_a_trial_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    converted: list[str] = []
    real = harbor_module.convert_trial

    def counting(trial: Path, only: Path | None = None) -> list[ImportedSession]:
        converted.append(trial.name)
        return real(trial, only)

    monkeypatch.setattr(harbor_module, "convert_trial", counting)
    items = iter_import(FIXTURES / "harbor_job")
    first = next(items)
    assert isinstance(first, ImportedSession) and len(converted) == 1  # the second trial is not read yet
    rest = list(items)
    assert len(converted) == 2 and len(rest) == 1


@pytest.mark.slow  # loads the pipelines layer (the warehouse), seconds on a busy machine
def test_verdicts_given_with_runs_count_the_instances_no_session_is(tmp_path: Path) -> None:
    from pipelines.intake.importing import _match

    report = {"resolved_ids": ["a__b-1", "org/repo:pr-2"], "unresolved_ids": ["a__b", "a__b-"]}
    found = parse_verdicts(tmp_path / "report.json", report)
    assert found is not None
    judged, unmatched = _match([found], {"a__b-1", "org__repo-2"})
    assert judged == ["a__b", "a__b-", "a__b-1", "org/repo:pr-2"]
    assert unmatched == ["a__b", "a__b-"]  # a family name and a prefix match nothing


@needs_real
def test_a_harness_log_tree_beside_the_runs_judges_them(tmp_path: Path) -> None:
    runs = tmp_path / "trajs" / "django__django-11099"
    runs.mkdir(parents=True)
    shutil.copy(REAL / "mini-swe-agent" / "django__django-11099.traj.json", runs)
    logs = tmp_path / "logs" / "run_evaluation" / "run-1" / "model" / "django__django-11099"
    logs.mkdir(parents=True)
    shutil.copy(REAL / "mini-swe-agent" / "django__django-11099.report.json", logs / "report.json")
    expected = json.loads((logs / "report.json").read_text())["django__django-11099"]["resolved"]
    sent: list[ImportedSession] = []
    report = import_paths([tmp_path], send=sent.append)
    assert not report.empty and len(sent) == 1
    (verdict,) = [e["payload"] for e in sent[0].events if e["event_type"] == "evaluation"]
    assert verdict["passed"] is expected and verdict["provenance"] == "harness_report"


def test_a_report_joins_a_session_whose_only_verdict_is_its_own_claim(tmp_path: Path) -> None:
    from producers.importers.verdicts import with_verdicts

    run = json.loads((FIXTURES / "atif" / "run.atif.json").read_text())
    run["extra"] = {**run["extra"], "eval_passed": True}  # the agent's file claims it passed
    path = tmp_path / "run.atif.json"
    path.write_text(json.dumps(run))
    (session,) = import_file(path).sessions
    report = parse_verdicts(tmp_path / "r.json", {"resolved_ids": [], "unresolved_ids": [session.task_id]})
    assert report is not None
    assert with_verdicts(session, [report]) is not None
    provenances = [e["payload"]["provenance"] for e in session.events if e["event_type"] == "evaluation"]
    assert provenances == ["self_reported", "harness_report"]  # precedence at assembly decides which counts
    assert with_verdicts(session, [report]) is None  # a harness verdict is there: not twice


def test_the_report_given_at_import_joins_a_session_whose_own_file_carries_a_harness_verdict(tmp_path: Path) -> None:
    """The probe: ``import output.jsonl --verdicts report.json`` where the run's own file says it was resolved.

    The report's verdict was not attached (a 'harness' verdict was already there), so the run's own file
    decided the outcome and the operator's report for that exact instance was dropped silently. Now it joins
    after the file's, and assembly's precedence decides (the same rank: the later one, the report's).
    """
    from producers.importers.verdicts import with_verdicts

    lines = (FIXTURES / "openhands_v0" / "output.jsonl").read_text().splitlines()
    run = next(json.loads(line) for line in lines if json.loads(line).get("test_result") is not None)
    path = tmp_path / "output.jsonl"
    path.write_text(json.dumps(run) + "\n")
    (session,) = import_file(path).sessions
    own = [e["payload"] for e in session.events if e["event_type"] == "evaluation"]
    assert [v["provenance"] for v in own] == ["harness_report"]
    verdict = not own[0]["passed"]  # the report says the opposite of the file
    judged = {"resolved_ids": [session.task_id], "unresolved_ids": []}
    if not verdict:
        judged = {"resolved_ids": [], "unresolved_ids": [session.task_id]}
    report = parse_verdicts(tmp_path / "r.json", judged)
    assert report is not None
    assert with_verdicts(session, [report]) is not None
    evaluations = [e for e in session.events if e["event_type"] == "evaluation"]
    assert [e["payload"]["passed"] for e in evaluations] == [own[0]["passed"], verdict]
    assert evaluations[-1]["seq"] > evaluations[0]["seq"]  # the report's comes last: it counts at equal rank
    assert with_verdicts(session, [report]) is None  # the same report again: not twice


def test_a_harbor_trial_whose_result_has_no_rewards_takes_the_verifiers_output(tmp_path: Path) -> None:
    trial = tmp_path / "hello-world__Xy7aQ"
    shutil.copytree(FIXTURES / "harbor_job" / "hello-world__Xy7aQ", trial)
    result = json.loads((trial / "result.json").read_text())
    (trial / "result.json").write_text(json.dumps({**result, "verifier_result": None}))
    (trial / "verifier" / "reward.txt").write_text("0\n")
    (session,) = import_file(trial).sessions
    (verdict,) = [e["payload"] for e in session.events if e["event_type"] == "evaluation"]
    assert verdict["passed"] is False and verdict["reward"] == 0.0 and verdict["provenance"] == "harbor_verifier"
    (trial / "verifier" / "reward.txt").write_text("1")
    (session,) = import_file(trial / "agent" / "trajectory.json").sessions  # alone, too
    (verdict,) = [e["payload"] for e in session.events if e["event_type"] == "evaluation"]
    assert verdict["passed"] is True
