"""Named crash points: ``TRAJLAKE_FAULT`` kills a process at the N-th pass of a point, never elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a run that passes a, b, a, b, a and prints each point before reaching it
RUN = (
    "from common.faults import crash_point\n"
    "for name in 'ababa':\n"
    "    print(name, flush=True)\n"
    "    crash_point(name)\n"
    "print('end', flush=True)\n"
)


def _run(fault: str | None) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRAJLAKE_FAULT", None)
    if fault is not None:
        env["TRAJLAKE_FAULT"] = fault
    done = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout.replace("\n", "")


@pytest.mark.parametrize(
    ("fault", "returncode", "reached"),
    [
        (None, 0, "ababaend"),
        ("", 0, "ababaend"),
        ("a", -signal.SIGKILL, "a"),
        ("b", -signal.SIGKILL, "ab"),
        ("a@3", -signal.SIGKILL, "ababa"),
        ("b@2", -signal.SIGKILL, "abab"),
        ("*@3", -signal.SIGKILL, "aba"),
        ("*@5", -signal.SIGKILL, "ababa"),
        ("*@6", 0, "ababaend"),  # past the last point: the run finishes
        ("b@3", 0, "ababaend"),
        ("c", 0, "ababaend"),
        ("a@0", 0, "ababaend"),  # malformed counts arm nothing
        ("a@x", 0, "ababaend"),
    ],
)
def test_the_process_dies_exactly_at_the_armed_pass(fault: str | None, returncode: int, reached: str) -> None:
    assert _run(fault) == (returncode, reached)
