"""``trajlake bench fuzz``: the suite's fuzzers (tests marked ``fuzz``) under a long Hypothesis budget.

In CI the same tests run under the bounded, derandomized ``ci`` profile (``tests/conftest.py``), so a
red build is reproducible; this command runs them under the ``fuzz`` profile — random seeds and many
more examples per test — so new inputs are explored. Every failure it finds is printed with the
example Hypothesis shrank it to, which becomes a regression test (an ``@example`` or a test of its own).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from common.errors import TrajlakeError

TESTS = Path(__file__).resolve().parents[1] / "tests"


class FuzzSetupError(TrajlakeError):
    """The fuzzers cannot run here (no test tree beside the installed package)."""


def run_fuzzers(examples: int, select: str | None = None, workers: int = 0) -> int:
    """Run every ``fuzz``-marked test with ``examples`` examples each and return pytest's exit code.

    Args:
        examples: Hypothesis examples per fuzz test (the CI profile uses far fewer).
        select: optional pytest ``-k`` expression choosing fuzzers by name.
        workers: pytest-xdist workers (0: in this process's one).

    Raises:
        FuzzSetupError: the test tree is not beside the package (a wheel install, not a checkout).
    """
    if not (TESTS / "conftest.py").is_file():
        raise FuzzSetupError(f"no test tree at {TESTS}: trajlake bench fuzz runs from a source checkout")
    command = [sys.executable, "-m", "pytest", str(TESTS), "-m", "fuzz", "-q", "-p", "no:cacheprovider"]
    command += ["--hypothesis-profile=fuzz", "--hypothesis-show-statistics"]
    if select:
        command += ["-k", select]
    if workers:
        command += ["-n", str(workers)]
    env = {**os.environ, "TRAJLAKE_FUZZ_EXAMPLES": str(examples)}
    started = time.monotonic()
    code = subprocess.call(command, env=env, cwd=TESTS.parent)
    print(f"fuzzers: {examples} examples per test, {time.monotonic() - started:.0f} s, pytest exit code {code}")
    return code
