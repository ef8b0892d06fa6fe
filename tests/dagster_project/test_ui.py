"""The Dagster UI as a person uses it, in a real headless Chromium driven by Playwright.

``trajlake ui`` serves the definitions; the test opens the asset graph, launches a
materialization by clicking, waits for it, and reads a check result and its metadata plot.
Set ``TRAJLAKE_UI_SCREENSHOTS=DIR`` to keep the screenshots (docs/operations.md shows the ones made here).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.broker import free_port
from common.settings import load_settings
from tests.helpers import sample_events, write_raw

pytestmark = pytest.mark.integration

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


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[str]:
    """``trajlake ui`` on a lakehouse holding ten sessions of raw events; yields its base URL."""
    home = tmp_path / "home"
    write_raw(load_settings(home=home), sample_events(10))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env["TRAJLAKE_HOME"] = str(home)
    log_path = tmp_path / "ui.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "trajlake.cli", "ui", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_http(f"http://127.0.0.1:{port}/server_info", 180, process)
            yield f"http://127.0.0.1:{port}"
        except BaseException:
            print(log_path.read_text()[-3000:])
            raise
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:  # a loaded machine: Dagster's graceful stop can take longer
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
    assert (home / "dagster").is_dir()  # DAGSTER_HOME under TRAJLAKE_HOME


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
        for attempt in range(3):  # "also materializes steps", "raw_events never materialized"
            try:
                page.get_by_role("button", name="Confirm").click(timeout=30_000 if attempt == 0 else 10_000)
            except playwright.TimeoutError:
                break
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
