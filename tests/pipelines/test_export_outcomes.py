"""Training sets a trainer can use as they are, on a local fleet of succeeding, failing, crashing, capped and cheating
agents, a reasoning LLM agent whose server's chat template strips earlier reasoning, and imported real runs:
outcome-aware selection, token-exact segments, token and cost totals that agree everywhere, ATIF round trips."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from common.prices import PriceTable
from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set, read_export
from pipelines.score import score_all
from producers.fleet import ListSink, run_fleet
from producers.fleet.agent_caps import Caps
from producers.fleet.llm import LLMConfig
from producers.fleet.llm.testing import FakeOpenAIServer, loop_script, solver_script
from producers.fleet.llm.testing_reasoning import ReasoningServer
from producers.fleet.sandbox import bwrap_available
from producers.fleet.tasks import task_for
from producers.importers import import_trajectory
from tests.helpers import real_runs_dir, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

# slow as a whole: the module's fixtures run real sandbox sessions once, and whichever test comes first pays for them
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable"),
]

REAL = real_runs_dir()
DJANGO = REAL / "mini-swe-agent/django__django-11099.traj.json"
PRICES = {"policy-7b": {"input": 3.0, "cached": 0.3, "output": 15.0}}
#: the reasoning model thinks on these turns (0-based): the prompt after each does not extend the last one
REASONING_TURNS = (0, 2, 3)
REPORTED_COST = 0.000125  # what the capped agent's server reports per call


def _lake(home: Path, prices: dict | None = None) -> Settings:
    table = json.dumps(prices if prices is not None else PRICES)
    return load_settings(home=home, topic="unused", kafka_bootstrap=None, catalog_uri=None, price_table=table)


def _lines(out: Path) -> dict[str, str]:
    """Session id → the exact line of its trajectory, over every split file of an export."""
    return {
        json.loads(line)["session_id"]: line
        for path in sorted((out / "data").iterdir())
        for line in path.read_text().splitlines()
    }


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _fleet(settings: Settings, events: list[dict], agent: str, seed: int, **kwargs: Any) -> set[str]:
    sink = ListSink(decode=False)
    run_fleet(settings, "local", sessions=1, seed=seed, sink=sink, agent=agent, **kwargs)
    events += sink.events
    return {e["session_id"] for e in sink.events}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, dict[str, set[str]], list[bytes]]:
    if not DJANGO.is_file():
        pytest.skip(f"the recorded real run (../shared) is absent at {DJANGO}")
    home = tmp_path_factory.mktemp("outcomes")
    settings = _lake(home / "lake")
    events: list[dict] = []
    kinds: dict[str, set[str]] = {}
    kinds["solver"] = _fleet(settings, events, "solver", seed=21)
    kinds["flailer"] = _fleet(settings, events, "flailer", seed=22)  # gives up
    kinds["cheater"] = _fleet(settings, events, "cheat_forged_verdict", seed=23)
    kinds["hang"] = _fleet(settings, events, "hang", seed=24, timeout_s=3.0)
    agent_file = home / "broken_agent.py"
    agent_file.write_text("def agent(session):\n    session.run('ls')\n    raise RuntimeError('a bug')\n")
    kinds["crash"] = _fleet(settings, events, f"{agent_file}:agent", seed=25)
    prices = PriceTable.parse(PRICES)
    with FakeOpenAIServer(loop_script(None)) as server:
        capped = LLMConfig(server.url, "policy-7b", backoff_s=0.01, prices=prices)
        kinds["capped"] = _fleet(settings, events, "llm", seed=26, llm=capped, caps=Caps(max_steps=2))
    tasks = [task_for(27, 0)]
    with ReasoningServer(
        solver_script(tasks),
        reasoning=lambda turn: f"Let me think about step {turn} carefully." if turn in REASONING_TURNS else None,
        weight_version=lambda n: f"w{n // 3}",  # the trainer pushed new weights mid-session
    ) as reasoner:
        config = LLMConfig(reasoner.url, "policy-7b", backoff_s=0.01, prices=prices)
        kinds["reasoner"] = _fleet(settings, events, "llm", seed=27, llm=config)
        responses = list(reasoner.responses)
    with ReasoningServer(loop_script(3), reasoning=lambda turn: None, cost_usd=REPORTED_COST) as paid:
        config = LLMConfig(paid.url, "policy-7b", backoff_s=0.01, prices=prices)
        kinds["reported_cost"] = _fleet(settings, events, "llm", seed=28, llm=config)
    imported = import_trajectory(DJANGO)
    kinds["imported"] = {e["session_id"] for e in imported}
    write_raw(settings, events + imported, batch_size=5000)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    return settings, kinds, responses


def _outcomes(settings: Settings) -> dict[str, str]:
    return dict(run_query(settings, "SELECT session_id, outcome FROM scores")[1])


def _eligible(settings: Settings, outcomes: tuple[str, ...], min_quality: float = 0.0) -> set[str]:
    chosen = ", ".join(f"'{o}'" for o in outcomes)
    rows = run_query(
        settings,
        f"SELECT session_id FROM scores WHERE outcome IN ({chosen}) AND NOT security_flagged AND quality >= "
        f"{min_quality} AND session_id NOT IN (SELECT session_id FROM duplicates WHERE NOT is_representative)",
    )[1]
    return {r[0] for r in rows}


@pytest.mark.slow
def test_each_kind_of_session_gets_its_outcome(lake: tuple[Settings, dict[str, set[str]], list[bytes]]) -> None:
    settings, kinds, _ = lake
    outcomes = _outcomes(settings)
    expected = {
        "solver": "success",
        "reasoner": "success",
        "flailer": "failure",
        "cheater": "failure",  # the evaluator passed it, a flag voided the verdict
        "capped": "failure",
        "crash": "agent_crash",
        "hang": "infrastructure",  # the reaper killed it: says nothing about the policy
        "imported": "success",  # the run's own report says it was resolved
    }
    assert {kind: {outcomes[s] for s in kinds[kind]} for kind in expected} == {k: {v} for k, v in expected.items()}
    exportable = dict(run_query(settings, "SELECT session_id, exportable FROM scores")[1])
    # a failure is never exportable, whatever its validity and novelty make its quality
    assert not any(exportable[s] for kind in ("flailer", "cheater", "capped", "crash", "hang") for s in kinds[kind])


@pytest.mark.slow
def test_default_sft_export_holds_only_verified_successes_and_rl_every_evaluated_policy_session(
    lake: tuple[Settings, dict[str, set[str]], list[bytes]], tmp_path: Path
) -> None:
    settings, kinds, _ = lake
    for fmt in ("hf", "openai", "sharegpt"):
        stats = export_training_set(Lakehouse.open(settings), fmt, tmp_path / fmt, filters=ALL_ORIGINS)
        records = read_export(tmp_path / fmt)
        exported = {r["session_id"] for r in records}
        assert exported == _eligible(settings, ("success",), settings.quality_min) and exported
        assert exported <= kinds["solver"] | kinds["reasoner"] | kinds["imported"]
        manifest = json.loads((tmp_path / fmt / "manifest.json").read_text())
        left = manifest["counts"]["left_out"]
        assert manifest["filters"]["outcome"] == "success" and stats.records == len(records)
        assert left["outcome"]["agent_crash"] == 1 and left["outcome"]["infrastructure"] == 1
        assert left["outcome"]["failure"] >= 3
    export_training_set(Lakehouse.open(settings), "rl", tmp_path / "rl", filters=ALL_ORIGINS)
    rl = read_export(tmp_path / "rl")
    sessions = {r["session_id"] for r in rl}
    assert sessions == _eligible(settings, ("success", "failure"))
    assert kinds["flailer"] | kinds["capped"] <= sessions  # failures are signal for RL
    assert not sessions & (kinds["crash"] | kinds["hang"] | kinds["cheater"])  # the forged verdict: security flag
    manifest = json.loads((tmp_path / "rl" / "manifest.json").read_text())
    assert manifest["filters"]["outcome"] == "any" and manifest["filters"]["min_quality"] == 0.0
    assert set(manifest["counts"]["left_out"]["outcome"]) == {"agent_crash", "infrastructure"}
    assert manifest["counts"]["left_out"]["security_flag"] >= 1
    failures = export_training_set(
        Lakehouse.open(settings), "hf", tmp_path / "fail", filters=ExportFilters(origins=(), outcome="failure")
    )
    assert failures.records > 0
    assert {r["outcome"] for r in read_export(tmp_path / "fail")} == {"failure"}


@pytest.mark.slow
def test_reasoning_session_exports_segments_equal_to_what_the_server_returned(
    lake: tuple[Settings, dict[str, set[str]], list[bytes]], tmp_path: Path
) -> None:
    settings, kinds, raw = lake
    export_training_set(Lakehouse.open(settings), "rl", tmp_path / "rl", filters=ALL_ORIGINS)
    (session_id,) = kinds["reasoner"]
    segments = sorted(
        (r for r in read_export(tmp_path / "rl") if r["session_id"] == session_id),
        key=lambda r: r["segment_index"],
    )
    responses = [json.loads(body) for body in raw]
    # the prompt after a turn with reasoning did not extend it: a new segment there, and only there
    starts = [0] + [turn + 1 for turn in REASONING_TURNS if turn + 1 < len(responses)]
    assert [s["first_turn"] for s in segments] == starts
    assert all(s["has_token_ids"] and s["num_segments"] == len(starts) for s in segments)
    assert [s["is_last_segment"] for s in segments] == [False] * (len(starts) - 1) + [True]
    for segment in segments:
        first = responses[segment["first_turn"]]
        assert json.dumps(segment["prompt_ids"]) == json.dumps(first["prompt_token_ids"])
        assert len(segment["response_ids"]) == len(segment["response_mask"]) == len(segment["logprobs"])
        assert segment["reward"] == 1.0 and segment["group_id"] == segments[0]["group_id"]
        turns = range(segment["first_turn"], segment["first_turn"] + segment["num_turns"])
        versions = [responses[t]["metadata"]["weight_version"] for t in turns]
        assert segment["policy_versions"] == versions  # per turn, as the server reported
        assert segment["sampling_engines"] == [
            {"model": "fake-vllm", "engine": "toy-sglang", "dtype": "bfloat16", "system_fingerprint": None}
        ]
    # every sampled token exactly once, with the server's logprob
    sampled = [t for s in segments for t, m in zip(s["response_ids"], s["response_mask"], strict=True) if m]
    logprobs = [lp for s in segments for lp, m in zip(s["logprobs"], s["response_mask"], strict=True) if m]
    assert json.dumps(sampled) == json.dumps([t for r in responses for t in r["choices"][0]["token_ids"]])
    server_lp = [e["logprob"] for r in responses for e in r["choices"][0]["logprobs"]["content"]]
    assert json.dumps(logprobs) == json.dumps(server_lp)
    # the reasoning is kept with each assistant turn of the conversation
    hf = export_training_set(Lakehouse.open(settings), "hf", tmp_path / "hf", filters=ALL_ORIGINS)
    assert hf.records
    (record,) = [r for r in read_export(tmp_path / "hf") if r["session_id"] == session_id]
    thoughts = [m["reasoning_content"] for m in record["messages"] if m["role"] == "assistant"]
    assert [i for i, t in enumerate(thoughts) if t] == list(REASONING_TURNS)


def _sum(values: list) -> int:
    return sum(v or 0 for v in values)


@pytest.mark.slow
def test_token_and_cost_totals_agree_across_trajectories_costs_every_format_and_atif_steps(
    lake: tuple[Settings, dict[str, set[str]], list[bytes]], tmp_path: Path
) -> None:
    settings, kinds, _ = lake
    columns, rows = run_query(
        settings, "SELECT session_id, input_tokens, cached_tokens, output_tokens, cost_usd FROM trajectories"
    )
    totals = {r[0]: dict(zip(columns[1:], r[1:], strict=True)) for r in rows}
    every = ExportFilters(origins=(), min_quality=0.0, outcome="all")
    for fmt in ("hf", "openai", "sharegpt", "atif"):
        export_training_set(Lakehouse.open(settings), fmt, tmp_path / fmt, filters=every)
    export_training_set(
        Lakehouse.open(settings), "rl", tmp_path / "rl", filters=ExportFilters(origins=(), min_quality=0.0)
    )
    seen: dict[str, int] = {}
    for fmt in ("hf", "openai", "sharegpt", "rl"):
        for record in read_export(tmp_path / fmt):
            usage = record["usage"]
            assert {k: usage[k] for k in totals[record["session_id"]]} == totals[record["session_id"]], fmt
            seen[fmt] = seen.get(fmt, 0) + 1
    assert seen["hf"] == len(totals) - 1 and seen["rl"] >= 5  # the security-flagged cheater is left out
    for trajectory in read_export(tmp_path / "atif"):
        expected = totals[trajectory["session_id"]]
        final = trajectory["final_metrics"]
        metrics = [s["metrics"] for s in trajectory["steps"] if "metrics" in s]
        # final_metrics is the sum of the steps, and both equal the trajectories row
        assert (
            final["total_prompt_tokens"] == _sum([m.get("prompt_tokens") for m in metrics]) == expected["input_tokens"]
        )
        assert (
            final["total_cached_tokens"] == _sum([m.get("cached_tokens") for m in metrics]) == expected["cached_tokens"]
        )
        completion = _sum([m.get("completion_tokens") for m in metrics])
        assert final["total_completion_tokens"] == completion == expected["output_tokens"]
        step_costs = sum((Decimal(repr(m["cost_usd"])) for m in metrics), Decimal(0))
        assert Decimal(repr(final["total_cost_usd"])) == step_costs == Decimal(repr(expected["cost_usd"]))
        assert final["total_steps"] == len(trajectory["steps"])
    # the costs view adds up the same rows
    cost = run_query(settings, "SELECT sum(inference_cost_usd), sum(output_tokens) FROM costs")[1][0]
    assert cost[0] == pytest.approx(sum(t["cost_usd"] for t in totals.values()), rel=1e-12)
    assert cost[1] == sum(t["output_tokens"] for t in totals.values())
    # the last call of an LLM session counts (it called submit: no action carries it)
    (reasoner,) = kinds["reasoner"]
    assert totals[reasoner]["cost_usd"] > 0
    # a cost the server reported is used as is (4 calls: three bash steps and the submit)
    (paid,) = kinds["reported_cost"]
    assert totals[paid]["cost_usd"] == pytest.approx(4 * REPORTED_COST, rel=1e-12)


def test_a_price_table_changes_costs_without_reingesting(
    lake: tuple[Settings, dict[str, set[str]], list[bytes]],
) -> None:
    settings, kinds, _ = lake
    (reasoner,) = kinds["reasoner"]
    (paid,) = kinds["reported_cost"]
    query = "SELECT session_id, cost_usd FROM trajectories"
    before = dict(run_query(settings, query)[1])
    doubled = {"policy-7b": {k: 2 * v for k, v in PRICES["policy-7b"].items()}}
    again = dict(run_query(_lake(settings.home, doubled), query)[1])
    unpriced = dict(run_query(_lake(settings.home, {}), query)[1])
    assert again[reasoner] == pytest.approx(2 * before[reasoner], rel=1e-12) and unpriced[reasoner] == 0.0
    assert again[paid] == before[paid] == unpriced[paid]  # reported by the server: no table changes it
    cost_view = "SELECT sum(inference_cost_usd) FROM costs WHERE model = 'policy-7b'"
    assert run_query(_lake(settings.home, doubled), cost_view)[1][0][0] > run_query(settings, cost_view)[1][0][0]


@pytest.mark.slow
def test_atif_export_import_export_is_byte_stable_for_fleet_llm_and_imported_sessions(
    lake: tuple[Settings, dict[str, set[str]], list[bytes]], tmp_path: Path
) -> None:
    settings, kinds, _ = lake
    every = ExportFilters(origins=(), min_quality=0.0, outcome="all")
    export_training_set(Lakehouse.open(settings), "atif", tmp_path / "a", filters=every)
    first = _lines(tmp_path / "a")
    assert set(first) == set().union(*kinds.values()) - kinds["cheater"]  # security-flagged: never exported
    again = _lake(tmp_path / "again")
    imported = [event for path in sorted((tmp_path / "a" / "data").iterdir()) for event in import_trajectory(path)]
    write_raw(again, imported, batch_size=5000)
    assemble(Lakehouse.open(again))
    score_all(Lakehouse.open(again))
    export_training_set(Lakehouse.open(again), "atif", tmp_path / "b", filters=every)
    second = _lines(tmp_path / "b")
    assert set(second) == set(first)
    for session_id, line in first.items():
        assert second[session_id] == line, session_id
    # the file's ids are kept beside the lake's own (an import never takes a session id), and its
    # verdicts are claims: restated by the export, never counted by the lake
    assert {e["extra"]["source_session_id"] for e in imported} == set(first)
    assert not {e["session_id"] for e in imported} & set(first)
    counted = "SELECT count(*) FROM trajectories WHERE eval_passed IS NOT NULL OR reward IS NOT NULL"
    assert run_query(again, counted)[1][0][0] == 0
    assert any(json.loads(line)["extra"].get("eval_passed") for line in first.values())
    scores = read_export(tmp_path / "a", "scores")
    assert {s["session_id"] for s in scores} == set(first)
    assert {s["session_id"] for s in read_export(tmp_path / "b", "scores")} == set(first)
