"""The shared redaction corpus through import, the lake and every export format (issue 43).

Each case becomes an imported ATIF run whose tool outputs, tool arguments, reasoning and a reply recorded
with token ids carry the text (the channels its line names). After ``import`` → raw table → assemble, every
export format must hold none of a secret's substrings (also URL-, HTML- or JSON-decoded), and the ordinary
texts' substrings must come out unchanged. Skipped without ``../shared``.
"""

from __future__ import annotations

import html
import json
import re
import urllib.parse
from pathlib import Path

import pytest

from benchmarks.carrier_corpus import SHARED_CORPUS_DIR, CarrierCase, CarrierCorpusUnavailable, load_carrier_corpus
from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import FORMATS, ExportFilters, export_training_set
from pipelines.score import score_all
from producers.importers import import_trajectory
from tests.helpers import write_raw
from warehouse.lakehouse import Lakehouse

EVERY = ExportFilters(min_quality=0.0, outcome="all")


def _cases() -> list[CarrierCase]:
    try:
        return load_carrier_corpus(SHARED_CORPUS_DIR)
    except CarrierCorpusUnavailable as exc:
        pytest.skip(f"the shared redaction corpus is absent ({exc})")


def _run(case: CarrierCase) -> dict:
    """An ATIF run carrying ``case`` in its tool outputs (one per part), arguments, reasoning and a token reply."""
    text = case.text
    steps: list[dict] = [{"step_id": 1, "source": "user", "message": f"Task {case.id}: look at the service."}]
    for index, part in enumerate(case.parts):
        steps.append({
            "step_id": len(steps) + 1, "source": "agent", "message": "Checking.",
            "reasoning_content": text if "thought" in case.carriers else "Look.",
            "tool_calls": [{"tool_call_id": f"c{index}", "function_name": "bash",
                            "arguments": {"command": text if "args" in case.carriers else "cat out.txt"}}],
            "observation": {"results": [{"source_call_id": f"c{index}", "content": part}]},
        })  # fmt: skip
    tokens = "tokens" in case.carriers
    steps.append({
        "step_id": len(steps) + 1, "source": "agent", "message": text if tokens else "Done.",
        **({"metrics": {"prompt_tokens": 3, "completion_tokens": 2, "prompt_token_ids": [1, 2, 3],
                        "completion_token_ids": [7, 8], "logprobs": [-0.5, -0.25]}} if tokens else {}),
    })  # fmt: skip
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": f"corpus-{case.id}",
        "agent": {"name": "harbor-agent", "version": "0.3", "model_name": "m-1"},
        "steps": steps,
    }


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, list[CarrierCase], dict[str, str]]:
    cases = _cases()
    tmp = tmp_path_factory.mktemp("carriers")
    settings = load_settings(home=tmp / "home", topic="unused", kafka_bootstrap=None, catalog_uri=None)
    events: list[dict] = []
    sessions: dict[str, str] = {}
    for case in cases:
        path = tmp / f"{case.id}.json"
        path.write_text(json.dumps(_run(case)))
        imported = import_trajectory(path)
        sessions[case.id] = imported[0]["session_id"]
        events += imported
    write_raw(settings, events, batch_size=5000)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    return settings, cases, sessions


def _forms(text: str) -> list[str]:
    return [text, urllib.parse.unquote(text), html.unescape(text), _unescape(text)]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_export_format_holds_no_corpus_secret(lake, fmt, tmp_path: Path):
    settings, cases, _ = lake
    out = tmp_path / fmt
    export_training_set(Lakehouse.open(settings), fmt, out, filters=EVERY)
    written = "\n".join(p.read_text(errors="replace") for p in sorted(out.rglob("*")) if p.is_file())
    if fmt in ("hf", "openai", "sharegpt", "atif"):  # episode formats keep only sessions fit for RL
        assert "Task " in written, "the export wrote no session"
    forms = _forms(written)
    leaked = [c.id for c in cases if c.kind == "secret" and any(m in f for m in c.must_not_appear for f in forms)]
    assert leaked == []
    if fmt in ("hf", "atif"):
        # the texts do travel to the export (so the check above can fail): ordinary ones come out unchanged
        changed = [
            c.id for c in cases if c.kind == "ordinary" and not all(any(m in f for f in forms) for m in c.must_appear)
        ]
        assert changed == []


@pytest.mark.slow
def test_show_and_the_report_hold_no_corpus_secret(lake, tmp_path: Path):
    from rich.console import Console

    from pipelines.report import write_report
    from pipelines.report.inspect import load_session
    from trajlake.show import render_session

    settings, cases, sessions = lake
    shown = {}
    for case in cases:
        console = Console(record=True, width=200, file=open("/dev/null", "w"))
        render_session(console, load_session(Lakehouse.open(settings), sessions[case.id]), full=True)
        shown[case.id] = console.export_text()
        console.file.close()
    write_report(Lakehouse.open(settings), tmp_path / "report", max_pages=len(cases))
    report = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "report").rglob("*") if p.is_file())
    report_forms = _forms(report)
    leaked = [
        c.id
        for c in cases
        if c.kind == "secret" and any(m in f for m in c.must_not_appear for f in _forms(shown[c.id]) + report_forms)
    ]
    assert leaked == []
    assert all(f"Task {c.id}" in shown[c.id] for c in cases[:3])  # the sessions are shown (the check can fail)


def _unescape(text: str) -> str:
    """``text`` with JSON string escapes decoded (what a reader of the JSON would see)."""
    simple = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}

    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        return chr(int(code[1:], 16)) if code[0] == "u" else simple.get(code, code)

    return re.sub(r'\\(u[0-9a-fA-F]{4}|["\\/bfnrt])', one, text)
