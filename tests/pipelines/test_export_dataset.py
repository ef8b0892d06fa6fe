"""An export directory is a Hugging Face dataset a trainer takes as it comes (issue 47), replaced as a whole.

A lakehouse of real sandbox sessions (built-in solvers, the LLM agent against the scripted
server) and the synthetic load fleet: the default SFT export leaves the synthetic sessions out
(counted), ``load_dataset(DIR)`` gives its splits, every record ends on the agent's last turn with
every called tool defined and carries its origin and (for a sandbox success) its patch. A TRL
``SFTTrainer`` fine-tunes a tiny locally built model on ``load_dataset(DIR)["train"]`` unchanged.
Exports killed at each named point leave the earlier export or the new one, whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set, read_export
from pipelines.export.layout import CHECKPOINTS, CRASH_ENV
from pipelines.score import score_all
from producers.fleet import ListSink, run_fleet
from producers.fleet.llm import LLMConfig
from producers.fleet.llm.testing import FakeOpenAIServer, solver_script
from producers.fleet.tasks import task_for
from tests.helpers import write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ROOT = Path(__file__).resolve().parents[2]


def _settings(home: Path) -> Settings:
    return load_settings(home=home, topic="unused", kafka_bootstrap=None, catalog_uri=None)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Real sandbox sessions (6 solvers, a flailer, 4 of the LLM agent) beside 20 synthetic load sessions."""
    settings = _settings(tmp_path_factory.mktemp("dataset") / "home")
    events: list[dict] = []
    # the fleet runs task_for(seed, i) as its i-th session: six families, some in each split
    for seed, agent, sessions in ((31, "solver", 6), (34, "flailer", 1)):
        sink = ListSink(decode=False)
        run_fleet(settings, "local", sessions=sessions, seed=seed, sink=sink, agent=agent)
        events += sink.events
    with FakeOpenAIServer(solver_script([task_for(35, i) for i in range(4)])) as server:
        config = LLMConfig(server.url, "policy-7b", backoff_s=0.01)
        sink = ListSink(decode=False)
        run_fleet(settings, "local", sessions=4, seed=35, sink=sink, agent="llm", llm=config)
        events += sink.events
    run_fleet(settings, backend="synthetic", sessions=20, seed=37, sink=events.append)
    write_raw(settings, events, batch_size=5000)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    return settings


def _called(record: dict[str, Any]) -> set[str]:
    return {c["function"]["name"] for m in record["messages"] for c in m.get("tool_calls") or []}


def _defined(record: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in record["tools"]}


@pytest.mark.slow
def test_trajectories_say_where_each_session_came_from(lake: Settings) -> None:
    _, rows = run_query(lake, "SELECT origin, count(*) FROM trajectories GROUP BY ALL ORDER BY origin")
    assert dict(rows) == {"sandbox": 11, "synthetic": 20}


