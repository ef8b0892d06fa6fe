"""The README's commands run as written, in a fresh directory, in the order a newcomer types them.

Each line of the fenced ``bash`` blocks of "Your first hour" runs through ``bash -c`` in an empty
directory holding only a ``.venv`` link to this interpreter's environment (the README's install
line made it), with no ``TRAJLAKE_*`` variable set, so ``TRAJLAKE_HOME`` is the default
``./.trajlake``. The one override: ``TRAJLAKE_UI_PORT`` points ``trajlake ui`` at a free port (3000
may be taken on a shared machine); the ``ui`` line is started, waited for, then stopped with SIGTERM.
``my_agent.py`` is the example of docs/fleet.md, saved as that section says; the scripted test model
of docs/fleet.md is started as documented there, on a free port instead of 8000.
The install line itself and ``scripts/test.sh`` are not run here: the suite runs inside what they made.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.broker import free_port

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FLEET_DOC = (ROOT / "docs" / "fleet.md").read_text()
VENV = Path(sys.executable).parent.parent

pytestmark = [
    pytest.mark.integration,
    pytest.mark.e2e,
    pytest.mark.skipif(not (VENV / "bin" / "trajlake").exists(), reason="trajlake is not installed in this venv"),
]


def section(text: str, heading: str) -> str:
    """The text under a ``## heading`` up to the next heading of that level."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def fenced(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in ``text``."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def lines_of(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture
def newcomer(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """An empty working directory with the README's ``.venv``, and the environment of a fresh shell."""
    work = tmp_path / "clone"
    work.mkdir()
    (work / ".venv").symlink_to(VENV)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(TRAJLAKE_UI_PORT=str(free_port()), COLUMNS="160")
    try:
        yield work, env
    finally:  # whatever happened, no broker outlives the test
        subprocess.run([str(VENV / "bin" / "trajlake"), "broker", "stop"], cwd=work, env=env, timeout=60)


def run_line(line: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{line}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def run_ui(line: str, work: Path, env: dict[str, str]) -> None:
    """Start the ``ui`` line, wait until it answers, stop it as Ctrl-C would."""
    process = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=work, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{env['TRAJLAKE_UI_PORT']}/server_info"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, f"{line} exited with {process.returncode}"
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"{url} did not answer"
                time.sleep(1)
        process.send_signal(signal.SIGINT)
        assert process.wait(120) == 128 + signal.SIGINT
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_the_first_hour_runs_as_written(newcomer: tuple[Path, dict[str, str]]) -> None:
    work, env = newcomer
    first_hour = section(README, "Your first hour")
    blocks = fenced(first_hour, "bash")
    assert len(blocks) == 2, "the first hour has its walk-through block and the own-agent block"
    outputs: dict[str, str] = {}
    for line in lines_of(blocks[0]):
        if re.search(r"trajlake ui\b", line):
            run_ui(line, work, env)
            outputs["ui"] = "served"
            continue
        result = run_line(line, work, env)
        outputs[line.split()[1]] = result.stdout + result.stderr
    # the demo says where it put the lakehouse, what to run next, and that it left the broker running
    assert f"lakehouse: {work / '.trajlake'} (TRAJLAKE_HOME, new)" in outputs["demo"]
    assert "Next:" in outputs["demo"] and "trajlake show --flagged" in outputs["demo"]
    assert "The embedded broker is still running" in outputs["demo"]
    assert "flags (" in outputs["show"] and "evidence" in outputs["show"] and "run: " in outputs["show"]
    assert (work / "trajlake-report" / "index.html").is_file()
    assert (work / "trajlake-sft" / "manifest.json").is_file()
    assert outputs["broker"].strip() == "stopped"

    # Your own agent: the example of docs/fleet.md, saved as my_agent.py, on the second block.
    agent = next(block for block in fenced(FLEET_DOC, "python") if block.startswith("# my_agent.py"))
    (work / "my_agent.py").write_text(agent)
    results = [run_line(line, work, env) for line in lines_of(blocks[1])]
    fleet = next(r.stdout for r in results if "fleet[local]" in r.stdout)
    assert re.search(r"passed evaluation +4 of 4", fleet), fleet
    table = results[-1].stdout
    assert table.count("True") == 4 and "bugfix." in table, table


def test_the_documented_test_model_serves_an_llm_agent(newcomer: tuple[Path, dict[str, str]]) -> None:
    """docs/fleet.md: `trajlake fleet test-model` started as written (on a free port), then the run it documents."""
    work, env = newcomer
    block = next(b for b in fenced(FLEET_DOC, "bash") if "fleet test-model" in b)
    serve, run, stop = (re.sub(r"\s+#.*$", "", line) for line in lines_of(block))  # no quotes in these lines
    assert serve.endswith("&") and stop == "kill %1"
    port = str(free_port())
    run_line(".venv/bin/trajlake broker start", work, env)
    server = subprocess.Popen(
        ["bash", "-c", "exec " + serve.rstrip("& ").replace("8000", port)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == f"http://127.0.0.1:{port}/v1"  # it says where it listens
        fleet = run_line(run.replace("8000", port), work, env).stdout
        assert re.search(r"passed evaluation +4 of 4", fleet), fleet
    finally:
        server.send_signal(signal.SIGTERM)  # what `kill %1` sends
        assert server.wait(30) == 0
