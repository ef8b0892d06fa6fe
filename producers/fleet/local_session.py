"""One local session in stages (``lifecycle``): a bubblewrap sandbox, the agent, a fresh-sandbox verdict.

- ``prepare``: draw a task instance and a policy from the seed; build (once) the task type's
  pinned read-only image; register the task's secrets with the redactor; create a sandbox with a
  private writable layer holding the task files and a copy of the runner; hand it to the reaper;
  make the workspace a git repository; emit ``session_start``.
- ``run_agent``: let the policy or live agent act (an exception of a live agent, a cap, a model
  error, a host limit or the reaper ends it: ``AgentRun``); record egress the last command
  caused; stop the sandbox (or find it reaped) and count survivors.
- ``judge``: list what the agent changed and read what it planted (``planted``); take only the
  deliverable to a fresh evaluator sandbox with the hidden tests; emit ``evaluation``.
- ``emit_end``: summarise what the session's event budget left out (if anything), emit
  ``session_end`` and write the ground-truth label.
- ``cleanup`` (always): kill and remove the sandbox (processes, writable layer and its quota,
  gateway, cgroup) if a stage left it, and forget the task's secrets.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import random
import secrets
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from producers.errors import ModelAPIError, ModelConfigError, SandboxLimitReached
from producers.fleet.agent_api import AgentSpec, resolve_agent
from producers.fleet.agent_caps import CapReached, Caps
from producers.fleet.agents import MODEL, POLICIES, AgentContext, AgentOutcome, cheat_type, choose_policy
from producers.fleet.bounds import BoundedEmitter, EventBounds
from producers.fleet.evaluator import EvalResult, collect_changes, evaluate, protected_files
from producers.fleet.lifecycle import AgentRun, session_status
from producers.fleet.planted import planted_in_layer
from producers.fleet.report import LabelWriter
from producers.fleet.sandbox import Limits, Reaper, Sandbox, SandboxKilled
from producers.fleet.tasks import TaskInstance, task_for
from producers.fleet.tasks.repo import init_repository
from producers.redact import forget_secret_values, register_secret_values

if TYPE_CHECKING:
    from producers.fleet.perturb import Perturbation

AGENT_NAME = "scripted-agent"  # the same for every policy: the policy is ground truth, not an event field
AGENT_VERSION = "1.0"
MAX_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True)
class SessionPlan:
    """What one session runs: a task instance (by seed and index, or given), its group and attempt.

    Attributes:
        task_index: ``task_for(seed, task_index)``: the same seed and index give the same instance.
        group_id: the rollout group (K attempts of one instance), or ``None``.
        attempt: attempt number of the instance, from 1.
        retry_of: the session this one re-runs (``trajlake fleet retry``), or ``None``.
        task: an explicit task instance (a retry rebuilds it from the recorded family and seed).
        agent: the agent of a retry (the one the original session ran), else the fleet's.
    """

    task_index: int
    group_id: str | None = None
    attempt: int = 1
    retry_of: str | None = None
    task: TaskInstance | None = None
    agent: str | None = None


def group_plans(sessions: int, seed: int, group_size: int = 1) -> list[SessionPlan]:
    """``sessions`` task instances × ``group_size`` attempts each (one group id per instance when K > 1)."""
    plans = []
    for task_index in range(sessions):
        group = hashlib.sha256(f"group:{seed}:{task_index}".encode()).hexdigest()[:24] if group_size > 1 else None
        plans += [SessionPlan(task_index, group, attempt) for attempt in range(1, group_size + 1)]
    return plans


class HostFleet(Protocol):
    """What a local session's stages read from their fleet (``producers.fleet.local.LocalFleet``)."""

    host_id: str
    llm: Any
    caps: Caps
    perturb: Perturbation
    policy_mix: dict[str, float] | None
    agent: AgentSpec | None
    timeout_s: float | None
    limits: Limits
    bounds: EventBounds
    runner: str
    sandbox_root: Path

    def image_for(self, task: TaskInstance) -> Path:
        """The pinned read-only image of a task's type."""
        ...

    def run_live_agent(self, agent: AgentSpec, ctx: AgentContext) -> None:
        """Run a live agent (``llm`` or a callable) on the session's tools."""
        ...


