"""``trajlake ui`` serves the Dagster UI on our definitions; a real headless Chromium renders it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from common.broker import free_port

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


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


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package chromium is not installed")
def test_ui_renders_the_asset_graph(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env["TRAJLAKE_HOME"] = str(tmp_path / "home")
    log = open(tmp_path / "ui.log", "wb")
    ui = subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", "ui", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/server_info", 180, ui)
        dom = subprocess.run(
            [
                str(CHROMIUM),  # not None: the test is skipped without Chromium
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp_path / 'chromium'}",
                "--virtual-time-budget=30000",
                "--dump-dom",
                f"http://127.0.0.1:{port}/assets",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(30)
        log.close()
    for asset in ("raw_events", "trajectories", "steps"):
        assert asset in dom, f"{asset} not rendered; ui log:\n{(tmp_path / 'ui.log').read_text()[-2000:]}"
    assert (tmp_path / "home" / "dagster").is_dir()  # DAGSTER_HOME under TRAJLAKE_HOME
