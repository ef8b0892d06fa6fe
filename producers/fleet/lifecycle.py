"""The session lifecycle in stages, shared by the fleets: prepare → run agent → judge → emit end.

A backend implements the stages on a state object of its own (``SessionStages``); ``run_staged``
runs them in order and then, whatever raised in whichever stage, the backend's ``cleanup``. So
what a session holds on the host (a sandbox and its processes, its writable layer, its egress
gateway, the task's secrets registered with the redactor) is released by one method that runs
in a ``finally``, never by the last lines of a stage that an exception can skip. ``cleanup``
therefore sees states in which any stage stopped half-way and releases only what was acquired.

The stages:

- ``prepare``: draw the task and the policy, acquire the session's resources, emit ``session_start``;
- ``run_agent``: let the agent act (its tool calls emit their own events) and end its phase;
- ``judge``: evaluate the deliverable and emit ``evaluation``;
- ``emit_end``: decide the status, emit ``session_end``, write the ground-truth label, and
  return the backend's record of the session.

``AgentRun`` is how the agent stage ended; ``session_status`` turns it into the ``session_end``
status and exit reason, the same way for every backend that runs real agents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from producers.fleet.agents import AgentOutcome

S = TypeVar("S")
R = TypeVar("R", covariant=True)
#: Longest ``exit_reason`` text of an error status (the reason string is free text from an exception).
MAX_EXIT_REASON = 200


class SessionStages(Protocol[S, R]):
    """One backend's stages of a session, on a state object ``S``; the session's record is ``R``."""

    def new_state(self) -> S:
        """The session's state before any stage ran (acquires nothing)."""
        ...

    def prepare(self, state: S) -> None:
        """Draw the task and policy, acquire the session's resources, emit ``session_start``."""
        ...

    def run_agent(self, state: S) -> None:
        """Let the agent act until it ends, is capped, raises or is reaped."""
        ...

    def judge(self, state: S) -> None:
        """Evaluate the deliverable; emit ``evaluation``."""
        ...

    def emit_end(self, state: S) -> R:
        """Emit ``session_end``, write the label; the session's record."""
        ...

    def cleanup(self, state: S) -> None:
        """Release whatever the stages acquired (also after a stage raised); must not raise itself."""
        ...


def run_staged(stages: SessionStages[S, R]) -> R:
    """Run one session's stages in order; ``cleanup`` always runs afterwards.

    Raises:
        Exception: whatever a stage raised (after ``cleanup``).
    """
    state = stages.new_state()
    try:
        stages.prepare(state)
        stages.run_agent(state)
        stages.judge(state)
        return stages.emit_end(state)
    finally:
        stages.cleanup(state)


@dataclass
class AgentRun:
    """How the agent stage ended.

    Attributes:
        outcome: the policy's own account (``None``: it never returned one).
        live: a live agent (``llm`` or a callable) rather than a scripted policy.
        reaped: the reaper killed the sandbox at its deadline.
        crashed: why the sandbox died under the agent (not reaped), or ``None``.
        cap: the cap the agent reached (``max_steps`` …), or ``None``.
        api_error: the model endpoint's error, or ``None``.
        api_error_kind: the exit reason's prefix for ``api_error``.
        host_limit: the host limit that ended the session (``disk_quota``, ``egress_monitor_failed``), or ``None``.
    """

    outcome: AgentOutcome | None = None
    live: bool = False
    reaped: bool = False
    crashed: str | None = None
    cap: str | None = None
    api_error: str | None = None
    api_error_kind: str = "model_api_error"
    host_limit: str | None = None


def session_status(run: AgentRun) -> tuple[str, str]:
    """The ``session_end`` status and exit reason of a session whose agent stage ended as ``run``."""
    if run.cap is not None:  # the agent stopped at its cap (the reaper may have come after)
        return "capped", run.cap
    if run.host_limit is not None:  # the sandbox reached a host limit: the session ends there
        return "failed", run.host_limit
    if run.reaped:
        return "timeout", "reaper"
    if run.api_error is not None:
        return "error", f"{run.api_error_kind}: {run.api_error}"[:MAX_EXIT_REASON]
    outcome = run.outcome
    if outcome is not None and outcome.status == "failed" and run.live:
        return "failed", "agent_raised"
    if run.crashed is not None or outcome is None:
        return "error", f"sandbox died: {run.crashed}"[:MAX_EXIT_REASON]
    return outcome.status, "agent_finished" if outcome.status == "completed" else outcome.status
