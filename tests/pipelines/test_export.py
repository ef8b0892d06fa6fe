"""End to end: a small synthetic fleet run → assemble → score → export in every format."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import FORMATS, ExportError, ExportFilters, export_training_set, read_export, safe_path
from pipelines.export.trainers import TRAINER_FORMATS
from pipelines.score import score_all
from producers.fleet import run_fleet
from tests.helpers import write_raw
from trajlake.cli import app
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, Path]:
    home = tmp_path_factory.mktemp("export") / "home"
    settings = load_settings(home=home, topic="unused", kafka_bootstrap=None, catalog_uri=None)
    events: list[dict] = []
    labels = home.parent / "labels.jsonl"
    run_fleet(
        settings, backend="synthetic", sessions=60, seed=5, cheat_rate=0.3, labels_path=labels, sink=events.append
    )
    # a secret that must not survive into any export
    for event in events:
        if event["event_type"] == "session_start":
            event["payload"]["instruction"] += " export OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwx0123"
    write_raw(settings, events, batch_size=5000)
    assemble(Lakehouse.open(settings))
    stats = score_all(Lakehouse.open(settings))
    assert stats.sessions == 60 and stats.exportable > 0
    return settings, labels


@pytest.mark.slow
def test_scoring_tables_and_rescoring(scored: tuple[Settings, Path]) -> None:
    settings, _ = scored
    _, rows = run_query(settings, "SELECT count(*), min(quality) >= 0, max(quality) <= 1 FROM scores")
    assert rows[0] == (60, True, True)
    _, rows = run_query(settings, "SELECT count(DISTINCT session_id) FROM flags WHERE flag_class <> 'anomaly'")
    assert rows[0][0] > 0
    assert score_all(Lakehouse.open(settings)).skipped
    again = score_all(Lakehouse.open(settings), force=True)
    assert not again.skipped and run_query(settings, "SELECT count(*) FROM scores")[1][0][0] == 60


@pytest.mark.parametrize("fmt", TRAINER_FORMATS)
def test_trainer_formats_leave_out_sessions_without_token_ids(scored: tuple[Settings, Path], tmp_path: Path, fmt: str):
    settings, _ = scored
    stats = export_training_set(Lakehouse.open(settings), fmt, tmp_path / "out", filters=ALL_ORIGINS)
    # like rl: every evaluated policy session neither security-flagged nor a shadowed duplicate
    _, rows = run_query(
        settings,
        "SELECT count(*) FROM scores WHERE outcome IN ('success', 'failure') AND NOT security_flagged "
        "AND session_id NOT IN (SELECT session_id FROM duplicates WHERE NOT is_representative)",
    )
    # synthetic sessions recorded no model call: a trainer record needs sampled ids, none is invented
    assert stats.records == 0 and stats.quarantined == rows[0][0] > 0


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f not in TRAINER_FORMATS])
def test_export_loads_and_manifest_matches(scored: tuple[Settings, Path], tmp_path: Path, fmt: str) -> None:
    settings, _ = scored
    stats = export_training_set(Lakehouse.open(settings), fmt, tmp_path / "out", filters=ALL_ORIGINS)
    # SFT formats: exactly the exportable sessions (verified successes); rl: every evaluated policy
    # session; atif: every ended one (neither flagged for security nor a shadowed duplicate)
    chosen = {
        "hf": "exportable",
        "openai": "exportable",
        "sharegpt": "exportable",
        "rl": "outcome IN ('success', 'failure')",
        "atif": "outcome <> 'running'",
    }[fmt]
    eligible = (
        "NOT security_flagged AND session_id NOT IN (SELECT session_id FROM duplicates WHERE NOT is_representative)"
    )
    _, rows = run_query(settings, f"SELECT count(*) FROM scores WHERE {chosen} AND {eligible}")
    assert stats.records == rows[0][0] > 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    for entry in manifest["files"]:  # one file per split (and, for atif, its scores)
        data = tmp_path / "out" / entry["path"]
        assert entry["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
        assert entry["path"] == f"{'scores' if entry['config'] == 'scores' else 'data'}/{entry['split']}.jsonl"
        assert {json.loads(line)["session_id"] for line in data.read_text().splitlines()}
    assert manifest["counts"]["records"] == stats.records and manifest["scorer_version"]
    assert set(manifest["source_snapshots"]) >= {"trajectories", "steps", "scores"}
    text = "".join((tmp_path / "out" / e["path"]).read_text() for e in manifest["files"] if e["config"] == "default")
    assert "sk-abcdefghijklmnopqrstuvwx0123" not in text and "[REDACTED]" in text
    records = [json.loads(line) for line in text.splitlines()]  # a plain JSON-lines reader
    assert len(records) == stats.records
    # where each session came from (asked for with origins=(); atif: in this lake's judgement, the scores)
    judged = read_export(tmp_path / "out", "scores") if fmt == "atif" else records
    assert {r["origin"] for r in judged} == {"synthetic"}
    if fmt in ("hf", "openai"):
        calls = [m for m in records[0]["messages"] if m["role"] == "assistant"]
        assert calls and calls[0]["tool_calls"][0]["function"]["name"]
        json.loads(calls[0]["tool_calls"][0]["function"]["arguments"])
    if fmt == "openai":
        assert records[0]["tools"][0]["type"] == "function"
    if fmt == "rl":
        # synthetic sessions recorded no model call: message form, never invented ids
        assert records[0]["has_token_ids"] is False and records[0]["response_ids"] == []
        assert records[0]["prompt_source"] == "reconstructed" and records[0]["split"] in ("train", "validation", "test")
        assert 0.0 <= records[0]["reward"] <= 1.0
    _, rows = run_query(settings, f"SELECT records FROM exports WHERE export_id = '{stats.export_id}'")
    assert rows == [(stats.records,)]


def test_hf_export_loads_with_datasets_offline(
    scored: tuple[Settings, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    datasets = pytest.importorskip("datasets")
    settings, _ = scored
    stats = export_training_set(Lakehouse.open(settings), "hf", tmp_path / "hf_out", filters=ALL_ORIGINS)
    # the directory alone: its card names the split files and declares the features
    splits = datasets.load_dataset(str(tmp_path / "hf_out"), cache_dir=str(tmp_path / "cache"))
    manifest = json.loads((tmp_path / "hf_out" / "manifest.json").read_text())
    assert {s: len(d) for s, d in splits.items()} == {s: n for s, n in manifest["counts"]["per_split"].items() if n}
    assert sum(len(d) for d in splits.values()) == stats.records
    for split, dataset in splits.items():
        assert set(dataset["split"]) == {split}  # a record only in its own split's file
    dataset = splits["train"]
    first = dataset[0]["messages"]
    assert first[0]["role"] == "system" and first[2]["tool_calls"][0]["type"] == "function"


def test_paths_outside_the_export_directory_are_refused(tmp_path: Path) -> None:
    for name in ("../escape.jsonl", "/etc/passwd", "a/../../b.jsonl"):
        with pytest.raises(ExportError, match="outside the export directory"):
            safe_path(tmp_path, name)
    (tmp_path / "link").symlink_to("/tmp")
    with pytest.raises(ExportError):
        safe_path(tmp_path, "link/x.jsonl")
    assert safe_path(tmp_path, "hf.jsonl") == (tmp_path / "hf.jsonl").resolve()


def test_cli_score_export_and_evaluate(
    scored: tuple[Settings, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, labels = scored
    monkeypatch.setenv("TRAJLAKE_HOME", str(settings.home))
    runner = CliRunner()
    result = runner.invoke(app, ["score"])
    assert result.exit_code == 0 and "up to date" in result.output
    result = runner.invoke(
        app,
        ["export", "--format", "sharegpt", "--origin", "all", "--out", str(tmp_path / "sg"), "--min-quality", "0.9"],
    )
    assert result.exit_code == 0, result.output
    assert "sha256" in result.output
    result = runner.invoke(app, ["quality", "evaluate", "--labels", str(labels), "--inject", "20"])
    assert result.exit_code == 0, result.output
    assert "any_cheat" in result.output and "near_duplicate" in result.output


# ---- export paths through the CLI (issue 18.5) and the two CLI errors of issue 16 ----

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_lake(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A scored lakehouse of a few sessions, written straight to raw events."""
    from tests.helpers import sample_events

    home = tmp_path_factory.mktemp("export-paths") / "home"
    settings = load_settings(home=home, topic="unused", kafka_bootstrap=None, catalog_uri=None)
    write_raw(settings, sample_events(6, seed=3))
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    return settings


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m trajlake.cli ARGS`` as a user runs it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    base.update(TRAJLAKE_HOME=str(home), PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "trajlake.cli", *args], env=base, cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(word in lines[0] for word in words), lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["/", "/etc", "/usr", "/usr/local/share", "HOME"])
def test_export_refuses_system_directories(small_lake: Settings, tmp_path: Path, target: str) -> None:
    home = tmp_path / "user-home"
    home.mkdir()
    out = str(home) if target == "HOME" else target
    before = sorted(os.listdir(out))
    result = cli(
        small_lake.home, "export", "--format", "hf", "--origin", "all", "--out", out, "--force", env={"HOME": str(home)}
    )
    one_line_error(result, "refusing to export into")
    assert sorted(os.listdir(out)) == before  # nothing written (no /hf.jsonl, no manifest)