@dataclass
class SessionRecord:
    """The outcome of one local session (for the report)."""

    session_id: str
    policy: str
    status: str
    reaped: bool
    survivors: int
    eval_passed: bool
    ready_ms: float
    first_command_ms: float | None
    runtime_s: float


@dataclass
class LocalSession:
    """What one local session holds while its stages run (``cleanup`` releases what is set)."""

    index: int
    plan: SessionPlan
    rng: random.Random
    task: TaskInstance
    agent: AgentSpec | None
    policy: str
    live: bool
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.monotonic)
    emitter: BoundedEmitter | None = None
    secrets: dict[str, str] = field(default_factory=dict)  # registered with the redactor until cleanup
    image: Path | None = None
    sandbox: Sandbox | None = None
    ctx: AgentContext | None = None
    run: AgentRun = field(default_factory=AgentRun)
    stats: dict[str, float] = field(default_factory=dict)
    survivors: int = 0
    result: EvalResult | None = None

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (recorded in every event)."""
        return f"sb-{self.session_id[:16]}"


def _digests(files: dict[str, str]) -> dict[str, str]:
    """sha256 of every pristine workspace file (relative path → digest)."""
    return {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in sorted(files.items())}


def _llm_policy_version() -> str:
    from producers.fleet.llm.agent import POLICY_VERSION

    return POLICY_VERSION


#: Largest submission patch an ``evaluation`` event carries (a larger one is cut, and says so): events stay small.
MAX_SUBMISSION_CHARS = 64 * 1024


def submission_patch(pristine: dict[str, str], deliverable: dict[str, str]) -> str:
    """The unified diff of the deliverable files against the task's own (empty: nothing changed)."""
    parts: list[str] = []
    for rel in sorted(deliverable):
        before, after = pristine.get(rel, ""), deliverable[rel]
        if before == after:
            continue
        parts += difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{rel}" if rel in pristine else "/dev/null",
            tofile=f"b/{rel}",
        )
        if parts and not parts[-1].endswith("\n"):
            parts[-1] += "\n\\ No newline at end of file\n"
    patch = "".join(parts)
    if len(patch) > MAX_SUBMISSION_CHARS:
        patch = patch[:MAX_SUBMISSION_CHARS] + f"\n[… patch cut at {MAX_SUBMISSION_CHARS} characters]\n"
    return patch


def _gateway_figures(sandbox: Sandbox) -> dict[str, str]:
    """What the egress gateway dropped or could not serve, when anything (``session_end`` extra)."""
    gateway = sandbox.gateway
    figures = {
        "egress_dropped": gateway.dropped,
        "egress_malformed": gateway.malformed,
        "egress_errors": gateway.errors,
        "egress_evicted": gateway.evicted,
        "egress_tap_drops": gateway.tap_drops(),
    }
    out = {key: str(value) for key, value in figures.items() if value}
    if gateway.failed is not None:
        out["egress_monitor_failed"] = gateway.failed
    return out


def _bound_figures(ctx: AgentContext, sandbox: Sandbox) -> dict[str, str]:
    """What the host's bounds left out or cut short, and the layer's quota (``session_end`` extra)."""
    figures = {
        "file_ops_not_emitted": ctx.file_ops_not_emitted,
        "files_unhashed": ctx.unhashed,
        "workspace_scans_incomplete": ctx.scans_incomplete,
    }
    out = {key: str(value) for key, value in figures.items() if value}
    if ctx.disk_limit is not None:
        out["disk_quota_reached"] = ctx.disk_limit.detail
    return out


