"""A session that fails anywhere after its secrets are registered leaves nothing behind.

Real local sessions with a failure injected at one point each: the repository set-up, the agent
(a scripted policy's own bug, after it started a background process), the event sink (at the
evaluation, at the session's end), the deliverable's collection, the evaluation. Afterwards the
task's secret is no longer registered with the redactor, the sandbox's processes are gone (its
PID namespace and cgroup are empty, no process carries the marker command), its writable layer
and its egress gateway are gone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from producers import redact
from producers.fleet import ListSink, agents, local_session, run_fleet
from producers.fleet.agents import AgentOutcome
from producers.fleet.sandbox import bwrap_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable")

MARKER = "4242.125"  # ``sleep 4242.125``: a background process only this test starts


class Injected(RuntimeError):
    """The failure the test injects."""


def _marked_processes() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if MARKER.encode() in cmdline:
                found.append(int(entry))
    return found


def _background_then(fail: bool):
    def policy(ctx):
        ctx.bash(f"(setsid sleep {MARKER} > /dev/null 2>&1 &) ; echo started", "Leave a process running.")
        ctx.write_file("notes.txt", "kept\n", "A file in the layer.")
        if fail:
            raise Injected("the policy's own bug")
        return AgentOutcome("completed", "fail")

    return policy


class FailingSink(ListSink):
    """Raises when it is handed an event of one type."""

    def __init__(self, event_type: str) -> None:
        super().__init__()
        self.event_type = event_type

    def emit(self, event):
        if event["event_type"] == self.event_type:
            raise Injected(f"the sink refused {self.event_type}")
        return super().emit(event)


def _raise(*args, **kwargs):
    raise Injected("injected")


@pytest.mark.parametrize("where", ["repository", "agent", "sink_evaluation", "sink_end", "collect", "evaluate"])
def test_a_failure_anywhere_leaves_no_secret_sandbox_or_process(where, settings, monkeypatch):
    registered: list[str] = []
    real_register = local_session.register_secret_values

    def register(values):
        values = list(values)
        registered.extend(values)
        real_register(values)

    created = []
    real_sandbox = local_session.Sandbox

    def sandbox(*args, **kwargs):
        box = real_sandbox(*args, **kwargs)
        created.append(box)
        return box

    monkeypatch.setattr(local_session, "register_secret_values", register)
    monkeypatch.setattr(local_session, "Sandbox", sandbox)
    monkeypatch.setitem(agents.POLICIES, "leave_and_fail", _background_then(where == "agent"))
    sink = ListSink()
    if where == "repository":
        monkeypatch.setattr(local_session, "init_repository", _raise)
    elif where == "sink_evaluation":
        sink = FailingSink("evaluation")
    elif where == "sink_end":
        sink = FailingSink("session_end")
    elif where == "collect":
        monkeypatch.setattr(local_session, "collect_changes", _raise)
    elif where == "evaluate":
        monkeypatch.setattr(local_session, "evaluate", _raise)

    with pytest.raises(Injected):
        run_fleet(settings, "local", 1, seed=4, sink=sink, policy_mix={"leave_and_fail": 1.0}, timeout_s=60)

    assert len(registered) == 1 and registered[0] not in redact._secret_values
    assert created, "a sandbox was created before the failure"
    for box in created:
        assert box.survivors() == 0
        assert not box.dir.exists()
        assert not box.gateway._thread.is_alive()
        assert not box.cgroup.pids()
    assert _marked_processes() == []
    assert list((settings.home_dir / "fleet" / "sandboxes").iterdir()) == []
