"""Looking at runs: ``trajlake show`` in the terminal and ``trajlake report`` as HTML, in a real browser.

The lakehouse holds real local sandbox sessions — cheaters (flagged with evidence), an agent whose
command output is hostile (``<script>``, terminal escape sequences) and which writes a file (a
diff) — and, when the shared corpus is present, a real imported mini-swe-agent run with its
submitted patch. A person's walk through the report runs in headless Chromium: open the overview,
read the pass-rate plot, click a flagged session, read its evidence, follow it to the step.
``TRAJLAKE_REPORT_SCREENSHOT=docs/report.png`` keeps the overview's screenshot for the docs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set
from pipelines.report import page_name, write_report
from pipelines.score import score_all
from producers.fleet import ListSink, run_fleet
from producers.fleet.sandbox import bwrap_available
from producers.importers import import_trajectory
from tests.helpers import real_runs_dir, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

REAL = real_runs_dir()
MINI = REAL / "mini-swe-agent" / "django__django-11099.traj.json"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = "<script>document.title='pwned';alert(1)</script>"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap cannot create sandboxes here"),
]

HOSTILE_AGENT = r"""
import re


def agent(session):
    session.run("printf '%s\\033[2J\\033]0;owned\\007\\n' \"HOSTILE\"")
    module = re.search(r"Fix the bug in (\S+\.py)", session.instruction).group(1)
    source = session.read_file(module)
    session.write_file(module, source.replace("max(hi, min(lo, x))", "max(lo, min(hi, x))"))
    session.run("python3 run_tests.py")
    session.submit()
""".replace("HOSTILE", HOSTILE)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A scored lakehouse of real sessions; returns its settings and the ids of interest."""
    root = tmp_path_factory.mktemp("inspect")
    settings = load_settings(home=root / "home")
    agent = root / "hostile_agent.py"
    agent.write_text(HOSTILE_AGENT)
    cheats, hostile, synthetic = ListSink(), ListSink(), ListSink()
    run_fleet(settings, "local", 2, seed=4, sink=cheats, policy_mix={"cheat_edit_tests": 1.0, "cheat_network": 1.0})
    run_fleet(settings, "local", 1, seed=4, sink=hostile, agent=f"{agent}:agent")  # task 0: bugfix.clamp
    run_fleet(settings, "synthetic", 150, seed=4, sink=synthetic, cheat_rate=0.1)  # enough for the plots to show
    events = cheats.events + hostile.events + synthetic.events
    imported = None
    if MINI.is_file():
        real = import_trajectory(MINI)
        imported = real[0]["session_id"]
        events += real
    write_raw(settings, events)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    return {
        "settings": settings,
        "root": root,
        "hostile": hostile.events[0]["session_id"],
        "cheaters": sorted({e["session_id"] for e in cheats.events}),
        "imported": imported,
    }


