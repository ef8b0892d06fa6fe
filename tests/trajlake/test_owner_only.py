"""Files under TRAJLAKE_HOME and exports are owner-only (issue 18, part 7)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _trajlake(*args: str, env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trajlake.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"trajlake {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"


def _shared(root: Path) -> list[str]:
    """Paths under ``root`` that a group or other user may read, write or enter."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            found.append(f"{oct(stat.S_IMODE(mode))} {path}")
    return found


@pytest.mark.slow
def test_home_and_export_are_owner_only(tmp_path: Path, tansu_broker: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    suffix = tmp_path.name[-12:]
    env.update(
        TRAJLAKE_HOME=str(tmp_path / "home"),
        TRAJLAKE_KAFKA_BOOTSTRAP=tansu_broker,
        TRAJLAKE_TOPIC=f"owner-{suffix}",
        TRAJLAKE_CONSUMER_GROUP=f"owner-{suffix}",
    )
    previous = os.umask(0o022)  # the usual default: the CLI must not depend on the caller's umask
    try:
        _trajlake("demo", "--sessions", "20", "--local-sessions", "0", "--seed", "5", env=env)
        _trajlake(
            "export", "--format", "hf", "--origin", "all", "--out", str(tmp_path / "out"), "--min-quality", "0", env=env
        )
    finally:
        os.umask(previous)
    home, out = tmp_path / "home", tmp_path / "out"
    assert sum(1 for p in home.rglob("*.parquet")) > 0 and any(out.iterdir())
    assert _shared(home) == []
    assert _shared(out) == []
