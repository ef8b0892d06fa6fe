"""verl and SkyRL records from LLM sessions (scripted server on loopback, a test double at the network boundary):
the trainers' own record classes are constructed from the exported lines where their packages are installed
(scripts/trainers.sh), and the published field lists are checked everywhere; a session whose model calls all
failed is never an RL episode."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set, read_export
from pipelines.score import score_all
from producers.fleet import ListSink, run_fleet
from producers.fleet.agent_caps import Caps
from producers.fleet.llm import LLMConfig
from producers.fleet.llm.testing import FakeOpenAIServer, solver_script
from producers.fleet.sandbox import bwrap_available
from producers.fleet.tasks import task_for
from tests.helpers import write_raw
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

# slow as a whole: the module's fixtures run real sandbox sessions once, and whichever test comes first pays for them
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable"),
]

#: verl 0.9.1 ``AgentLoopOutput`` (required: prompt_ids, response_ids, response_mask, metrics) and SkyRL 0.3.1
#: ``TrajectoryOutput`` (a dataclass: every field required, no other accepted), as published.
VERL_FIELDS = {
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "reward_score",
    "num_turns",
    "metrics",
    "extra_fields",
}
SKYRL_FIELDS = {"prompt_ids", "response_ids", "loss_mask", "rollout_logprobs", "reward", "stop_reason", "env_metrics"}
TRAINERS = Path(os.environ.get("TRAJLAKE_TRAINERS_VENV", Path.home() / ".cache" / "trajlake" / "trainers-venv"))


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, dict[str, list[dict]]]:
    """Four tasks (distinct: not duplicates of each other): token in/token out, chat against a drifting
    template, every call failing, and token in/token out whose tokenize call fails."""
    settings = load_settings(
        home=tmp_path_factory.mktemp("trainers") / "home", topic="unused", kafka_bootstrap=None, catalog_uri=None
    )
    seeds = {"tito": 3, "chat": 4, "failed": 5, "failed_tito": 6, "capped": 7}
    tasks = [task_for(seed, 0) for seed in seeds.values()]
    events: list[dict] = []
    answers: dict[str, list[dict]] = {}
    for name, config in (
        ("tito", {"token_mode": "tito", "engine": "vllm"}),
        ("chat", {}),
        ("failed", {"max_retries": 1}),
        # token in/token out whose first tokenize call fails: no model call is ever made
        ("failed_tito", {"max_retries": 1, "token_mode": "tito", "engine": "vllm"}),
        ("capped", {}),  # stopped by max_model_calls before it could submit
    ):
        with FakeOpenAIServer(solver_script(tasks), drift=True) as server:
            if name.startswith("failed"):
                server.fail_next = [500] * 2
            sink = ListSink(decode=False)
            llm = LLMConfig(server.url, "policy-7b", backoff_s=0.01, **config)
            caps = Caps(max_model_calls=2) if name == "capped" else Caps()
            run_fleet(settings, "local", sessions=1, seed=seeds[name], sink=sink, agent="llm", llm=llm, caps=caps)
            answers[name] = [json.loads(body) for body in server.responses]
        answers[f"{name}_session"] = [{"session_id": sink.events[0]["session_id"]}]
        events += sink.events
    write_raw(settings, events)
    assemble(settings)
    score_all(settings)
    return settings, answers


def _export(settings: Settings, fmt: str, out: Path) -> list[dict]:
    stats = export_training_set(settings, fmt, out, min_quality=0.0, filters=ALL_ORIGINS)
    records = read_export(out)
    assert stats.records == len(records)
    return records


def _session(answers: dict, name: str) -> str:
    return answers[f"{name}_session"][0]["session_id"]


def _by_session(records: list[dict], key: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for record in records:
        out.setdefault(record[key]["session_id"], []).append(record)
    return out


@pytest.mark.slow
def test_verl_records_are_agent_loop_outputs(lake, tmp_path):
    settings, answers = lake
    by_session = _by_session(_export(settings, "verl", tmp_path / "verl"), "extra_fields")
    assert _session(answers, "failed") not in by_session  # no successful call: no RL episode
    (tito,) = by_session[_session(answers, "tito")]  # one exact sequence: one record
    assert set(tito) == VERL_FIELDS
    n = len(tito["response_ids"])
    assert len(tito["response_mask"]) == len(tito["response_logprobs"]) == n and 0 in tito["response_mask"]
    sampled = [t for t, m in zip(tito["response_ids"], tito["response_mask"], strict=True) if m]
    assert sampled == [t for a in answers["tito"] for t in a["choices"][0]["token_ids"]]
    assert tito["prompt_ids"] == answers["tito"][0]["choices"][0]["prompt_token_ids"]
    # verl's num_turns: the prompt's user turn + 6 assistant turns + 5 turns of tool results
    assert tito["num_turns"] == 12 and tito["extra_fields"]["segment"] is None
    assert tito["reward_score"] == 1.0 and tito["metrics"]["generate_sequences"] > 0
    chat = by_session[_session(answers, "chat")]  # the template rewrote history: one record per call, as sent
    assert [r["extra_fields"]["segment"] for r in chat] == list(range(6))
    for record, answer in zip(chat, answers["chat"], strict=True):
        assert record["prompt_ids"] == answer["prompt_token_ids"]
        assert record["response_ids"] == answer["choices"][0]["token_ids"]
        assert set(record["response_mask"]) == {1}


@pytest.mark.slow
def test_skyrl_records_are_trajectory_outputs_with_the_engines_stop_reason(lake, tmp_path):
    settings, answers = lake
    by_session = _by_session(_export(settings, "skyrl", tmp_path / "skyrl"), "env_metrics")
    assert _session(answers, "failed") not in by_session
    (tito,) = by_session[_session(answers, "tito")]
    assert set(tito) == SKYRL_FIELDS and tito["stop_reason"] == "stop"  # never "terminal"
    assert len(tito["loss_mask"]) == len(tito["response_ids"]) == len(tito["rollout_logprobs"])
    assert tito["env_metrics"]["trajlake_stop_reason"] == "terminal" and tito["reward"] == 1.0
    assert {r["stop_reason"] for r in by_session[_session(answers, "chat")]} == {"stop"}


def test_a_session_whose_calls_all_failed_is_never_an_rl_episode(lake, tmp_path):
    settings, answers = lake
    failed = {_session(answers, "failed"), _session(answers, "failed_tito")}
    records = _export(settings, "rl", tmp_path / "rl")
    sessions = {r["session_id"] for r in records}  # rl: one record per segment, here one per chat-mode call
    capped = _session(answers, "capped")
    assert not failed & sessions and {_session(answers, "tito"), _session(answers, "chat")} <= sessions
    assert len([r for r in records if r["session_id"] != capped]) == 1 + len(answers["chat"])
    # by default it is left out as an infrastructure failure (the model API failed); asked for every
    # session, it is still no episode: nothing was sampled
    outcomes = json.loads((tmp_path / "rl" / "manifest.json").read_text())["counts"]["left_out"]["outcome"]
    assert outcomes == {"infrastructure": 2}
    export_training_set(
        settings, "rl", tmp_path / "all", filters=ExportFilters(origins=(), min_quality=0.0, outcome="all")
    )
    _, rows = run_query(settings, "SELECT session_id, reason FROM quarantine WHERE stage = 'export'")
    assert {(sid, reason) for sid, reason in rows if sid in failed} == {(sid, "no_model_call") for sid in failed}
    # the SFT formats are not RL episodes, but nothing sampled is no SFT record either, in either token mode
    for fmt in ("openai", "sharegpt"):
        out = tmp_path / f"{fmt}-all"
        export_training_set(settings, fmt, out, filters=ExportFilters(origins=(), min_quality=0.0, outcome="all"))
        text = "\n".join(json.dumps(r) for r in read_export(out))
        assert text.strip() and not any(sid in text for sid in failed), fmt


def test_a_session_stopped_by_max_model_calls_is_a_truncated_episode(lake, tmp_path):
    settings, answers = lake
    capped = _session(answers, "capped")
    _, rows = run_query(settings, f"SELECT status, exit_reason FROM trajectories WHERE session_id = '{capped}'")
    assert rows == [("capped", "max_model_calls")]
    filters = ExportFilters(origins=(), min_quality=0.0, outcome="all")
    export_training_set(settings, "rl", tmp_path / "rl", filters=filters)
    rl = read_export(tmp_path / "rl")
    ends = [r["stop_reason"] for r in rl if r["session_id"] == capped and r["is_last_segment"]]
    assert ends == ["truncated:max_model_calls"]
    export_training_set(settings, "skyrl", tmp_path / "skyrl", filters=filters)
    skyrl = read_export(tmp_path / "skyrl")
    mine = [r for r in skyrl if r["env_metrics"]["session_id"] == capped]
    assert mine and mine[-1]["stop_reason"] == "length"  # SkyRL's truncated, never "stop"
    assert mine[-1]["env_metrics"]["trajlake_stop_reason"] == "truncated:max_model_calls"


def test_a_failed_tokenize_call_leaves_a_failed_model_call_event(lake):
    settings, answers = lake
    sid = _session(answers, "failed_tito")
    _, rows = run_query(
        settings,
        "SELECT agent_input.model_call.status, agent_input.model_call.error, "
        "agent_input.model_call.token_mode, agent_input.model_call.try_index "
        f"FROM events WHERE session_id = '{sid}' AND event_type = 'agent_input' ORDER BY seq",
    )
    assert [(r[0], r[2], r[3]) for r in rows] == [("error", "tito", 0), ("error", "tito", 1)]
    assert all(r[1].startswith("tokenize: ") and "500" in r[1] for r in rows)


def test_the_trainers_own_classes_load_the_exported_records(lake, tmp_path):
    python = TRAINERS / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no trainers venv at {TRAINERS} (scripts/trainers.sh): checked against the field lists only")
    settings, _ = lake
    verl = tmp_path / "verl"
    skyrl = tmp_path / "skyrl"
    n_verl = len(_export(settings, "verl", verl))
    n_skyrl = len(_export(settings, "skyrl", skyrl))
    script = (
        "import json, sys\n"
        "from verl.experimental.agent_loop.agent_loop import AgentLoopOutput\n"
        "from skyrl_train.generators.skyrl_gym_generator import TrajectoryOutput\n"
        "v = [AgentLoopOutput(**json.loads(l)) for l in open(sys.argv[1])]\n"
        "s = [TrajectoryOutput(**json.loads(l)) for l in open(sys.argv[2])]\n"
        "assert all(len(o.response_mask) == len(o.response_ids) for o in v)\n"
        "assert all(len(o.loss_mask) == len(o.response_ids) for o in s)\n"
        "print(len(v), len(s), type(v[0].metrics).__name__)\n"
    )
    for out in (verl, skyrl):  # every split's file, as one file
        (out / "all.jsonl").write_text("".join(p.read_text() for p in sorted((out / "data").glob("*.jsonl"))))
    result = subprocess.run(
        [python, "-c", script, verl / "all.jsonl", skyrl / "all.jsonl"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(n_verl), str(n_skyrl), "AgentLoopMetrics"]
