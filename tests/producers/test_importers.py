"""Importers of recorded third-party runs: real SWE-agent, mini-swe-agent and OpenHands files."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from producers.errors import ProducerError
from producers.importers import (
    ImportFormatError,
    detect_format,
    import_paths,
    import_trajectory,
)
from producers.parts import PART_BYTES
from schemas.registry import decode_event, encode_event
from warehouse.lakehouse import Lakehouse

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "real-trajectories"
pytestmark = pytest.mark.skipif(not (DATA / "manifest.json").is_file(), reason=f"real trajectories absent at {DATA}")

FRAMEWORK_OF = {"swe-agent": "swe-agent", "mini-swe-agent": "mini-swe-agent", "openhands": "openhands"}
MINI = DATA / "mini-swe-agent" / "django__django-11099.traj.json"


def _runs() -> list[tuple[str, int]]:
    if not (DATA / "manifest.json").is_file():
        return []
    manifest = json.loads((DATA / "manifest.json").read_text())
    # Entries without a step count (added later: the deepseek-reasoner runs, OpenHands eval output) are
    # covered by the judgement tests, which import every run in the directory.
    return [(entry["file"], entry["steps"]) for entry in manifest if (entry.get("steps") or 0) > 0]


RUNS = _runs()


@pytest.mark.parametrize(("name", "steps"), RUNS, ids=[name for name, _ in RUNS])
def test_real_run_imports_with_manifest_step_count(name: str, steps: int) -> None:
    path = DATA / name
    events = import_trajectory(path)
    framework = FRAMEWORK_OF[name.split("/")[0]]
    assert detect_format(path) == framework
    kinds = [e["event_type"] for e in events]
    assert kinds[0] == "session_start" and kinds.count("session_end") == 1
    # a companion report's evaluation is the only event that may follow session_end
    assert kinds[kinds.index("session_end") + 1 :] in ([], ["evaluation"])
    assert kinds.count("agent_action") == steps
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert all(a["ts"] <= b["ts"] for a, b in zip(events, events[1:], strict=False))
    assert len({e["session_id"] for e in events}) == 1
    assert len({e["event_id"] for e in events}) == len(events)
    first = events[0]
    assert first["payload"]["instruction"], "the task statement becomes the instruction"
    assert first["image_name"] == f"imported/{framework}" and first["host_id"] == "importer"
    assert first["extra"]["source_sha256"] and first["extra"]["source_format"]
    actions = {e["event_id"]: e for e in events if e["event_type"] == "agent_action"}
    for feedback in (e for e in events if e["event_type"] == "env_feedback"):
        action = actions[feedback["parent_event_id"]]
        assert feedback["payload"]["tool_call_id"] == action["payload"]["tool_call_id"]
        assert action["seq"] < feedback["seq"]
    for event in events:
        decoded = decode_event(encode_event(event), 1 << 22)
        assert decoded["event_id"] == event["event_id"]
        assert decoded["payload"] == {**decoded["payload"], **event["payload"]}


def test_reimport_gives_identical_ids_and_copy_elsewhere_too(tmp_path: Path) -> None:
    path = DATA / "openhands" / "basic_gui_mode.json"
    first, second = import_trajectory(path), import_trajectory(path)
    assert first == second
    copy = tmp_path / "renamed.json"
    shutil.copy(path, copy)
    # ids derive from content, not the file name: a renamed copy is the same session
    assert [e["event_id"] for e in import_trajectory(copy)] == [e["event_id"] for e in first]
    other = import_trajectory(DATA / "openhands" / "basic.json")
    assert not {e["event_id"] for e in other} & {e["event_id"] for e in first}


def test_mini_swe_agent_details() -> None:
    events = import_trajectory(MINI)
    raw = json.loads(MINI.read_text())
    tool_codes = [m["extra"]["returncode"] for m in raw["messages"] if m["role"] == "tool"]
    feedback = [e for e in events if e["event_type"] == "env_feedback"]
    # 41 tool messages carry return codes; the submit command is answered by the exit message
    assert [f["payload"]["exit_code"] for f in feedback[:-1]] == tool_codes
    assert feedback[-1]["payload"]["output"] == raw["messages"][-1]["content"]
    elided = [f for f in feedback if f["payload"]["truncated"]]
    assert elided and all(f["payload"]["output_bytes"] > len(f["payload"]["output"].encode()) for f in elided)
    inputs = [e for e in events if e["event_type"] == "agent_input"]
    assert inputs[0]["payload"]["input_tokens"] == 1515 and inputs[0]["payload"]["cached_tokens"] == 320
    cost = sum(e["payload"]["cost_usd"] for e in events if e["event_type"] == "agent_action")
    assert cost == pytest.approx(raw["info"]["model_stats"]["instance_cost"])
    (evaluation,) = [e for e in events if e["event_type"] == "evaluation"]
    assert evaluation["payload"]["passed"] is True and evaluation["payload"]["fresh_sandbox"] is False
    assert evaluation["payload"]["evaluator"] == "swe-bench"
    assert evaluation["payload"]["provenance"] == "harness_report"  # the SWE-bench report beside the run
    assert evaluation["payload"]["tests_total"] == evaluation["payload"]["tests_passed"] == 22
    end = next(e for e in events if e["event_type"] == "session_end")
    assert end["payload"]["status"] == "completed" and end["payload"]["reward"] is None
    assert end["payload"]["runtime_s"] > 200 and events[-1] is evaluation  # the report's verdict comes after the run
    # session_end names the feedback that holds the submission, byte-identical to the file's
    (submission,) = [e for e in events if e["event_id"] == end["extra"]["submission_event_id"]]
    assert submission["payload"]["output"].encode() == raw["info"]["submission"].encode()
    assert events[0]["extra"]["workspace_root"] == "/testbed"
    assert events[0]["extra"]["task_family"] == "django__django-11099"
    assert events[0]["task_id"] == "django__django-11099" and events[0]["agent_model"] == "deepseek/deepseek-chat"


def test_mini_swe_agent_without_report_is_not_completed(tmp_path: Path) -> None:
    lone = tmp_path / "django__django-11099.traj.json"
    shutil.copy(MINI, lone)
    events = import_trajectory(lone)
    assert "evaluation" not in {e["event_type"] for e in events}
    # it submitted (status completed, like a fleet agent that finished); nobody says whether it was right
    assert events[-1]["payload"]["status"] == "completed" and events[-1]["payload"]["exit_reason"] == "Submitted"
    assert events[-1]["payload"]["reward"] is None


def test_swe_agent_details() -> None:
    v0 = import_trajectory(DATA / "swe-agent" / "v0_gpt4__pydicom__pydicom-1458.traj")
    inputs = [e for e in v0 if e["event_type"] == "agent_input"]
    assert sum(e["payload"]["input_tokens"] for e in inputs) == 122612  # model_stats totals preserved
    assert v0[0]["agent_model"] == "gpt4"  # from the companion args.yaml
    assert "demonstration" not in v0[0]["payload"]["instruction"].lower()[:200]
    writes = [e["payload"]["path"] for e in v0 if e["event_type"] == "file_op"]
    assert "/pydicom__pydicom/pydicom/pixel_data_handlers/numpy_handler.py" in writes
    # three edits failed the syntax check: they changed nothing and give no file_op
    assert writes.count("/pydicom__pydicom/pydicom/pixel_data_handlers/numpy_handler.py") == 1
    v1 = import_trajectory(DATA / "swe-agent" / "v1_function_calling_replace__marshmallow-1867.traj")
    assert v1[0]["task_id"] == "marshmallow-code__marshmallow-1867" and v1[0]["image_version"] == "v1"
    tools = [e["payload"]["tool_name"] for e in v1 if e["event_type"] == "agent_action"]
    assert tools[:3] == ["create", "insert", "bash"]
    assert any(e["payload"]["duration_ms"] > 0 for e in v1 if e["event_type"] == "env_feedback")
    ctf = import_trajectory(DATA / "swe-agent" / "enigma_ctf_crypto_BabyEncryption.traj")
    assert ctf[0]["task_type"] == "ctf" and ctf[-1]["payload"]["status"] == "completed"
    assert v0[0]["extra"]["workspace_root"] == "/pydicom__pydicom" and v1[0]["extra"]["workspace_root"] == "/testbed"


def test_openhands_details() -> None:
    events = import_trajectory(DATA / "openhands" / "basic_gui_mode.json")
    feedback = [e["payload"] for e in events if e["event_type"] == "env_feedback"]
    assert [f["exit_code"] for f in feedback if f["exit_code"] is not None] == [0, -1]
    runs = [e["payload"]["command"] for e in events if e["event_type"] == "agent_action" and e["payload"]["command"]]
    assert runs[0] == "mkdir -p /workspace/todo-app"
    ops = [(e["payload"]["op"], e["payload"]["path"]) for e in events if e["event_type"] == "file_op"]
    assert ops == [("create", "/workspace/todo-app/index.html"), ("create", "/workspace/todo-app/app.js")]
    # the file's own clock (ISO, no zone → UTC), not the synthetic one
    start = datetime(2025, 1, 20, 20, 29, 13, 519638, tzinfo=UTC)
    assert events[0]["ts"] == int(start.timestamp() * 1_000_000)
    assert events[-1]["payload"]["runtime_s"] == pytest.approx(81.910037)


def test_huge_output_travels_whole_in_parts(tmp_path: Path) -> None:
    data = json.loads(MINI.read_text())
    tool = next(m for m in data["messages"] if m["role"] == "tool")
    big = "x\u00e9" * (3 * PART_BYTES)
    tool["content"] = f"<returncode>0</returncode>\n<output>\n{big}</output>"
    tool["extra"]["raw_output"] = big
    path = tmp_path / "big.traj.json"
    path.write_text(json.dumps(data))
    events = import_trajectory(path)
    feedback = next(e for e in events if e["event_type"] == "env_feedback")
    payload = feedback["payload"]
    assert not payload["truncated"] and len(payload["output"].encode()) <= PART_BYTES
    assert payload["output_bytes"] == len(big.encode()) == payload["output_ref"]["size_bytes"]
    parts = [e for e in events if e["event_type"] == "annotation" and e["parent_event_id"] == feedback["event_id"]]
    assert payload["output"] + "".join(p["payload"]["value"] for p in parts) == big
    assert payload["output_ref"]["uri"] == f"parts:{payload['output_ref']['sha256']}"
    for event in events:  # every event, parts included, fits ingest's record limit
        decode_event(encode_event(event), 1 << 20)


@pytest.mark.parametrize("name", [r[0] for r in RUNS])
def test_truncated_file_is_a_format_error(tmp_path: Path, name: str) -> None:
    cut = tmp_path / Path(name).name
    whole = (DATA / name).read_bytes()
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ImportFormatError, match=str(cut.name)) as info:
        import_trajectory(cut)
    assert isinstance(info.value, ProducerError) and "JSON" in info.value.reason


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("", "empty"),
        ("\xff\xfe", "UTF-8"),
        ('{"hello": 1}', "unknown trajectory format"),
        ("[1, 2]", "unknown trajectory format"),
        ('{"trajectory_format": "mini-swe-agent-1.1", "messages": "oops"}', "messages"),
        ('{"trajectory": [], "history": [{"role": "system", "content": "x"}], "info": {}}', "task"),
        ('[{"id": 0, "source": "agent", "action": "run", "args": {}}]', "no user message"),
    ],
)
def test_corrupt_input_names_file_and_reason(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(ImportFormatError, match=reason) as info:
        import_trajectory(path)
    assert str(path) in str(info.value)


def test_wrong_explicit_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="does not fit|without"):
        import_trajectory(DATA / "openhands" / "basic.json", format="mini-swe-agent")
    with pytest.raises(ImportFormatError, match="unknown format"):
        import_trajectory(MINI, format="autogpt")
    with pytest.raises(ImportFormatError, match="cannot read"):
        import_trajectory(tmp_path / "missing.json")


def test_a_corrupt_file_is_quarantined_and_the_others_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    sent: list[dict] = []
    report = import_paths([bad, MINI], sent.append)
    assert [str(q.path) for q in report.quarantined] == [str(bad)] and "not valid JSON" in report.quarantined[0].reason
    assert [s.framework for s in report.summaries] == ["mini-swe-agent"] and len(sent) == report.summaries[0].events
    sent.clear()
    report = import_paths([MINI, DATA / "openhands" / "basic.json"], sent.append)
    assert [s.framework for s in report.summaries] == ["mini-swe-agent", "openhands"]
    assert [s.steps for s in report.summaries] == [42, 2] and sum(s.events for s in report.summaries) == len(sent)


@pytest.mark.slow
@pytest.mark.integration
def test_cli_import_ingest_assemble_mini_swe_agent(kafka_settings) -> None:
    from typer.testing import CliRunner

    from pipelines.assemble import assemble
    from pipelines.ingest import IngestWorker
    from trajlake.cli import app
    from warehouse.query import run_query

    runner = CliRunner()
    for _ in range(2):  # the second import re-sends the same event ids: ingest+assembly keep one copy
        result = runner.invoke(app, ["import", str(MINI)])
        assert result.exit_code == 0, result.output
        assert "42 steps" in result.output
    IngestWorker(kafka_settings).run(until_idle=2)
    assemble(Lakehouse.open(kafka_settings))
    columns, rows = run_query(
        kafka_settings, "SELECT session_id, task_id, completed, n_steps, status FROM trajectories"
    )
    assert len(rows) == 1
    row = dict(zip(columns, rows[0], strict=True))
    assert row["task_id"] == "django__django-11099" and row["completed"] is True
    assert row["n_steps"] == 42 and row["status"] == "completed"
    _, steps = run_query(kafka_settings, "SELECT exit_code FROM steps ORDER BY step_index")
    codes = [r[0] for r in steps]
    assert len(codes) == 42 and codes.count(1) == 6 and sum(c is not None for c in codes) == 41


def test_openhands_evaluation_output_is_one_session_per_line() -> None:
    path = DATA / "openhands" / "eval-output" / "ProntoQA.output.jsonl"
    assert detect_format(path) == "openhands"
    events = import_trajectory(path)
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    sessions: dict[str, list] = {}
    for event in events:
        sessions.setdefault(event["session_id"], []).append(event)
    assert len(sessions) == len(lines) == 6
    for (_, own), line in zip(sessions.items(), lines, strict=True):
        assert [e["seq"] for e in own] == list(range(len(own)))
        assert own[0]["task_id"] == line["id"] and own[0]["payload"]["instruction"] == line["instruction"]
        assert own[0]["extra"]["workspace_root"] == "/workspace"
        code = [e["payload"]["command"] for e in own if e["event_type"] == "agent_action" and e["payload"]["command"]]
        cells = [action["args"]["code"] for action, _ in line["history"] if action.get("action") == "run_ipython"]
        assert code == cells and cells  # the run_ipython cells, verbatim
        (evaluation,) = [e for e in own if e["event_type"] == "evaluation"]
        assert evaluation["payload"]["passed"] is line["test_result"]["result"]
        assert own[-1] is evaluation
    assert len({e["event_id"] for e in events}) == len(events)
    report = import_paths([path], lambda event: None)
    assert [s.session_id for s in report.summaries] == list(sessions)


def test_json_lines_with_a_corrupt_line_imports_the_rest_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "output.jsonl"
    good = (DATA / "openhands" / "eval-output" / "ProntoQA.output.jsonl").read_text().splitlines()[0]
    path.write_text(good[:100] + "\n" + good + "\n")
    report = import_paths([path], lambda event: None)
    assert len(report.summaries) == 1
    (bad,) = report.quarantined
    assert bad.position == "line 1" and "line 1 is not valid JSON" in bad.reason
    path.write_text(good[:100] + "\n")
    with pytest.raises(ImportFormatError, match="not valid JSON"):
        import_trajectory(path)


def test_reasoning_content_is_the_thought(tmp_path: Path) -> None:
    path = DATA / "mini-swe-agent" / "deepseek-reasoner-dev" / "sqlfluff__sqlfluff-2419.traj.json"
    raw = json.loads(path.read_text())
    events = import_trajectory(path)
    thoughts = [e["payload"]["thought"] for e in events if e["event_type"] == "agent_action"]
    expected = [
        m.get("reasoning_content") or m["content"] or None
        for m in raw["messages"]
        if m["role"] == "assistant"
        for _ in m.get("tool_calls") or [None]
    ]
    assert thoughts == expected and sum(map(bool, thoughts)) > 50


def test_openhands_swe_bench_output_keeps_the_git_patch_verbatim(tmp_path: Path) -> None:
    line = json.loads((DATA / "openhands" / "eval-output" / "ProntoQA.output.jsonl").read_text().splitlines()[0])
    patch = "diff --git a/m.py b/m.py\nindex 1..2 100644\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2  # ünï\n"
    line.update(instance_id="astropy__astropy-12907", test_result={"git_patch": patch})
    path = tmp_path / "output.jsonl"
    path.write_text(json.dumps(line) + "\n")
    events = import_trajectory(path)
    end = next(e for e in events if e["event_type"] == "session_end")
    (feedback,) = [e for e in events if e["event_id"] == end["extra"]["submission_event_id"]]
    assert feedback["payload"]["output"].encode() == patch.encode()
    finish = next(e for e in events if e["event_type"] == "agent_action" and e["payload"]["tool_name"] == "finish")
    assert feedback["parent_event_id"] == finish["event_id"]
    assert "evaluation" not in {e["event_type"] for e in events}  # a patch alone says nothing about success
    assert events[0]["task_id"] == "astropy__astropy-12907"


def _model_calls(events: list) -> list:
    from producers.fleet.llm.record import reconstruct

    return reconstruct(
        [
            e["payload"]["model_call"]
            for e in events
            if e["event_type"] == "agent_input" and e["payload"].get("model_call")
        ]
    )


def test_mini_swe_agent_turns_record_the_exact_requests_and_replies() -> None:
    path = DATA / "mini-swe-agent" / "deepseek-reasoner-dev" / "sqlfluff__sqlfluff-1517.traj.json"
    source = json.loads(path.read_text())["messages"]
    rebuilt = _model_calls(import_trajectory(path))
    turns = [i for i, m in enumerate(source) if m["role"] == "assistant"]
    assert len(rebuilt) == len(turns)
    for call, index in zip(rebuilt, turns, strict=True):
        request = call.messages
        assert [m["role"] for m in request] == [m["role"] for m in source[:index]]
        assert [m.get("content") for m in request] == [m.get("content") for m in source[:index]]
    last = rebuilt[-1].messages
    assert last[0]["role"] == "system" and last[0]["content"] == source[0]["content"]
    replies = [m for m in last if m["role"] == "assistant"]
    assert replies[0]["reasoning_content"] == source[turns[0]]["reasoning_content"]
    ids = [c["id"] for m in replies for c in m.get("tool_calls") or []]
    assert ids == [c["id"] for i in turns[:-1] for c in source[i].get("tool_calls") or []]


def test_swe_agent_requests_include_the_demonstrations_the_model_saw() -> None:
    path = next(p for p in (DATA / "swe-agent").glob("*.traj") if "v0_gpt4__pydicom" in p.name)
    history = json.loads(path.read_text())["history"]
    rebuilt = _model_calls(import_trajectory(path))
    assert rebuilt and [m.get("content") for m in rebuilt[0].messages] == [
        h.get("content") for h in history[: len(rebuilt[0].messages)]
    ]
    assert any(h.get("is_demo") for h in history) == (len(rebuilt[0].messages) > 2)


def _atif(**overrides) -> dict:
    doc = {
        "schema_version": "ATIF-v1.4",
        "session_id": "atif-session-1",
        "agent": {"name": "harbor-agent", "version": "0.3", "model_name": "m-1"},
        "steps": [
            {"step_id": 1, "source": "system", "message": "You are careful."},
            {"step_id": 2, "source": "user", "message": "Fix the bug."},
            {
                "step_id": 3,
                "timestamp": "2025-10-16T14:30:00Z",
                "source": "agent",
                "message": "Looking.",
                "reasoning_content": "First, list files.",
                "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"command": "ls"}}],
                "observation": {"results": [{"source_call_id": "c1", "content": "a.py"}]},
                "metrics": {
                    "prompt_tokens": 3,
                    "completion_tokens": 2,
                    "prompt_token_ids": [1, 2, 3],
                    "completion_token_ids": [7, 8],
                    "logprobs": [-0.5, -0.25],
                },
            },
            {"step_id": 4, "timestamp": "2025-10-16T14:30:05Z", "source": "agent", "message": "Done."},
        ],
    }
    doc.update(overrides)
    return doc


def test_atif_import_keeps_its_own_id_aside_calls_token_ids_and_observations(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_atif()))
    assert detect_format(path) == "atif"
    events = import_trajectory(path)
    # the file's own id is kept, but never becomes the session id: a file cannot claim another producer's session
    assert len({e["session_id"] for e in events}) == 1 and events[0]["session_id"] != "atif-session-1"
    assert {e["extra"]["source_session_id"] for e in events} == {"atif-session-1"}
    for event in events:
        assert decode_event(encode_event(event))["event_id"] == event["event_id"]
    rebuilt = _model_calls(events)
    assert [m["role"] for m in rebuilt[-1].messages] == ["system", "user", "assistant", "tool"]
    assert rebuilt[0].prompt_token_ids == [1, 2, 3] and rebuilt[0].completion_token_ids == [7, 8]
    assert rebuilt[0].completion_logprobs == [-0.5, -0.25]
    assert rebuilt[-1].messages[2]["reasoning_content"] == "First, list files."
    (action,) = [e for e in events if e["event_type"] == "agent_action"]
    assert action["payload"]["tool_call_id"] == "c1" and action["payload"]["tool_name"] == "bash"
    (feedback,) = [e for e in events if e["event_type"] == "env_feedback"]
    assert feedback["payload"]["output"] == "a.py"


@pytest.mark.parametrize(
    ("overrides", "words"),
    [({"steps": "nope"}, "steps"), ({"steps": []}, "user step")],
)
def test_atif_import_of_a_bad_trajectory_names_the_problem(tmp_path: Path, overrides: dict, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_atif(**overrides)))
    with pytest.raises(ImportFormatError, match=words):
        import_trajectory(path, "atif")
