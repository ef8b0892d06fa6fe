"""The local fleet backend: real bubblewrap sandboxes, scripted agents, two-phase evaluation.

Per session: draw a task instance and a policy from the seed; build (once) the task type's
pinned read-only image; create a sandbox with a private writable layer holding the task files
and a copy of the runner; emit ``session_start``; hand the sandbox to the reaper; let the policy
act; then stop the sandbox (or find it reaped), take only the deliverable to a fresh evaluator
sandbox with the hidden tests, emit ``evaluation`` and ``session_end``, remove the writable
layer, and write the ground-truth label.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import socket
import time
import traceback
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.progress import Progress, ProgressCounter
from producers.errors import ModelAPIError, ModelConfigError
from producers.fleet import EventSink, FleetReport, LabelWriter, percentiles
from producers.fleet.agent_api import AgentSession, AgentSpec, resolve_agent
from producers.fleet.agent_caps import CapReached, Caps
from producers.fleet.agents import MODEL, POLICIES, AgentContext, AgentOutcome, cheat_type, choose_policy
from producers.fleet.evaluator import collect_deliverable, evaluate, protected_files
from producers.fleet.perturb import Perturbation
from producers.fleet.sandbox import ImageStore, Limits, Reaper, Sandbox, SandboxKilled, image_tools
from producers.fleet.tasks import TaskInstance, task_for
from producers.fleet.tasks.repo import init_repository
from producers.redact import forget_secret_values, register_secret_values
from producers.sdk import SessionEmitter

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


def _digests(files: dict[str, str]) -> dict[str, str]:
    """sha256 of every pristine workspace file (relative path → digest)."""
    return {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in sorted(files.items())}


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
    ) -> None:
        from producers.fleet.llm.record import ContentStore
        from producers.fleet.sandbox import find_bwrap

        find_bwrap()
        self.root = root
        self.images = ImageStore(root / "images")
        self.sandbox_root = root / "sandboxes"
        self.sandbox_root.mkdir(parents=True, exist_ok=True)
        self.perturb = perturb or Perturbation()
        self.timeout_s = timeout_s
        self.policy_mix = policy_mix
        self.host_id = host_id or f"local-{socket.gethostname()}"
        self.limits = limits or Limits()
        self._runner = image_tools()["bin/tl_test.py"].decode()
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
        from producers.fleet import CountingSink

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
        """One complete session: sandbox, agent, evaluation, events, label."""
        plan = plan or SessionPlan(index)
        rng = random.Random(f"fleet:{seed}:{index}")
        task = plan.task or task_for(seed, plan.task_index)
        agent = resolve_agent(plan.agent) if plan.agent else self.agent
        policy = choose_policy(rng, cheat_rate, self.policy_mix) if agent is None else agent.spec
        live = agent is not None and agent.kind != "policy"
        if agent is not None and agent.kind == "policy":
            agent = None
        image_name, image_version = task.image
        image = self.image_for(task)
        session_id = uuid.uuid4().hex
        sandbox_id = f"sb-{session_id[:16]}"
        emitter = SessionEmitter(
            sink,
            session_id=session_id,
            sandbox_id=sandbox_id,
            task_id=task.task_id,
            task_type=task.task_type,
            host_id=self.host_id,
            image_name=image_name,
            image_version=image_version,
            agent_name=AGENT_NAME if not live else ("llm-agent" if policy == "llm" else policy),
            agent_version=AGENT_VERSION,
            agent_model=MODEL if not live else (self.llm.model if policy == "llm" else None),
            policy_version="scripted-v1" if not live else (_llm_policy_version() if policy == "llm" else "custom"),
            extra={"backend": "local", "task_family": task.family},
        )
        if plan.group_id is not None or plan.retry_of is not None:
            # v3 envelope fields, in every event of the session (only when set: a v1/v2 writer refuses them)
            emitter.envelope.update(group_id=plan.group_id, attempt=plan.attempt, retry_of=plan.retry_of)
        timeout_s = self.timeout_s or task.timeout_s
        limits = Limits(
            cpu_cores=self.limits.cpu_cores,
            memory_bytes=self.limits.memory_bytes,
            pids=self.limits.pids,
            cpu_seconds=self.limits.cpu_seconds,
            file_size_bytes=self.limits.file_size_bytes,
            timeout_s=timeout_s,
        )
        env = {**task.config, **self.perturb.session_env(rng)}
        files = {**task.files, "run_tests.py": self._runner}
        started = time.monotonic()
        task_secrets = {"TL_TASK_TOKEN": secrets.token_hex(16)}
        # the redactor removes what the host injects wherever it shows up in this session's events
        register_secret_values(task_secrets.values())
        sandbox = Sandbox(
            sandbox_id,
            self.sandbox_root,
            image,
            files,
            limits,
            env=env,
            secrets=task_secrets,
            allowlist=task.egress_allowlist,
            services=task.services,
        )
        reaper.watch(sandbox, timeout_s)
        try:
            repo = init_repository(sandbox.workspace, task)  # the workspace is a git repository (fix in history)
        except Exception:
            sandbox.kill()
            sandbox.cleanup()
            raise
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
                **({"agent_spec": policy} if live else {}),
            },
        )
        caps = Caps(
            self.caps.max_steps,
            self.caps.max_model_tokens,
            self.caps.max_cost_usd,
            started + timeout_s if live else None,  # a scripted policy meets only the reaper
            self.caps.max_model_calls,
        )
        ctx = AgentContext(emitter, sandbox, task, random.Random(rng.getrandbits(64)), self.perturb, caps=caps)
        outcome: AgentOutcome | None = None
        crashed: str | None = None
        cap: str | None = None
        api_error: str | None = None
        config_error = False
        try:
            if agent is None:
                outcome = POLICIES[policy](ctx)
            else:
                self._run_agent(agent, ctx)
                outcome = AgentOutcome("completed", "unknown")
        except SandboxKilled as exc:
            crashed = None if sandbox.reaped else str(exc)
        except CapReached as exc:
            cap = exc.reason
            outcome = AgentOutcome("capped", "unknown")
        except ModelConfigError as exc:  # a wrong model name, key or path: no rerun fixes it
            api_error, config_error = str(exc), True
        except ModelAPIError as exc:
            api_error = str(exc)
        except Exception:  # a custom agent's own bug: its session fails, the fleet goes on
            if not live:
                raise
            outcome = AgentOutcome("failed", "fail")
            emitter.emit(
                "annotation",
                {"key": "agent_error", "value": traceback.format_exc()[-MAX_TRACEBACK_CHARS:], "author": "fleet"},
                "system",
            )
        ctx._network(None)  # attempts made by a command that never answered
        stats = sandbox.stats()
        if not sandbox.killed:
            sandbox.stop()
        survivors = sandbox.survivors()
        deliverable, ignored = collect_deliverable(task, sandbox.workspace, {"run_tests.py": self._runner})
        sandbox.cleanup()
        result = evaluate(task, deliverable, image, self.sandbox_root, reaper, ignored_changes=ignored)
        emitter.emit("evaluation", result.payload(), "evaluator", extra=result.extra())
        if cap is not None:  # the agent stopped at its cap (the reaper may have come after)
            status, exit_reason = "capped", cap
        elif sandbox.reaped:
            status, exit_reason = "timeout", "reaper"
        elif api_error is not None:
            kind = "model_config_error" if config_error else "model_api_error"
            status, exit_reason = "error", f"{kind}: {api_error}"[:200]
        elif outcome is not None and outcome.status == "failed" and live:
            status, exit_reason = "failed", "agent_raised"
        elif crashed is not None or outcome is None:
            status, exit_reason = "error", f"sandbox died: {crashed}"[:200]
        else:
            status, exit_reason = (
                outcome.status,
                "agent_finished" if outcome.status == "completed" else outcome.status,
            )
        runtime = time.monotonic() - started
        emitter.emit(
            "session_end",
            {
                "status": status,
                "reward": result.reward,
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
                "reaper_survivors": str(survivors),
                "first_command_ms": f"{sandbox.first_command_ms or 0:.3f}",
            },
        )
        forget_secret_values(task_secrets.values())  # every event of the session has been emitted
        expected = "timeout" if policy == "hang" else (outcome.expected if outcome else "fail")
        labels.write(
            session_id=session_id,
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
            session_id,
            policy if agent is None else (agent.label if agent else policy),
            status,
            sandbox.reaped,
            survivors,
            result.passed,
            sandbox.ready_ms,
            sandbox.first_command_ms,
            runtime,
        )

    def _run_agent(self, agent: AgentSpec, ctx: AgentContext) -> None:
        """Run a live agent (``llm`` or a callable) on the session's tools."""
        session = AgentSession(ctx)
        if agent.kind == "llm":
            from producers.fleet.llm.agent import LLMAgent

            LLMAgent(self.llm, self.store)(session)
        else:
            assert agent.func is not None
            agent.func(session)


def _llm_policy_version() -> str:
    from producers.fleet.llm.agent import POLICY_VERSION

    return POLICY_VERSION
