"""The shared redaction corpus through import, the lake and every export format (issue 43).

Each case becomes an imported ATIF run whose tool outputs, tool arguments, reasoning and a reply recorded
with token ids carry the text (the channels its line names). After ``import`` → raw table → assemble, every
export format must hold none of a secret's substrings (also URL-, HTML- or JSON-decoded), and the ordinary
texts' substrings must come out unchanged. Skipped without ``../shared``.
"""

from __future__ import annotations

import html
import json
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
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, list[CarrierCase]]:
    cases = _cases()
    tmp = tmp_path_factory.mktemp("carriers")
    settings = load_settings(home=tmp / "home", topic="unused", kafka_bootstrap=None, catalog_uri=None)
    events: list[dict] = []
    for case in cases:
        path = tmp / f"{case.id}.json"
        path.write_text(json.dumps(_run(case)))
        events += import_trajectory(path)
    write_raw(settings, events, batch_size=5000)
    assemble(settings)
    score_all(settings)
    return settings, cases


def _forms(text: str) -> list[str]:
    return [text, urllib.parse.unquote(text), html.unescape(text), text.encode().decode("unicode_escape", "ignore")]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_export_format_holds_no_corpus_secret(lake: tuple[Settings, list[CarrierCase]], fmt, tmp_path: Path):
    settings, cases = lake
    out = tmp_path / fmt
    export_training_set(settings, fmt, out, filters=EVERY)
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