@pytest.mark.slow
def test_a_default_export_is_a_dataset_of_real_sessions_ending_on_the_agents_turn(
    lake: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    out = tmp_path / "sft"
    stats = export_training_set(Lakehouse.open(lake), "hf", out)
    records = read_export(out)
    assert stats.records == len(records) > 0
    # every record has an origin, none synthetic; the synthetic sessions are counted under their own reason
    assert {r["origin"] for r in records} == {"sandbox"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["left_out"]["origin"] == {"synthetic": 20}
    assert manifest["counts"]["per_origin"] == {"sandbox": stats.sessions}
    # load_dataset with the path alone: the splits, each record in its own split's file only
    loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
    per_split = {s: n for s, n in manifest["counts"]["per_split"].items() if n}
    assert {s: len(d) for s, d in loaded.items()} == per_split
    card = (out / "README.md").read_text()
    for split in ("train", "validation", "test"):
        assert (f'path: "data/{split}.jsonl"' in card) == (split in per_split)  # an empty split: no file
        assert (out / "data" / f"{split}.jsonl").exists() == (split in per_split)
    by_id = {r["session_id"]: r for r in records}
    for split, dataset in loaded.items():
        for row in dataset:
            assert row["split"] == split
            # read back exactly as written: no key merged in from another record (tools, messages, flags)
            written = by_id[row["session_id"]]
            assert row["messages"] == written["messages"] and row["tools"] == written["tools"]
            assert row["flags"] == written["flags"] and row["usage"] == written["usage"]
    _, rows = run_query(
        lake,
        "SELECT t.session_id FROM trajectories t JOIN scores s USING (session_id) "
        "WHERE t.origin = 'sandbox' AND s.outcome = 'success'",
    )
    successes = {r[0] for r in rows}
    assert successes and successes >= set(by_id)
    for record in records:
        last = record["messages"][-1]
        assert last["role"] == "assistant", record["session_id"]  # ends on the agent's last turn
        assert [c["function"]["name"] for c in last["tool_calls"] or []] == ["submit"]  # the action that ended it
        assert _called(record) <= _defined(record)  # every tool it calls is defined
        assert record["submission"] and record["submission"].startswith("--- ")  # the final patch
    for field in ("submission", "origin", "flags", "usage", "group_id", "task_family"):
        assert field in records[0]


@pytest.mark.slow
def test_every_format_is_a_dataset_with_origin_and_rl_tools_as_a_list(lake: Settings, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    every = ExportFilters(origins=(), min_quality=0.0, outcome="all")
    for fmt in ("openai", "sharegpt", "rl", "verl", "skyrl", "atif"):
        out = tmp_path / fmt
        stats = export_training_set(Lakehouse.open(lake), fmt, out, filters=every)
        loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
        assert sum(len(d) for d in loaded.values()) == stats.records > 0, fmt
        records = read_export(out)
        if fmt == "verl":
            origins = [r["extra_fields"]["origin"] for r in records]
        elif fmt == "skyrl":
            origins = [r["env_metrics"]["origin"] for r in records]
        elif fmt == "atif":
            origins = [r["origin"] for r in read_export(out, "scores")]
        else:
            origins = [r.get("origin") for r in records]
        assert set(origins) <= {"sandbox", "synthetic"} and None not in origins, fmt
        if fmt == "rl":
            assert all(isinstance(r["tools"], list) and r["tools"] for r in records)
        if fmt == "openai":
            for record in records:
                assert record["messages"][-1]["role"] == "assistant" and _called(record) <= _defined(record)


def _cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    base.update(TRAJLAKE_HOME=str(home), PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "trajlake.cli", *args], env=base, cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def _whole(out: Path) -> str:
    """The export id of the one whole export in ``out`` (every file its manifest and card name, sha256 equal)."""
    manifest = json.loads((out / "manifest.json").read_text())
    card = (out / "README.md").read_text()
    assert manifest["card"]["sha256"] == hashlib.sha256(card.encode()).hexdigest()
    named = set()
    for entry in manifest["files"]:
        assert hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
        assert f'path: "{entry["path"]}"' in card
        named.add(entry["path"])
    on_disk = {f"{d.name}/{p.name}" for d in out.iterdir() if d.is_dir() for p in d.iterdir()}
    assert on_disk == named, (on_disk, named)
    return str(manifest["export_id"])


@pytest.mark.slow
@pytest.mark.parametrize("point", CHECKPOINTS)
def test_an_export_killed_at_any_point_leaves_one_whole_export(lake: Settings, tmp_path: Path, point: str) -> None:
    out = tmp_path / "out"
    first = _cli(lake.home, "export", "--format", "hf", "--out", str(out))
    assert first.returncode == 0, first.stderr
    earlier = _whole(out)
    killed = _cli(
        lake.home, "export", "--format", "hf", "--origin", "all", "--min-quality", "0", "--out", str(out),
        env={CRASH_ENV: point},
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr  # SIGKILL at the named point
    now = _whole(out)  # the earlier export or the new one, never a mix
    new_records = {r["origin"] for r in read_export(out)}
    if point in ("data_written", "card_written", "before_swap"):
        assert now == earlier and new_records == {"sandbox"}
    else:
        assert now != earlier and "synthetic" in new_records
    # the next export clears what the killed one left beside the directory
    again = _cli(lake.home, "export", "--format", "hf", "--out", str(out))
    assert again.returncode == 0, again.stderr
    _whole(out)
    assert not [p.name for p in tmp_path.iterdir() if ".export-" in p.name]


@pytest.mark.slow
def test_force_keeps_the_users_files_through_a_kill_and_a_refusal_is_one_line(lake: Settings, tmp_path: Path) -> None:
    out = tmp_path / "mixed"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    refused = _cli(lake.home, "export", "--format", "openai", "--out", str(out))
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "--force" in refused.stderr and "notes.txt" in refused.stderr
    killed = _cli(
        lake.home, "export", "--format", "openai", "--out", str(out), "--force", env={CRASH_ENV: "after_swap"}
    )
    assert killed.returncode == -9
    assert (out / "notes.txt").read_text() == "mine"
    _whole(out)
    done = _cli(lake.home, "export", "--format", "openai", "--out", str(out))  # an export and the user's file
    assert done.returncode == 1 and "notes.txt" in done.stderr  # still something else: --force again
    done = _cli(lake.home, "export", "--format", "openai", "--out", str(out), "--force")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "data", "manifest.json", "notes.txt"]


@pytest.mark.slow
def test_assembly_takes_the_declared_origin_within_its_vocabulary(tmp_path: Path) -> None:
    from tests.helpers import sample_events

    settings = _settings(tmp_path / "home")
    events = sample_events(5, seed=5)
    ids = sorted({e["session_id"] for e in events})
    declared = {ids[0]: "import:swe-agent", ids[1]: "otlp", ids[2]: "sandbox; DROP", ids[3]: None, ids[4]: None}
    for event in events:
        extra = event.setdefault("extra", {})
        sid = event["session_id"]
        extra.pop("origin", None)
        if declared[sid] is not None:
            extra["origin"] = declared[sid]
        if sid == ids[0]:
            extra["source_kind"] = "import"  # the import door's identity (pipelines.intake.admission)
        if sid == ids[1]:
            extra["otlp_client"] = "client:a"  # the OTLP door's
        if sid == ids[3]:
            extra.pop("backend", None)  # declared nothing at all: another SDK host
        if sid == ids[4] and event["event_type"] == "session_start":
            extra["backend"] = "synthetic"  # as the synthetic fleet's events say, origin or not
    write_raw(settings, events)
    assemble(Lakehouse.open(settings))
    _, rows = run_query(settings, "SELECT session_id, origin FROM trajectories")
    assert dict(rows) == {
        ids[0]: "import:swe-agent",
        ids[1]: "otlp",
        ids[2]: "sdk",  # outside the vocabulary
        ids[3]: "sdk",
        ids[4]: "synthetic",  # no declaration: its backend says it (events written before origins)
    }
    _, flagged = run_query(settings, "SELECT session_id, reason, action FROM quarantine")
    assert flagged == [(ids[2], "origin_mismatch", "flagged")]  # a declaration the door does not allow


def test_origin_option_vocabulary() -> None:
    from pipelines.errors import ExportError
    from pipelines.export.select import origin_condition, parse_origins

    assert parse_origins(None) is None and parse_origins("all") == ()
    assert parse_origins("sandbox, import:swe-agent,sandbox") == ("sandbox", "import:swe-agent")
    assert "starts_with" in origin_condition(parse_origins("import"))
    assert "'synthetic'" in origin_condition(None) and "NOT IN" in origin_condition(None)
    for bad in ("synthetics", "import:", "local"):
        with pytest.raises(ExportError, match="unknown origin"):
            parse_origins(bad)
