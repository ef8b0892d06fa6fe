"""Input-derived text through the command line: verdict files naming hostile instance ids.

``trajlake import --verdicts`` prints each instance id no session has; an id is whatever the file
says, here OSC 52 (write the clipboard), OSC 8 (a hyperlink) and a bidi override. What reaches the
terminal is the id with those characters shown as escapes (``common.text.printable``), nothing a
terminal acts on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from common.settings import Settings
from common.text import is_printable
from pipelines.assemble import assemble
from tests.helpers import sample_events, write_raw
from trajlake.cli import app
from warehouse.lakehouse import Lakehouse

HOSTILE_IDS = [
    "\x1b]52;c;cm0gLXJmIH4=\x07clip",
    "\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\",
    "acme__\u202etxt.exe",
    "\x9b2Jcsi",
]


@pytest.mark.slow
@pytest.mark.integration
def test_unknown_verdict_ids_are_printed_as_visible_escapes(kafka_settings: Settings, tmp_path: Path) -> None:
    write_raw(kafka_settings, sample_events(1))  # a lakehouse, with no session of these instances
    assemble(Lakehouse.open(kafka_settings))
    verdicts = tmp_path / "report.json"
    verdicts.write_text(json.dumps({instance: {"resolved": True} for instance in HOSTILE_IDS}))
    result = CliRunner().invoke(app, ["import", "--verdicts", str(verdicts)])
    printed = result.stdout + result.stderr
    assert printed, (result.exit_code, result.exception)
    assert is_printable(printed), [c for c in printed if not is_printable(c)]
    for shown in ("\\x1b]52;c;cm0gLXJmIH4=\\x07clip", "\\x1b]8;;https://evil.example/", "acme__\\u202etxt.exe"):
        assert shown in printed, printed
