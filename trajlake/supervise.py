"""Run a long-lived child process tree (``trajlake ui``'s ``dagster dev``) and own all of it.

``dagster dev`` starts a webserver, a daemon and code servers, which start gRPC servers of
their own. Stopping only the first process leaves the others running (holding the port,
launching runs), so the supervisor:

- becomes a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): a descendant whose parent
  exits is re-parented to it rather than to PID 1, so it can still be found and stopped;
- starts the child in a session of its own and asks the kernel to send it SIGTERM should the
  supervisor die without cleaning up (``PR_SET_PDEATHSIG``);
- forwards SIGTERM, SIGINT and SIGHUP as SIGINT to the child's process group (Dagster's
  graceful stop is its Ctrl-C path), and once the child has exited, or ``grace_s`` after the
  first signal, stops every remaining descendant: SIGTERM, then SIGKILL after ``grace_s``;
- reaps them all before returning, so no zombie of the tree outlives it.

Descendants are found through ``/proc`` (parent pids), whatever process group or session they
put themselves in. Elsewhere than Linux only the child's process group is signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)``; False where it is unavailable (not Linux) or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children first), read from ``/proc``; empty off Linux."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not Path("/proc").is_dir()
    return stat[stat.rfind(")") + 2 :].split()[:1] != ["Z"]


def _signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _reap() -> None:
    """Collect every exited child (re-parented orphans included) without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """Stop ``child`` and everything below the supervisor: SIGTERM, then SIGKILL after ``grace_s``."""
    me = os.getpid()
    deadline = time.monotonic() + grace_s
    targets = descendants(me)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGTERM)  # the group, also where /proc is unavailable
    _signal_all(targets, signal.SIGTERM)
    while time.monotonic() < deadline:
        _reap()
        targets = descendants(me)
        if not targets:
            break
        _signal_all(targets, signal.SIGTERM)  # late starters too
        time.sleep(0.1)
    for _ in range(10):  # SIGKILL whatever is left, including anything a dying process started
        targets = descendants(me)
        if not targets:
            break
        _signal_all(targets, signal.SIGKILL)
        time.sleep(0.05)
        _reap()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=1)
    _reap()


def run_supervised(
    command: Sequence[str],
    env: Mapping[str, str],
    grace_s: float,
    on_signal: Callable[[int], None] | None = None,
) -> int:
    """Run ``command`` until it exits or a stop signal arrives; leave no process of its tree behind.

    Args:
        command: the child's argv.
        env: its environment.
        grace_s: how long a graceful stop may take before SIGKILL (each of the two phases).
        on_signal: told of each stop signal received (e.g. to print that the stop began).

    Returns:
        The child's exit code, or 128 + the number of the first stop signal received.

    Raises:
        OSError: the command cannot be started.
    """
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    received: list[tuple[int, float]] = []  # (signal, when)

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append((signum, time.monotonic()))
        if on_signal is not None:
            on_signal(signum)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGINT)

    previous = {signum: signal.getsignal(signum) for signum in FORWARDED}
    child = subprocess.Popen(list(command), env=dict(env), start_new_session=True, preexec_fn=_die_with_parent)
    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        while child.poll() is None:
            if received and time.monotonic() - received[0][1] > grace_s:
                break  # the graceful stop takes too long: stop_tree terminates, then kills
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.2)
    finally:
        for signum in FORWARDED:  # a second signal now must not interrupt the clean-up
            signal.signal(signum, signal.SIG_IGN)
        stop_tree(child, grace_s)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        return 128 + received[0][0]
    return child.returncode if child.returncode is not None else 1
