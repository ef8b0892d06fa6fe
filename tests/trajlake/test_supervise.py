"""``trajlake ui`` owns its process tree: a stop signal to it alone leaves nothing of the tree running.

The mechanism is tested on a small tree of real processes built to be hard to stop: one ignores
SIGINT and SIGTERM, one escapes into a session of its own and double-forks so that its parent is
gone. The real thing (Dagster's five processes) is in tests/dagster_project/test_ui.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trajlake.supervise import alive, descendants

TREE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    pids = sys.argv[1]

    def record(pid):
        with open(pids, "a") as f:
            f.write(f"{pid}\\n")

    if len(sys.argv) > 2 and sys.argv[2] == "stubborn":  # ignores the polite signals
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        record(os.getpid())
        while True:
            time.sleep(1)
    if len(sys.argv) > 2 and sys.argv[2] == "escape":  # its own session, then orphaned by a double fork
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                record(os.getpid())
                while True:
                    time.sleep(1)
            os._exit(0)
        os.wait()
        record(os.getpid())
        while True:
            time.sleep(1)
    record(os.getpid())
    for kind in ("stubborn", "escape"):
        subprocess.Popen([sys.executable, __file__, pids, kind])
    while True:
        time.sleep(1)
    """
)


def _supervisor(tmp_path: Path, grace_s: float) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    pids = tmp_path / "pids"
    code = (
        "import os, sys\nfrom trajlake.supervise import run_supervised\n"
        f"sys.exit(run_supervised([sys.executable, {str(script)!r}, {str(pids)!r}], os.environ, grace_s={grace_s}))"
    )
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if pids.exists() and len(pids.read_text().split()) >= 4:  # tree, stubborn, escape, escaped grandchild
            return process, pids
        time.sleep(0.1)
    process.kill()
    raise AssertionError("the test tree did not start")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_to_the_supervisor_alone_ends_the_whole_tree(tmp_path: Path, signum: int) -> None:
    grace = 1.0
    process, pids_file = _supervisor(tmp_path, grace)
    pids = [int(p) for p in pids_file.read_text().split()]
    try:
        below = set(descendants(process.pid))
        assert set(pids) <= below, (pids, below)  # the escaped one too: the supervisor is its subreaper
        sent = time.monotonic()
        os.kill(process.pid, signum)  # the supervisor alone, as `kill PID` or a process manager does
        process.wait(timeout=30)
        took = time.monotonic() - sent
        assert [pid for pid in pids if alive(pid)] == []
        assert process.returncode == 128 + signum
        assert took < 2 * grace + 5  # graceful, then terminate, then kill: bounded
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_a_child_that_exits_by_itself_takes_its_leftovers_with_it(tmp_path: Path) -> None:
    script = tmp_path / "leave.py"
    pid_file = tmp_path / "left"
    script.write_text(
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "sys.exit(3)\n"
    )
    code = (
        "import os, sys\nfrom trajlake.supervise import run_supervised\n"
        f"sys.exit(run_supervised([sys.executable, {str(script)!r}], os.environ, grace_s=1))"
    )
    result = subprocess.run([sys.executable, "-c", code], timeout=60)
    left = int(pid_file.read_text())
    assert result.returncode == 3  # the child's own exit code
    assert not alive(left)
