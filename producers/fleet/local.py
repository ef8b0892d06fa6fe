"""The local fleet backend: real bubblewrap sandboxes, scripted agents, two-phase evaluation.

``LocalFleet.run`` runs sessions on a thread pool; each session runs in stages
(``producers.fleet.local_session``: prepare → run agent → judge → emit end, then cleanup in a
``finally``): draw a task instance and a policy from the seed, create a sandbox from the task
type's pinned read-only image with a private writable layer, let the agent act, evaluate only
the deliverable in a fresh sandbox, emit the events and write the ground-truth label.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.progress import Progress, ProgressCounter
from producers.fleet.agent_api import AgentSession, AgentSpec, resolve_agent
from producers.fleet.agent_caps import Caps
from producers.fleet.agents import AgentContext, cheat_type
from producers.fleet.bounds import EventBounds
from producers.fleet.lifecycle import run_staged
from producers.fleet.local_session import (
    AGENT_NAME,
    AGENT_VERSION,
    LocalStages,
    SessionPlan,
    SessionRecord,
    group_plans,
)
from producers.fleet.perturb import Perturbation
from producers.fleet.report import FleetReport, LabelWriter, percentiles
from producers.fleet.sandbox import ImageStore, Limits, Reaper, image_tools
from producers.fleet.sandbox.quota import sweep_stale
from producers.fleet.sinks import EventSink
from producers.fleet.tasks import TaskInstance

if TYPE_CHECKING:
    from common.settings import Settings

__all__ = ["AGENT_NAME", "AGENT_VERSION", "LocalFleet", "SessionPlan", "SessionRecord", "group_plans", "host_limits"]


def host_limits(settings: Settings) -> tuple[Limits, EventBounds]:
    """The sandbox limits (disk quota, scan bounds) and event bounds ``settings`` configure."""
    limits = Limits(
        disk_quota=settings.sandbox_disk_quota,
        disk_bytes=settings.sandbox_disk_bytes,
        disk_inodes=settings.sandbox_disk_inodes,
        tmp_bytes=settings.sandbox_tmp_bytes,
        scan_entries=settings.sandbox_scan_entries,
        scan_seconds=settings.sandbox_scan_seconds,
        hash_bytes=settings.sandbox_hash_bytes,
    )
    bounds = EventBounds(settings.sandbox_file_ops_per_command, settings.sandbox_events_per_session)
    return limits, bounds


class LocalFleet:
    """Bubblewrap sandboxes on this machine.

    Args:
        root: state directory (``TRAJLAKE_HOME/fleet``): images and sandbox layers.
        perturb: environment perturbation.
        timeout_s: deadline override for every session (default: the task's).
        policy_mix: explicit policy weights (default: ``choose_policy``'s mix).
        host_id: recorded in every event.
        limits: resource limits (the deadline comes from ``timeout_s`` or the task).
        agent: ``--agent`` (a built-in policy, ``llm``, ``module:callable``, ``file.py:callable``);
            ``None`` draws scripted policies from the mix.
        llm: the LLM agent's endpoint and sampling (required with ``agent='llm'``).
        caps: per-session caps (steps, model tokens, cost); a live agent also stops at its deadline.
        group_size: attempts of each task instance (a rollout group with one ``group_id``).
        bounds: events per command and per session (``producers.fleet.bounds``).

    Raises:
        BubblewrapMissing: ``bwrap`` is not installed.
    """

    name = "local"

    def __init__(
        self,
        root: Path,
        perturb: Perturbation | None = None,
        timeout_s: float | None = None,
        policy_mix: dict[str, float] | None = None,
        host_id: str | None = None,
        limits: Limits | None = None,
        agent: str | None = None,
        llm: Any = None,
        caps: Caps | None = None,
        group_size: int = 1,
        bounds: EventBounds | None = None,
    ) -> None:
        from producers.fleet.llm.record import ContentStore
        from producers.fleet.sandbox import find_bwrap

        find_bwrap()
        self.root = root
        self.images = ImageStore(root / "images")
        self.sandbox_root = root / "sandboxes"
        self.sandbox_root.mkdir(parents=True, exist_ok=True)
        sweep_stale(self.sandbox_root)  # layers a crashed host left mounted
        self.perturb = perturb or Perturbation()
        self.timeout_s = timeout_s
        self.policy_mix = policy_mix
        self.host_id = host_id or f"local-{socket.gethostname()}"
        self.limits = limits or Limits()
        self.bounds = bounds or EventBounds()
        self.runner = image_tools()["bin/tl_test.py"].decode()
        self.agent: AgentSpec | None = resolve_agent(agent) if agent else None
        self.llm = llm
        if self.agent is not None and self.agent.kind == "llm" and llm is None:
            from producers.errors import AgentSpecError

            raise AgentSpecError("--agent llm needs --model-endpoint and --model")
        self.caps = caps or Caps()
        if group_size < 1:
            raise ValueError(f"group size must be at least 1, got {group_size}")
        self.group_size = group_size
        self.store = ContentStore()  # one per fleet: content any of its sessions sent is stored once

    def image_for(self, task: TaskInstance) -> Path:
        """The pinned read-only image of a task's type."""
        name, version = task.image
        return self.images.ensure(name, version)

    def run(
        self,
        sessions: int,
        *,
        seed: int,
        cheat_rate: float,
        sink: EventSink,
        labels: LabelWriter,
        concurrency: int = 4,
        plans: list[SessionPlan] | None = None,
        progress: Progress | None = None,
    ) -> FleetReport:
        """Run ``sessions`` task instances (× ``group_size`` attempts), ``concurrency`` sessions at a time.

        Args:
            sessions: task instances (each run ``group_size`` times).
            seed: task instances and policies derive from it.
            cheat_rate: share of cheating scripted policies.
            sink: where events go.
            labels: ground truth.
            concurrency: sandboxes at once.
            plans: explicit sessions (``trajlake fleet retry``); overrides ``sessions``.
            progress: told of each session as it ends.
        """
        from producers.fleet.sinks import CountingSink, PreRedactedSink
        from producers.sdk import EventProducer

        if isinstance(sink, EventProducer):  # every session's emitter redacts: no second pass per event
            sink = PreRedactedSink(sink)
        todo = plans if plans is not None else group_plans(sessions, seed, self.group_size)

        counting = CountingSink(sink)
        finished = ProgressCounter(progress, len(todo), "sessions")
        reaper = Reaper()

        def one(i: int) -> SessionRecord:
            record = self.run_session(i, seed, cheat_rate, counting, labels, reaper, todo[i])
            finished.add()
            return record

        started = time.monotonic()
        try:
            with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="sandbox") as pool:
                records = list(pool.map(one, range(len(todo))))
        finally:
            reaper.stop()
        wall = time.monotonic() - started
        first = [r.first_command_ms for r in records if r.first_command_ms is not None]
        report = FleetReport(
            backend=self.name,
            sessions=len(records),
            events=counting.count,
            wall_s=wall,
            by_status=dict(Counter(r.status for r in records)),
            by_policy=dict(Counter(r.policy for r in records)),
            cheaters=sum(1 for r in records if cheat_type(r.policy)),
            timeouts_reaped=sum(1 for r in records if r.reaped),
            reaper_survivors=sum(r.survivors for r in records),
            eval_passed=sum(1 for r in records if r.eval_passed),
            latency_ms={
                **percentiles(first, "first_command"),
                **percentiles([r.ready_ms for r in records], "sandbox_ready"),
                **percentiles([r.runtime_s * 1000 for r in records], "session"),
            },
        )
        hangs = report.by_policy.get("hang", 0)
        report.figures["hang_sessions"] = hangs
        return report

    def run_session(
        self,
        index: int,
        seed: int,
        cheat_rate: float,
        sink: Any,
        labels: LabelWriter,
        reaper: Reaper,
        plan: SessionPlan | None = None,
    ) -> SessionRecord:
        """One complete session in stages (``local_session``): sandbox, agent, evaluation, events, label.

        Whatever a stage raises, the sandbox (its processes, writable layer, gateway) is gone and
        the task's secrets are forgotten when this returns or raises.

        Raises:
            SandboxError: a sandbox could not be created.
            Exception: a scripted policy's or the host's own error (a live agent's is its session's outcome).
        """
        stages = LocalStages(self, index, seed, cheat_rate, sink, labels, reaper, plan or SessionPlan(index))
        return run_staged(stages)

    def run_live_agent(self, agent: AgentSpec, ctx: AgentContext) -> None:
        """Run a live agent (``llm`` or a callable) on the session's tools."""
        session = AgentSession(ctx)
        if agent.kind == "llm":
            from producers.fleet.llm.agent import LLMAgent

            LLMAgent(self.llm, self.store)(session)
        else:
            assert agent.func is not None
            agent.func(session)