class LocalStages:
    """The stages of one local session (``lifecycle.SessionStages``).

    Args:
        fleet: the fleet (images, sandbox root, limits, agent, caps).
        index: the session's index in the run (its random source derives from seed and index).
        seed: the run's seed.
        cheat_rate: share of cheating scripted policies.
        sink: where the session's events go (called with each complete event).
        labels: ground truth.
        reaper: enforces the sandbox's deadline.
        plan: the task instance, group and attempt.
    """

    def __init__(
        self,
        fleet: HostFleet,
        index: int,
        seed: int,
        cheat_rate: float,
        sink: Any,
        labels: LabelWriter,
        reaper: Reaper,
        plan: SessionPlan,
    ) -> None:
        self.fleet = fleet
        self.index = index
        self.seed = seed
        self.cheat_rate = cheat_rate
        self.sink = sink
        self.labels = labels
        self.reaper = reaper
        self.plan = plan

    # ------------------------------------------------------------------ prepare

    def new_state(self) -> LocalSession:
        """Draw the task instance and the policy (no resources yet)."""
        fleet, plan = self.fleet, self.plan
        rng = random.Random(f"fleet:{self.seed}:{self.index}")
        task = plan.task or task_for(self.seed, plan.task_index)
        agent = resolve_agent(plan.agent) if plan.agent else fleet.agent
        policy = choose_policy(rng, self.cheat_rate, fleet.policy_mix) if agent is None else agent.spec
        live = agent is not None and agent.kind != "policy"
        if agent is not None and agent.kind == "policy":
            agent = None
        return LocalSession(self.index, plan, rng, task, agent, policy, live)

    def _emitter(self, state: LocalSession) -> BoundedEmitter:
        fleet, task, policy, live, plan = self.fleet, state.task, state.policy, state.live, self.plan
        image_name, image_version = task.image
        emitter = BoundedEmitter(
            self.sink,
            fleet.bounds.events_per_session,
            session_id=state.session_id,
            sandbox_id=state.sandbox_id,
            task_id=task.task_id,
            task_type=task.task_type,
            host_id=fleet.host_id,
            image_name=image_name,
            image_version=image_version,
            agent_name=AGENT_NAME if not live else ("llm-agent" if policy == "llm" else policy),
            agent_version=AGENT_VERSION,
            agent_model=MODEL if not live else (fleet.llm.model if policy == "llm" else None),
            policy_version="scripted-v1" if not live else (_llm_policy_version() if policy == "llm" else "custom"),
            extra={"backend": "local", "origin": "sandbox", "task_family": task.family},
            # what leaves the host is redacted here, with the session's earlier events in view (a token
            # split over two outputs): the sink sees nothing the producer would still have to redact
            redact=True,
        )
        if plan.group_id is not None or plan.retry_of is not None:
            # v3 envelope fields, in every event of the session (only when set: a v1/v2 writer refuses them)
            emitter.envelope.update(group_id=plan.group_id, attempt=plan.attempt, retry_of=plan.retry_of)
        return emitter

    def prepare(self, state: LocalSession) -> None:
        """Image, secrets, sandbox, repository, ``session_start``.

        Raises:
            SandboxError: the sandbox could not be created.
            TaskRepositoryError: the workspace could not be made a git repository.
        """
        fleet, task, plan = self.fleet, state.task, self.plan
        state.image = image = fleet.image_for(task)
        state.emitter = emitter = self._emitter(state)
        timeout_s = fleet.timeout_s or task.timeout_s
        limits = replace(fleet.limits, timeout_s=timeout_s)
        env = {**task.config, **fleet.perturb.session_env(state.rng)}
        files = {**task.files, "run_tests.py": fleet.runner}
        state.started = time.monotonic()
        # the redactor removes what the host injects wherever it shows up in this session's events
        state.secrets = {"TL_TASK_TOKEN": secrets.token_hex(16)}
        register_secret_values(state.secrets.values())
        state.sandbox = sandbox = Sandbox(
            state.sandbox_id,
            fleet.sandbox_root,
            image,
            files,
            limits,
            env=env,
            secrets=state.secrets,
            allowlist=task.egress_allowlist,
            services=task.services,
        )
        self.reaper.watch(sandbox, timeout_s)
        repo = init_repository(sandbox.workspace, task)  # the workspace is a git repository (fix in history)
        emitter.emit(
            "session_start",
            {
                "attempt": plan.attempt,
                "cpu_limit": limits.cpu_cores,
                "memory_limit_bytes": limits.memory_bytes,
                "pids_limit": limits.pids,
                "timeout_s": timeout_s,
                "network_enabled": bool(task.egress_allowlist),
                "egress_allowlist": list(task.egress_allowlist),
                "config_digest": task.config_digest,
                "instruction": task.instruction,
            },
            "system",
            extra={
                "sandbox_ready_ms": f"{sandbox.ready_ms:.3f}",
                "cgroup": str(sandbox.cgroup.active).lower(),
                # what the judges compare against: the workspace root and the pristine tests/runner
                "workspace_root": "/workspace",
                "protected_files": json.dumps(protected_files(files), sort_keys=True),
                "pristine_files": json.dumps(_digests(files), sort_keys=True),
                "deliverables": json.dumps(list(task.deliverables)),
                "git_head": repo.pristine_commit,
                "git_history_ref": repo.leak_ref,
                "git_history_commit": repo.fix_commit,
                # what a retry or a group needs to run the same instance again (a scripted policy is
                # ground truth and stays out of the stream: only a live agent's spec is recorded)
                "task_seed": str(task.seed),
                **({"agent_spec": state.policy} if state.live else {}),
            },
        )
        caps = fleet.caps
        deadline = state.started + timeout_s if state.live else None  # a scripted policy meets only the reaper
        session_caps = Caps(caps.max_steps, caps.max_model_tokens, caps.max_cost_usd, deadline, caps.max_model_calls)
        agent_rng = random.Random(state.rng.getrandbits(64))
        state.ctx = AgentContext(
            emitter,
            sandbox,
            task,
            agent_rng,
            fleet.perturb,
            caps=session_caps,
            bounds=fleet.bounds,
            watched=frozenset(files),
        )

    # ------------------------------------------------------------------ run agent

    def run_agent(self, state: LocalSession) -> None:
        """The agent acts; its phase ends with the sandbox stopped (or reaped) and survivors counted.

        Raises:
            Exception: a scripted policy's own exception (a bug of the fleet, not of an agent).
        """
        assert state.ctx is not None and state.sandbox is not None and state.emitter is not None
        ctx, sandbox, run = state.ctx, state.sandbox, state.run
        run.live = state.live
        try:
            if state.agent is None:
                run.outcome = POLICIES[state.policy](ctx)
            else:
                self.fleet.run_live_agent(state.agent, ctx)
                run.outcome = AgentOutcome("completed", "unknown")
        except SandboxKilled as exc:
            run.crashed = None if sandbox.reaped else str(exc)
        except CapReached as exc:
            run.cap = exc.reason
            run.outcome = AgentOutcome("capped", "unknown")
        except SandboxLimitReached as exc:
            run.host_limit = exc.reason
            run.outcome = AgentOutcome("failed", "fail")
            state.emitter.emit("annotation", {"key": exc.reason, "value": exc.detail, "author": "fleet"}, "system")
        except ModelConfigError as exc:  # a wrong model name, key or path: no rerun fixes it
            run.api_error, run.api_error_kind = str(exc), "model_config_error"
        except ModelAPIError as exc:
            run.api_error = str(exc)
        except Exception:  # a custom agent's own bug: its session fails, the fleet goes on
            if not state.live:
                raise
            run.outcome = AgentOutcome("failed", "fail")
            state.emitter.emit(
                "annotation",
                {"key": "agent_error", "value": traceback.format_exc()[-MAX_TRACEBACK_CHARS:], "author": "fleet"},
                "system",
            )
        ctx.record_network(None)  # attempts made by a command that never answered
        if run.host_limit is None and sandbox.gateway.failed is not None:  # failed after the last command
            run.host_limit = "egress_monitor_failed"
            detail = sandbox.gateway.failed
            state.emitter.emit("annotation", {"key": run.host_limit, "value": detail, "author": "fleet"}, "system")
        state.stats = sandbox.stats()
        if not sandbox.killed:
            sandbox.stop()
        run.reaped = sandbox.reaped
        state.survivors = sandbox.survivors()

    # ------------------------------------------------------------------ judge

    def judge(self, state: LocalSession) -> None:
        """The deliverable alone, in a fresh sandbox with the hidden tests; ``evaluation``."""
        assert state.sandbox is not None and state.emitter is not None and state.image is not None
        fleet, task, sandbox = self.fleet, state.task, state.sandbox
        deliverable, ignored, total = collect_changes(task, sandbox.workspace, {"run_tests.py": fleet.runner})
        tests = [rel for rel in task.files if rel.startswith("tests/")]
        planted = planted_in_layer(sandbox.workspace, deliverable, ignored, tests)  # an attempt, whatever the verdict
        sandbox.cleanup()
        state.result = evaluate(
            task,
            deliverable,
            state.image,
            fleet.sandbox_root,
            self.reaper,
            ignored_changes=ignored,
            base_limits=fleet.limits,
            ignored_total=total,
            planted=planted,
        )
        # the final patch (what the agent handed in against the task's files): an export's ``submission``
        patch = submission_patch(task.files, deliverable)
        extra = {**state.result.extra(), **({"submission": patch} if patch else {})}
        state.emitter.emit("evaluation", state.result.payload(), "evaluator", extra=extra)

    # ------------------------------------------------------------------ emit end

    def emit_end(self, state: LocalSession) -> SessionRecord:
        """``session_end`` and the label; the session's record."""
        assert state.sandbox is not None and state.emitter is not None and state.ctx is not None
        assert state.result is not None
        sandbox, ctx, stats, task, plan = state.sandbox, state.ctx, state.stats, state.task, self.plan
        status, exit_reason = session_status(state.run)
        runtime = time.monotonic() - state.started
        state.emitter.summarise()  # what the session's event budget left out, if anything
        state.emitter.emit(
            "session_end",
            {
                "status": status,
                "reward": state.result.reward,
                "runtime_s": round(runtime, 4),
                "exit_reason": exit_reason,
                "cpu_seconds": round(stats["cpu_seconds"], 6),
                "peak_memory_bytes": int(stats["peak_memory_bytes"]),
                "peak_processes": int(stats.get("processes", 0) or stats["processes_started"]),
                "disk_write_bytes": ctx.bytes_written,
            },
            "system",
            extra={
                "processes_started": str(int(stats["processes_started"])),
                "network_attempts": str(ctx.network_attempts),
                "network_denied": str(ctx.network_denied),
                "exit_codes": json.dumps(dict(Counter(str(c) for c in ctx.exit_codes)), sort_keys=True),
                "cost_usd": f"{ctx.cost_usd:.6f}",
                "reaper_survivors": str(state.survivors),
                "first_command_ms": f"{sandbox.first_command_ms or 0:.3f}",
                **_gateway_figures(sandbox),
                **_bound_figures(ctx, sandbox),
            },
        )
        outcome, policy = state.run.outcome, state.policy
        expected = "timeout" if policy == "hang" else (outcome.expected if outcome else "fail")
        self.labels.write(
            session_id=state.session_id,
            policy=policy,
            cheat_type=cheat_type(policy),
            expected_outcome=expected,
            task_id=task.task_id,
            task_type=task.task_type,
            family=task.family,
            seed=task.seed,
            backend="local",
            group_id=plan.group_id,
            attempt=plan.attempt,
            retry_of=plan.retry_of,
        )
        return SessionRecord(
            state.session_id,
            state.agent.label if state.agent is not None else policy,
            status,
            sandbox.reaped,
            state.survivors,
            state.result.passed,
            sandbox.ready_ms,
            sandbox.first_command_ms,
            runtime,
        )

    # ------------------------------------------------------------------ cleanup

    def cleanup(self, state: LocalSession) -> None:
        """Kill and remove the sandbox if a stage left it; forget the task's secrets (every event is out)."""
        try:
            if state.sandbox is not None:
                if not state.sandbox.killed:
                    state.sandbox.kill()
                state.sandbox.cleanup()
        finally:
            forget_secret_values(state.secrets.values())
