"""The Dagster UI as a person uses it, in a real headless Chromium driven by Playwright.

``trajlake ui`` serves the definitions; the test opens the asset graph, launches a
materialization by clicking, waits for it, and reads a check result and its metadata plot.
Stopping it is tested as a process manager stops it: SIGTERM to the ``trajlake ui`` process alone
must end every Dagster process it started. Set ``TRAJLAKE_UI_SCREENSHOTS=DIR`` to keep the screenshots
(docs/operations.md shows the ones made here).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from common.broker import free_port
from common.settings import load_settings
from tests.helpers import sample_events, write_raw
from trajlake.supervise import alive, descendants

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright (dev extra) is not installed")


def _wait_http(url: str, timeout: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"trajlake ui exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s")


@contextmanager
def running_ui(tmp_path: Path, stop_grace_s: float | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``trajlake ui`` on a lakehouse holding ten sessions of raw events; yields its base URL and process.

    It is stopped as a process manager stops it: SIGTERM to the ``trajlake ui`` process alone.
    """
    home = tmp_path / "home"
    write_raw(load_settings(home=home), sample_events(10))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(TRAJLAKE_HOME=str(home))
    if stop_grace_s is not None:  # None: the default
        env["TRAJLAKE_UI_STOP_TIMEOUT_S"] = str(stop_grace_s)
    log_path = tmp_path / "ui.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "trajlake.cli", "ui", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # only so that the clean-up below can reach a tree the test failed to stop
        )
        try:
            _wait_http(f"http://127.0.0.1:{port}/server_info", 180, process)
            yield f"http://127.0.0.1:{port}", process
        except BaseException:
            print(log_path.read_text()[-3000:])
            raise
        finally:
            tree = descendants(process.pid)
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(2 * (stop_grace_s or 20.0) + 60)
                except subprocess.TimeoutExpired:
                    pass
            for pid in [process.pid, *tree]:  # whatever a failed stop left behind
                if alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
    assert (home / "dagster").is_dir()  # DAGSTER_HOME under TRAJLAKE_HOME