def trajlake(settings: Settings, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(TRAJLAKE_HOME=str(settings.home_path), COLUMNS="160")
    result = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_show_a_flagged_fleet_session_with_its_evidence(lake: dict) -> None:
    settings = lake["settings"]
    out = trajlake(settings, "show", "--flagged")
    session = re.search(r"session ([0-9a-f]{32})", out)
    flagged = {row[0] for row in run_query(settings, "SELECT session_id FROM flags WHERE flag_class <> 'anomaly'")[1]}
    assert session and session.group(1) in flagged
    for cheater in lake["cheaters"]:  # the real sandbox sessions: the evidence and the steps it points at
        out = trajlake(settings, "show", cheater)
        assert re.search(r"flags \(\d+\)", out) and "behavioural" in out or "security" in out
        # the evidence itself as lines, ahead of the run: why, and the step that did it
        assert re.search(r"^    reason \S", out, re.M) and re.search(r"^    at step #\d+ ", out, re.M)
        assert out.index("    reason ") < out.index("run: ") and '"reasons"' not in out
        assert re.findall(r"^#\d+ .*⚑ (\S+)", out, re.M), out  # marked on the step that did it
        assert "evaluation" in out and re.search(r"raw quality = 0\.5 × completion", out)
        assert re.search(r"quality = raw [\d.]+ × governance weight [\d.]+ \((flag \w+|no flag lowers it)\)", out)


def test_show_prints_hostile_output_as_text_and_the_written_file_as_a_diff(lake: dict) -> None:
    out = trajlake(lake["settings"], "show", lake["hostile"][:12], "--full")  # a unique prefix is enough
    assert HOSTILE in out  # printed as text, not interpreted as markup
    assert "\x1b" not in out and "\\x1b[2J" in out and "\\x1b]0;owned\\x07" in out  # escapes made visible
    assert "files written (1)" in out
    assert re.search(r"^-    return max\(hi, min\(lo, x\)\)", out, re.M)
    assert re.search(r"^\+    return max\(lo, min\(hi, x\)\)", out, re.M)
    assert "passed: 3/3" in out or re.search(r"evaluation\s+passed", out)


@pytest.mark.skipif(not MINI.is_file(), reason="the real mini-swe-agent run is absent")
def test_show_a_real_imported_run(lake: dict) -> None:
    out = trajlake(lake["settings"], "show", lake["imported"])
    assert "django__django-11099" in out and re.search(r"run: \d+ model calls \((\d+) with messages\), 42 steps", out)
    assert "submitted patch" in out and "diff --git a/django/contrib/auth/validators.py" in out
    # each model call as sent and answered: the system prompt, the user's task, the reply's tool call
    first = out[out.index("model call 0") : out.index("model call 1")]
    assert re.search(r"^  system\n", first, re.M) and re.search(r"^  user\n", first, re.M)
    assert "UsernameValidator allows trailing newline" in first and "⇢ reply" in first
    assert re.search(r"→ bash\(command=", first)
    assert "messages sent before" in out and re.search(r"^  tool \[", out, re.M)  # later calls: what is new


def test_an_unknown_or_ambiguous_session_is_one_line(lake: dict) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env["TRAJLAKE_HOME"] = str(lake["settings"].home_path)
    for arg, needle in (("nosuchsession", "no session 'nosuchsession'"), ("", "several session ids")):
        result = subprocess.run(
            [sys.executable, "-m", "trajlake.cli", "show", arg], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 1 and needle in result.stderr and len(result.stderr.splitlines()) == 1


def test_the_report_escapes_everything_and_runs_no_script(lake: dict, tmp_path: Path) -> None:
    stats = write_report(Lakehouse.open(lake["settings"]), tmp_path / "report")
    pages = list((tmp_path / "report").rglob("*.html"))
    assert stats.sessions == len(pages) - 1 and stats.flagged >= len(lake["cheaters"])
    for page in pages:
        text = page.read_text()
        scripts = re.findall(r"<script[^>]*>", text, re.I)
        assert scripts == ([] if page.name != "index.html" else ['<script src="sessions/search.js">']), page
        assert "Content-Security-Policy" in text and "default-src 'none'" in text
    hostile = (tmp_path / "report" / "sessions" / page_name(lake["hostile"])).read_text()
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;" in hostile
    assert 'class="del">-    return max(hi, min(lo, x))' in hostile


def test_a_report_of_one_export_covers_its_sessions(lake: dict, tmp_path: Path) -> None:
    export = export_training_set(
        Lakehouse.open(lake["settings"]),
        "openai",
        tmp_path / "export",
        min_quality=0.0,
        filters=ExportFilters(origins=()),
    )
    stats = write_report(Lakehouse.open(lake["settings"]), tmp_path / "report", export_dir=tmp_path / "export")
    assert stats.sessions == export.records > 0
    index = (tmp_path / "report" / "index.html").read_text()
    assert f"export {export.export_id}" in index and "format <b>openai</b>" in index


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package chromium is not installed")
def test_a_person_reads_the_evidence_of_a_flagged_session_in_a_browser(lake: dict, tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright (dev extra) is not installed")
    report = tmp_path / "report"
    write_report(Lakehouse.open(lake["settings"]), report)
    shot = Path(os.environ.get("TRAJLAKE_REPORT_SCREENSHOT") or tmp_path / "report.png")
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 1400})
        dialogs: list[str] = []

        def refuse(dialog: Any) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", refuse)
        page.goto((report / "index.html").as_uri())
        # the overview: the pass-rate plot has one bar per task family in its table
        families = page.locator("#family-table tbody tr").count()
        assert families > 0 and page.locator("svg[aria-label='pass rate by task family'] rect.bar").count() == families
        assert page.locator("svg[aria-label='quality distribution'] rect.bin").count() == 20
        page.screenshot(path=str(shot))
        # click the first flagged session, as a person would
        page.locator("#flagged-sessions a.session").first.click()
        page.wait_for_load_state()
        assert "/sessions/" in page.url
        flags = page.locator(".flag").first
        assert flags.is_visible()  # the evidence is on screen without a click
        assert flags.locator(".dim").first.inner_text().split(",")[0] in {"security", "behavioural"}  # most severe
        evidence = flags.inner_text()
        assert "reason" in evidence and "step #" in evidence
        # follow the evidence to the step it names
        step_link = flags.locator("a[href^='#step-']").first
        target = step_link.get_attribute("href")
        step_link.click()
        step = page.locator(f"div{target}")
        assert step.is_visible() and "flagged" in (step.get_attribute("class") or "")
        # the hostile session's page shows its output as text and runs nothing
        page.goto((report / "sessions" / page_name(lake["hostile"])).as_uri())
        assert page.locator("pre.output", has_text=HOSTILE).count() == 1
        assert page.title() == f"session {lake['hostile']}" and dialogs == []
        browser.close()
    assert shot.stat().st_size > 10_000


def test_report_metadata_links_from_dagster(lake: dict, tmp_path: Path) -> None:
    """The nightly training set writes the report of its export and links it from the materialization."""
    from dagster_project.defs.quality import export_report

    opened = Lakehouse.open(lake["settings"])
    export = export_training_set(opened, "hf", tmp_path / "export", min_quality=0.0, filters=ExportFilters(origins=()))
    metadata = export_report(opened, Path(export.out_dir), "hf", "2026-12-02")
    index = Path(str(metadata["report_path"].value))
    assert index.is_file() and index.name == "index.html"
    assert metadata["report"].value == index.as_uri()


def _pty_run(settings: Settings, *args: str) -> str:
    """``trajlake ARGS`` on a pseudo-terminal of 140 columns (its pager: ``cat``): everything the terminal got."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 140, 0, 0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_") and k not in ("COLUMNS", "LINES")}
    env.update(TRAJLAKE_HOME=str(settings.home_path), TERM="xterm-256color", PAGER="cat")
    env.pop("NO_COLOR", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", *args], stdin=slave, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert process.wait(timeout=300) == 0
    return b"".join(chunks).decode("utf-8", "replace")


def test_show_on_a_terminal_pages_the_flag_evidence_and_sends_only_its_own_styles(lake: dict) -> None:
    from common.text import is_printable

    cheater = lake["cheaters"][0]
    screen = _pty_run(lake["settings"], "show", cheater)
    text = re.sub(r"\x1b\[[0-9;]*m", "", screen).replace("\r\n", "\n")  # rich's colours, the tty's line ends
    assert is_printable(text), sorted({c for c in text if not is_printable(c)})
    assert re.search(r"^⚑ \w+  (security|behavioural), (critical|high)", text, re.M)
    assert re.search(r"^    reason \S", text, re.M) and re.search(r"^    at step #\d+ ", text, re.M)
    assert text.index("⚑") < text.index("evaluation and scores") < text.index("run: ")
    hostile = _pty_run(lake["settings"], "show", lake["hostile"], "--full")
    assert "\x1b[2J" not in hostile and "\\x1b[2J" in hostile  # the output's escapes shown, not obeyed


@pytest.mark.skipif(not MINI.is_file(), reason="the real mini-swe-agent run is absent")
def test_show_on_a_terminal_shows_a_model_calls_prompt_and_reply(lake: dict) -> None:
    screen = re.sub(r"\x1b\[[0-9;]*m", "", _pty_run(lake["settings"], "show", lake["imported"])).replace("\r\n", "\n")
    call = screen[screen.index("model call 0") : screen.index("model call 1")]
    assert "system" in call and "You are a helpful assistant" in call  # the system prompt, collapsed
    assert "UsernameValidator allows trailing newline" in call  # the prompt as sent
    assert "⇢ reply" in call and "→ bash" in call  # the reply, its tool call as a call
    assert re.search(r"… \d+ more lines \(--full shows them\)", call)  # a cut that says so
