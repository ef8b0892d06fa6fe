"""The own-agent example of docs/fleet.md, saved where the README says (``my_agent.py`` in the checkout),
passes the project's lint: ``bash scripts/test.sh`` runs ``ruff check .`` and ``ruff format --check .`` over
the checkout before any test, so a newcomer's saved example must not stop the fast tier.
(tests/trajlake/test_readme.py runs the example as an agent.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = Path(sys.executable).with_name("ruff")


def _example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "fleet.md").read_text(), re.M | re.S)
    return next(block for block in blocks if block.startswith("# my_agent.py"))


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_the_saved_example_passes_ruff_as_the_fast_tier_runs_it(command: list[str]) -> None:
    ruff = str(RUFF) if RUFF.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff (dev extra) is not installed")
    done = subprocess.run(
        [ruff, *command, "--stdin-filename", str(ROOT / "my_agent.py"), "-"],
        input=_example(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