def _runs_launched(ui: str) -> int:
    """How many runs the Dagster instance behind ``ui`` has (its GraphQL API, as the UI's own pages ask it)."""
    query = b'{"query": "{ runsOrError { ... on Runs { results { runId } } } }"}'
    request = urllib.request.Request(f"{ui}/graphql", data=query, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return len(json.load(response)["data"]["runsOrError"]["results"])


def _dialog_text(page: Any) -> str:
    """The text of whatever dialog is open (for the failure message), or ``""``."""
    dialogs = page.get_by_role("dialog")
    return " | ".join(dialogs.nth(i).inner_text()[:300] for i in range(dialogs.count()))


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[str]:
    """The base URL of a running ``trajlake ui`` (see :func:`running_ui`)."""
    with running_ui(tmp_path) as (url, _):
        yield url


def _status_with_host(url: str, host: str) -> int:
    """The status ``GET url`` answers with this ``Host`` header (a DNS-rebinding page sends its own name)."""
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_ui_answers_its_own_host_names_only_and_sigterm_stops_every_dagster_process_within_5_s(
    tmp_path: Path,
) -> None:
    with running_ui(tmp_path) as (url, process):
        port = url.rsplit(":", 1)[1]
        for own in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
            assert _status_with_host(f"{url}/server_info", own) == 200, own
        for foreign in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            assert _status_with_host(f"{url}/server_info", foreign) == 400, foreign
            assert _status_with_host(f"{url}/graphql", foreign) == 400, foreign
        deadline = time.monotonic() + 120
        while len(tree := descendants(process.pid)) < 4:  # dagster dev, webserver, daemon, code server(s)
            assert time.monotonic() < deadline, f"Dagster started {len(tree)} processes"
            time.sleep(1)
        tree = descendants(process.pid)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)  # to trajlake ui alone: not its process group
        process.wait(60)
        took = time.monotonic() - sent
        survivors = [pid for pid in tree if alive(pid)]
        assert survivors == [], f"{len(survivors)} of {len(tree)} Dagster processes outlived trajlake ui"
        assert process.returncode == 128 + signal.SIGTERM
        assert took < 5, f"trajlake ui took {took:.1f} s to stop"  # the default TRAJLAKE_UI_STOP_TIMEOUT_S
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/server_info", timeout=5)
    log = (tmp_path / "ui.log").read_text()
    for noise in ("superseded", "Telemetry", "No dagster instance configuration file"):
        assert noise not in log, f"{noise!r} in the console:\n{log[-2000:]}"


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package chromium is not installed")
def test_a_person_materializes_an_asset_and_reads_its_check(ui: str, tmp_path: Path) -> None:
    shots = Path(os.environ.get("TRAJLAKE_UI_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(60_000)
        # Dagster's one-time newsletter dialog can open at any moment and cover what a person clicks next:
        # dismissed whenever it is in the way, as a person would
        skip = page.get_by_role("button", name="Skip")
        page.add_locator_handler(skip, lambda: skip.click())

        # The asset graph of the lakehouse group.
        page.goto(f"{ui}/locations/dagster_project.definitions/asset-groups/lakehouse", wait_until="networkidle")
        for asset in ("event_topic", "raw_events", "trajectories", "steps"):
            page.get_by_text(asset, exact=True).first.wait_for()
        page.screenshot(path=str(shots / "asset-graph.png"))

        # Launch a materialization of trajectories by clicking, confirming what the UI asks.
        page.goto(f"{ui}/assets/trajectories", wait_until="networkidle")
        page.wait_for_timeout(1_000)
        page.locator("button:has-text('Materialize')").first.click()
        # The UI asks zero or more questions ("also materializes steps", "raw_events never materialized"), each
        # after a server round trip that a loaded machine slows down: confirm each one as it comes, until the run
        # exists and no dialog is left covering the page.
        confirm = page.get_by_role("button", name="Confirm")
        deadline = time.monotonic() + 120
        while True:
            if confirm.count() and confirm.first.is_visible():
                confirm.first.click()
            elif _runs_launched(ui) and not page.locator(".bp5-overlay-backdrop").count():
                break
            if time.monotonic() > deadline:
                page.screenshot(path=str(shots / "timeout.png"))
                raise AssertionError(f"no run launched within 120 s of clicking Materialize ({_dialog_text(page)!r})")
            page.wait_for_timeout(500)
        page.screenshot(path=str(shots / "launched.png"))

        # Wait for it: the materialization's metadata appears on the Events tab.
        page.locator("a:has-text('Events')").first.click()
        deadline = time.monotonic() + 90
        while not page.get_by_text("sessions_updated").count():
            if time.monotonic() > deadline:
                page.screenshot(path=str(shots / "timeout.png"))
                raise AssertionError("the clicked materialization did not finish within 90 s")
            page.wait_for_timeout(1_000)
            page.reload(wait_until="networkidle")
        page.get_by_text("Materialized in run").first.wait_for()
        assert page.get_by_text('"completed"').count() or page.get_by_text("completed").count()

        # Its checks ran after it; read one result and its metadata plot.
        page.locator("a:has-text('Checks')").first.click()
        page.get_by_text("sequence_gaps").first.wait_for()
        deadline = time.monotonic() + 120
        while not page.get_by_text("Passed", exact=True).count():
            if time.monotonic() > deadline:
                page.screenshot(path=str(shots / "timeout.png"), full_page=True)
                raise AssertionError("the check result did not appear within 120 s")
            page.wait_for_timeout(1_000)
            page.reload(wait_until="networkidle")
        page.get_by_text("Plots", exact=True).first.wait_for()
        page.get_by_text("closed_sessions").first.wait_for()
        assert page.get_by_text("sessions_with_gaps").count()
        page.screenshot(path=str(shots / "asset-checks.png"), full_page=True)
        browser.close()
    # The figure docs/performance.md quotes (clicks through one materialization); not asserted: the machine is shared.
    print(f"ui walk-through took {time.monotonic() - started:.1f} s")
