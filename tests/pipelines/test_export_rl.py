"""Exact prompts of imported real runs, token-level rl records, filters and splits."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import RL_SCHEMA, ExportFilters, export_training_set, read_export
from pipelines.score import score_all
from producers.fleet import ListSink, run_fleet
from producers.importers import import_trajectory
from tests.helpers import real_runs_dir, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

REAL = real_runs_dir()
DEEPSEEK = REAL / "mini-swe-agent/deepseek-reasoner-dev/marshmallow-code__marshmallow-1359.traj.json"
DJANGO = REAL / "mini-swe-agent/django__django-11099.traj.json"
OPENHANDS = REAL / "openhands/basic_interactions.json"


#: every ended session, whatever its outcome and quality (the tests here look at records, not selection)
EVERY = ExportFilters(origins=(), min_quality=0.0, outcome="all")


def _lake(tmp: Path) -> Settings:
    return load_settings(home=tmp / "home", topic="unused", kafka_bootstrap=None, catalog_uri=None)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    if not all(p.is_file() for p in (DEEPSEEK, DJANGO, OPENHANDS)):
        pytest.skip(f"the recorded real runs (../shared) are absent at {REAL}")
    settings = _lake(tmp_path_factory.mktemp("rl"))
    events: list[dict] = []
    for path in (DEEPSEEK, DJANGO, OPENHANDS):
        events += import_trajectory(path)
    fleet: list[dict] = []
    run_fleet(settings, backend="synthetic", sessions=40, seed=11, sink=fleet.append)
    # rollout groups of 2 attempts over the synthetic sessions; the last group loses an attempt's end
    sessions = sorted({e["session_id"] for e in fleet})
    for e in fleet:
        index = sessions.index(e["session_id"])
        e["group_id"], e["attempt"] = f"g{index // 2}", index % 2
    incomplete = sessions[-1]
    fleet = [e for e in fleet if not (e["session_id"] == incomplete and e["event_type"] == "session_end")]
    write_raw(settings, events + fleet, batch_size=5000)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    return settings


@pytest.mark.slow
def test_real_run_keeps_system_prompt_reasoning_submission_and_call_ids(lake: Settings, tmp_path: Path) -> None:
    source = json.loads(DJANGO.read_text())
    export_training_set(Lakehouse.open(lake), "hf", tmp_path / "hf", filters=EVERY)
    by_task = {r["task_id"]: r for r in read_export(tmp_path / "hf")}
    record = by_task["django__django-11099"]
    assert record["prompt_source"] == "recorded"
    messages = record["messages"]
    assert messages[0] == {**messages[0], "role": "system", "content": source["messages"][0]["content"]}
    assert record["submission"] == source["info"]["submission"]  # the patch, unchanged, as its own field
    original_ids = [c["id"] for m in source["messages"] if m.get("tool_calls") for c in m["tool_calls"]]
    exported_ids = [c["id"] for m in messages if m["tool_calls"] for c in m["tool_calls"]]
    assert exported_ids == original_ids
    # the agent's last turn ends the conversation: its reply, then only the results of its own calls
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    answered = {c["id"] for c in messages[last]["tool_calls"] or []}
    assert all(m["role"] == "tool" and m["tool_call_id"] in answered for m in messages[last + 1 :])
    # every request message the model saw, in order (the run's own messages, bookkeeping dropped)
    seen = [m for m in source["messages"] if m["role"] in ("system", "user", "assistant", "tool")]
    assert [m["content"] for m in messages[: len(seen)]] == [m["content"] for m in seen]
    reasoning = json.loads(DEEPSEEK.read_text())
    first = next(m for m in reasoning["messages"] if m.get("role") == "assistant")
    deep = by_task[reasoning["instance_id"]]
    exported = next(m for m in deep["messages"] if m["role"] == "assistant")
    assert exported["reasoning_content"] == first["reasoning_content"]


def test_openhands_agent_reply_is_an_assistant_message_not_a_tool_call(lake: Settings, tmp_path: Path) -> None:
    source = json.loads(OPENHANDS.read_text())
    replies = [e["args"]["content"] for e in source if e.get("source") == "agent" and e.get("action") == "message"]
    export_training_set(Lakehouse.open(lake), "openai", tmp_path / "oh", filters=EVERY)
    records = read_export(tmp_path / "oh")
    (record,) = [r for r in records if any(m.get("content") == replies[0] for m in r["messages"])]
    names = [c["function"]["name"] for m in record["messages"] for c in m.get("tool_calls") or []]
    assert "message" not in names
    assistant = [m["content"] for m in record["messages"] if m["role"] == "assistant" and not m.get("tool_calls")]
    assert assistant == replies and record["prompt_source"] == "reconstructed"


def test_sft_defaults_to_successes_and_the_manifest_counts_what_each_rule_left_out(
    lake: Settings, tmp_path: Path
) -> None:
    wide = export_training_set(
        Lakehouse.open(lake), "hf", tmp_path / "wide", filters=ExportFilters(origins=(), min_quality=0.0, outcome="any")
    )
    default = export_training_set(Lakehouse.open(lake), "hf", tmp_path / "default", filters=ALL_ORIGINS)
    assert wide.records > default.records > 0
    assert {r["outcome"] for r in read_export(tmp_path / "default")} == {"success"}
    assert {r["outcome"] for r in read_export(tmp_path / "wide")} == {"success", "failure"}
    manifest = json.loads((tmp_path / "default" / "manifest.json").read_text())
    assert manifest["filters"]["outcome"] == "success" and manifest["filters"]["min_quality"] == lake.quality_min
    counts = manifest["counts"]
    # every session considered is exported or left out by exactly one rule
    left = counts["left_out"]
    left_out = sum(sum(v.values()) if isinstance(v, dict) else v for v in left.values())
    assert counts["considered"] == counts["sessions"] + left_out
    assert left["origin"] == {}  # origins=(): every origin asked for
    per_origin = counts["per_origin"]
    assert sum(per_origin.values()) == counts["sessions"] and per_origin["synthetic"] > 0
    assert set(per_origin) - {"synthetic"} and all(o.startswith("import:") for o in set(per_origin) - {"synthetic"})
    assert left["outcome"]["failure"] > 0 and "success" not in left["outcome"]
    assert sum(counts["per_split"].values()) == default.records
    assert manifest["scoring"]["governance"] and manifest["scorer_version"]
    # by default the synthetic fleet's sessions are left out, under their own reason, and the rest kept
    plain = export_training_set(Lakehouse.open(lake), "hf", tmp_path / "plain")
    counted = json.loads((tmp_path / "plain" / "manifest.json").read_text())["counts"]
    assert counted["left_out"]["origin"] == {"synthetic": counted["considered_by_origin"]["synthetic"]}
    assert {r["origin"] for r in read_export(tmp_path / "plain")} == set(per_origin) - {"synthetic"} and plain.records
    for record in read_export(tmp_path / "wide"):
        assert record["quality"] >= 0.0 and 0.0 <= record["weight"] <= 1.0
        for flag in record["flags"]:
            assert set(flag) == {"flag", "flag_class", "severity", "weight"}


@pytest.mark.slow
def test_splits_never_share_a_task_family_and_group_complete_drops_incomplete_groups(
    lake: Settings, tmp_path: Path
) -> None:
    families: dict[str, set[str]] = {}
    for split in ("train", "validation", "test"):
        out = tmp_path / split
        export_training_set(
            Lakehouse.open(lake), "rl", out, filters=ExportFilters(origins=(), min_quality=0.0, split=split)
        )
        for record in read_export(out):
            assert record["split"] == split
            families.setdefault(record["task_family"], set()).add(split)
    assert families and all(len(splits) == 1 for splits in families.values())
    export_training_set(
        Lakehouse.open(lake), "rl", tmp_path / "all", filters=ExportFilters(origins=(), min_quality=0.0)
    )
    export_training_set(
        Lakehouse.open(lake),
        "rl",
        tmp_path / "groups",
        filters=ExportFilters(origins=(), min_quality=0.0, group_complete=True),
    )
    whole = read_export(tmp_path / "groups")
    everything = read_export(tmp_path / "all")
    assert whole and len(whole) < len(everything)
    counts: dict[str, int] = {}
    for record in whole:
        counts[record["group_id"]] = counts.get(record["group_id"], 0) + 1
    assert set(counts.values()) == {2}  # every exported group has both attempts
    assert "g19" not in counts  # the group whose second attempt never ended


@pytest.mark.slow
def test_rl_parquet_has_verl_and_skyrl_names_and_dtypes_and_loads_with_datasets(lake: Settings, tmp_path: Path) -> None:
    import pyarrow as pa
    from datasets import load_dataset

    export_training_set(Lakehouse.open(lake), "rl", tmp_path / "pq", min_quality=0.0, parquet=True, filters=ALL_ORIGINS)
    table = pa.concat_tables([pq.read_table(p) for p in sorted((tmp_path / "pq" / "data").glob("*.parquet"))])
    # verl AgentLoopOutput: prompt_ids/response_ids/response_mask list[int], num_turns int;
    # SkyRL TrajectoryOutput: prompt_ids/response_ids/loss_mask list[int], reward float, stop_reason str
    expected = {
        "prompt_ids": pa.list_(pa.int64()),
        "response_ids": pa.list_(pa.int64()),
        "response_mask": pa.list_(pa.int64()),
        "loss_mask": pa.list_(pa.int64()),
        "logprobs": pa.list_(pa.float64()),
        "reward": pa.float64(),
        "step_rewards": pa.list_(pa.float64()),
        "num_turns": pa.int64(),
        "stop_reason": pa.string(),
        "has_token_ids": pa.bool_(),
        "group_id": pa.string(),
        "attempt": pa.int64(),
        "policy_version": pa.string(),
        "task_family": pa.string(),
        "split": pa.string(),
        "session_id": pa.string(),
    }
    assert {name: table.schema.field(name).type for name in expected} == expected
    assert table.schema == RL_SCHEMA and table.num_rows > 0
    # the directory alone, Parquet or JSON lines: its card names the split files
    dataset = load_dataset(str(tmp_path / "pq"))
    assert sum(len(d) for d in dataset.values()) == table.num_rows
    assert all(set(d["split"]) == {name} for name, d in dataset.items())
    export_training_set(Lakehouse.open(lake), "rl", tmp_path / "js", min_quality=0.0, filters=ALL_ORIGINS)
    as_json = load_dataset(str(tmp_path / "js"))
    assert sum(len(d) for d in as_json.values()) == table.num_rows
    assert all(isinstance(r["tools"], list) for d in as_json.values() for r in d)  # tools as a list, as written
    assert read_export(tmp_path / "js")[0]["tools"] == json.loads(table.column("tools")[0].as_py())
    export_training_set(Lakehouse.open(lake), "atif", tmp_path / "atif", min_quality=0.0, filters=ALL_ORIGINS)
    assert sum(len(d) for d in load_dataset(str(tmp_path / "atif")).values()) > 0


@pytest.mark.slow
def test_llm_session_exports_the_server_token_ids_and_logprobs(tmp_path: Path) -> None:
    from producers.fleet.llm import LLMConfig
    from producers.fleet.llm.testing import FakeOpenAIServer, solver_script
    from producers.fleet.sandbox import bwrap_available
    from producers.fleet.tasks import task_for

    if not bwrap_available():
        pytest.skip("bubblewrap unusable")
    settings = _lake(tmp_path)
    tasks = [task_for(3, 0)]
    with FakeOpenAIServer(solver_script(tasks)) as server:
        sink = ListSink(decode=False)
        run_fleet(settings, "local", sessions=1, seed=3, sink=sink, agent="llm", llm=LLMConfig(server.url, "policy-7b"))
    write_raw(settings, sink.events)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    export_training_set(Lakehouse.open(settings), "rl", tmp_path / "rl", min_quality=0.0, filters=ALL_ORIGINS)
    (record,) = read_export(tmp_path / "rl")
    responses = [json.loads(raw) for raw in server.responses]
    assert record["has_token_ids"] and record["prompt_source"] == "recorded"
    assert json.dumps(record["prompt_ids"]) == json.dumps(responses[0]["prompt_token_ids"])
    sampled = [i for i, m in zip(record["response_ids"], record["response_mask"], strict=True) if m == 1]
    server_ids = [t for r in responses for t in r["choices"][0]["token_ids"]]
    assert json.dumps(sampled) == json.dumps(server_ids)  # exactly the sampled tokens under mask 1
    sampled_lp = [lp for lp, m in zip(record["logprobs"], record["response_mask"], strict=True) if m == 1]
    server_lp = [e["logprob"] for r in responses for e in r["choices"][0]["logprobs"]["content"]]
    assert json.dumps(sampled_lp) == json.dumps(server_lp)
    # the tokens between completions are the next prompt's suffix: mask 0
    full = record["prompt_ids"] + record["response_ids"]
    assert json.dumps(full[: len(responses[-1]["prompt_token_ids"])]) == json.dumps(responses[-1]["prompt_token_ids"])
    assert record["num_turns"] == len(responses) and record["stop_reason"] == "terminal"


@pytest.mark.slow
def test_chunked_stream_gives_every_session_its_own_steps_and_calls_once(lake: Settings) -> None:
    from pipelines.export.select import _sessions

    opened = Lakehouse.open(lake)

    def stream(chunk: int) -> list[tuple[str, int, int]]:
        rows = _sessions(opened, ExportFilters(origins=(), min_quality=0.0), {}, batch_rows=7, chunk_sessions=chunk)
        return [(s["session_id"], len(steps), len(calls)) for s, steps, calls, _ in rows]

    whole, chunked = stream(100_000), stream(3)
    assert chunked == whole and len(whole) > 6
    assert [s for s, _, _ in whole] == sorted({s for s, _, _ in whole})
    _, rows = run_query(lake, "SELECT session_id, count(*) FROM steps GROUP BY session_id")
    counts = dict(rows)
    assert all(n == counts.get(s, 0) for s, n, _ in whole)
    assert any(c > 0 for _, _, c in whole)  # the imported runs' model calls


@pytest.mark.slow
def test_cli_export_filters_and_a_bad_split_is_one_line(lake: Settings, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
        env["TRAJLAKE_HOME"] = str(lake.home_dir)
        return subprocess.run(
            [sys.executable, "-m", "trajlake.cli", *args], env=env, capture_output=True, text=True, timeout=300
        )

    bad = cli("export", "--format", "rl", "--origin", "all", "--out", str(tmp_path / "bad"), "--split", "holdout")
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "holdout" in bad.stderr
    ok = cli(
        "export", "--format", "atif", "--origin", "all", "--out", str(tmp_path / "ok"), "--min-quality", "0",
        "--task-family", "django__django-11099", "--since", "2000-01-01",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    (record,) = read_export(tmp_path / "ok")
    assert record["extra"]["task_family"] == "django__django-11099"
    manifest = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert manifest["filters"]["task_family"] == "django__django-11099" and manifest["filters"]["since"]


def test_rl_reward_is_the_scored_completion_and_an_unevaluated_run_has_none() -> None:
    from pipelines.errors import RecordError
    from pipelines.export.conversation import Conversation
    from pipelines.export.formats import episode_reward
    from pipelines.export.rl import rl_records

    # a forged verdict: the evaluator said 1.0, a flag voided it (completion 0): the trainer gets 0
    assert episode_reward({"reward": 1.0, "eval_passed": True, "completion": 0.0, "failure_cause": "cheating"}) == 0.0
    assert episode_reward({"reward": 0.75, "eval_passed": True, "completion": 0.75, "failure_cause": "success"}) == 0.75
    unevaluated = {"reward": None, "eval_passed": None, "completion": 0.0, "failure_cause": "unevaluated"}
    assert episode_reward(unevaluated) is None
    with pytest.raises(RecordError) as caught:
        rl_records(
            {**unevaluated, "session_id": "s"}, Conversation(messages=[], tools=[], prompt_source="reconstructed")
        )
    assert caught.value.reason == "no_reward"


def _token_session(reply: str) -> tuple[dict, object]:
    from pipelines.export.conversation import Call, Conversation

    call = Call(0, "m", "stop", 2, 3, 0, None, None, [1, 2], [3, 4, 5], [-0.1, -0.2, -0.3])
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": reply}]
    session = {"session_id": "s", "task_id": "t", "task_type": "x", "task_family": "f", "reward": 1.0}
    session |= {"completion": 1.0, "flag_list": [], "origin": "sdk", "quality": 1.0, "split": "train", "weight": 1.0}
    return session, Conversation(messages, [], "recorded", [call])


@pytest.mark.parametrize("fmt", ["rl", "verl", "skyrl"])
def test_a_reply_redacted_at_export_takes_its_token_ids_with_it(fmt: str) -> None:
    """The probe: a host that did not redact a reply and sent no token strings (nothing for the gate to check):
    export redacted the message and kept ``response_ids`` that spell the secret, as if nothing happened."""
    from common.prices import PriceTable
    from pipelines.errors import RecordError
    from pipelines.export.records import to_records
    from pipelines.export.run import redacted_records
    from pipelines.export.trainers import trainer_records

    prices = PriceTable.load("")
    build = (lambda s, c: to_records(fmt, s, c, prices)) if fmt == "rl" else (lambda s, c: trainer_records(fmt, s, c))
    session, clean = _token_session("the tests pass")
    assert redacted_records(fmt, session, clean, build(session, clean), prices) == build(session, clean)
    session, leaking = _token_session("push with gh" + "p_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5")
    if fmt != "rl":
        with pytest.raises(RecordError, match="token ids"):
            redacted_records(fmt, session, leaking, build(session, leaking), prices)
        return
    (record,) = redacted_records(fmt, session, leaking, build(session, leaking), prices)
    assert record["has_token_ids"] is False and record["response_ids"] == [] and record["prompt_ids"] == []
    assert "aB3dE5fG7h" not in json.dumps(record) and "[REDACTED]" in json.dumps(record["messages"])