@pytest.mark.slow
def test_export_refuses_a_non_empty_directory_without_force(small_lake: Settings, tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    one_line_error(
        cli(small_lake.home, "export", "--format", "hf", "--origin", "all", "--out", str(out)), "not empty", "--force"
    )
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    result = cli(small_lake.home, "export", "--format", "hf", "--origin", "all", "--out", str(out), "--force")
    assert result.returncode == 0, result.stderr
    assert (out / "notes.txt").read_text() == "mine"  # --force replaces the export's files only
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "data", "manifest.json", "notes.txt"]
    # an earlier export alone is replaced without --force; the user's file stays through it
    again = cli(small_lake.home, "export", "--format", "hf", "--origin", "all", "--out", str(out), "--force")
    assert again.returncode == 0, again.stderr
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    third = cli(small_lake.home, "export", "--format", "hf", "--origin", "all", "--out", str(out))
    assert third.returncode == 0, third.stderr


@pytest.mark.slow
def test_export_to_an_existing_file_is_one_line(small_lake: Settings, tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep")
    one_line_error(
        cli(small_lake.home, "export", "--format", "hf", "--origin", "all", "--out", str(target)), "not a directory"
    )
    assert target.read_text() == "keep"


@pytest.mark.slow
def test_planted_symlinks_are_never_followed(small_lake: Settings, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim_tmp, victim_data = outside / "victim-tmp", outside / "victim-data"
    victim_tmp.write_text("untouched tmp target")
    victim_data.write_text("untouched data target")
    out = tmp_path / "out"
    out.mkdir()
    (out / "hf.jsonl.tmp").symlink_to(victim_tmp)
    (out / "hf.jsonl").symlink_to(victim_data)
    (out / "manifest.json").symlink_to(outside / "created-through-link")
    result = cli(
        small_lake.home,
        "export",
        "--format",
        "hf",
        "--origin",
        "all",
        "--out",
        str(out),
        "--min-quality",
        "0",
        "--force",
    )
    assert result.returncode == 0, result.stderr
    assert victim_tmp.read_text() == "untouched tmp target"
    assert victim_data.read_text() == "untouched data target"
    assert not (outside / "created-through-link").exists()
    assert not (out / "manifest.json").is_symlink()
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["files"]:
        assert entry["sha256"] == hashlib.sha256((out / entry["path"]).read_bytes()).hexdigest()
    assert manifest["counts"]["records"] > 0
    # the link that is not ours is kept (moved, never followed); the one at an export's old name is gone
    leftovers = sorted(p.name for p in out.iterdir())
    assert leftovers == ["README.md", "data", "hf.jsonl.tmp", "manifest.json"]
    assert (out / "hf.jsonl.tmp").is_symlink()
    assert not [p for p in out.parent.iterdir() if ".export-" in p.name]  # no staging directory left


@pytest.mark.slow
def test_score_on_an_empty_lakehouse_says_so(tmp_path: Path) -> None:
    from warehouse.sql import open_views

    open_views(load_settings(home=tmp_path / "empty")).close()  # a lakehouse with every table and no row
    result = cli(tmp_path / "empty", "score")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "nothing to score" in result.stdout


@pytest.mark.slow
@pytest.mark.integration
def test_import_of_deeply_nested_json_is_one_line(tansu_broker: str, tmp_path: Path) -> None:
    deep = tmp_path / "deep.traj"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = cli(
        tmp_path / "home",
        "import",
        str(deep),
        env={"TRAJLAKE_KAFKA_BOOTSTRAP": tansu_broker, "TRAJLAKE_TOPIC": f"deep-{tmp_path.name}"},
    )
    one_line_error(result, "nested deeper than")
