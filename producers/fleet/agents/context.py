"""The scripted agents' tool layer: ``AgentContext`` runs real commands in the sandbox and emits
the events a model-driven agent loop would (input, action, feedback, file ops, resources).
"""

from __future__ import annotations

import hashlib
import json
import random
import shlex
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producers.errors import SandboxLimitReached
from producers.fleet.agent_caps import Caps
from producers.fleet.bounds import EventBounds, emission_order
from producers.fleet.perturb import TRANSIENT_EXIT, Perturbation
from producers.fleet.sandbox import CommandResult, FileChange, Sandbox
from producers.fleet.sandbox.records import LayerDiff, Snapshot
from producers.fleet.tasks import TaskInstance
from producers.sdk import SessionEmitter

MODEL = "scripted-sim-1"
PRICE_PER_MTOK = {"input": 3.0, "cached": 0.3, "output": 15.0}
SYSTEM_PROMPT_TOKENS = 850
MAX_TRANSIENT_RETRIES = 3
WORKSPACE_ROOT = "/workspace"


def tokens(text: str) -> int:
    """A model-like token estimate (~4 characters per token)."""
    return max(1, len(text) // 4)


@dataclass
class AgentOutcome:
    """How a policy ended and what the evaluator should find."""

    status: str  # completed | gave_up | failed
    expected: str  # pass | fail | timeout


@dataclass
class AgentContext:
    """The tools a scripted policy uses; every call is a real command in the sandbox.

    Args:
        session: the session's event emitter.
        sandbox: the live sandbox.
        task: the task instance (policies may read what a model would see: the instruction).
        rng: the policy's random source.
        perturb: environment perturbation.
        runner_cmd: command running the visible tests.
    """

    session: SessionEmitter
    sandbox: Sandbox
    task: TaskInstance
    rng: random.Random
    perturb: Perturbation = field(default_factory=Perturbation)
    runner_cmd: str = "python3 run_tests.py"
    steps: int = 0
    context_tokens: int = SYSTEM_PROMPT_TOKENS
    cost_usd: float = 0.0
    exit_codes: list[int] = field(default_factory=list)
    network_attempts: int = 0
    network_denied: int = 0
    bytes_written: int = 0
    transcript: Any = field(default_factory=hashlib.sha256)
    on_step: Callable[[], None] | None = None
    caps: Caps = field(default_factory=Caps)
    model_tokens: int = 0  # prompt + completion tokens of every model call so far (the max_model_tokens budget)
    model_calls: int = 0  # model calls a live model agent made (the max_model_calls budget)
    live_turn: dict[str, Any] | None = None  # set by a live agent: its action fields replace the simulated turn
    bounds: EventBounds = field(default_factory=EventBounds)
    watched: frozenset[str] = frozenset()  # the task's own files: their changes are emitted first
    unhashed: int = 0  # changed files left without a sha256 (past Limits.hash_bytes per command)
    file_ops_not_emitted: int = 0
    scans_incomplete: int = 0  # commands after which the layer's scan stopped at a bound
    disk_limit: SandboxLimitReached | None = None
    _snapshot: Snapshot | None = None

    def check_caps(self) -> None:
        """Stop the agent when a cap is reached (steps, model tokens, cost, wall-clock deadline).

        Raises:
            CapReached: naming the cap.
        """
        self.caps.check(
            steps=self.steps, model_tokens=self.model_tokens, cost_usd=self.cost_usd, model_calls=self.model_calls
        )

    def _model_turn(self, thought: str, command: str, tool: str, arguments: dict[str, Any]) -> str:
        if self.live_turn is not None:  # a live agent's own model call was recorded already: only the action
            turn = self.live_turn
            # a retried action (transient environment failure) carries no second share of tokens or cost
            self.live_turn = {**turn, "output_tokens": 0, "reasoning_tokens": 0, "cost_usd": 0.0}
            return self.session.action(tool, arguments=arguments, command=command, **turn)
        message_id = f"msg_{self.steps}"
        previous = self.context_tokens
        self.context_tokens += tokens(thought) + 40
        self.transcript.update(f"{tool}\0{command}\0{thought}".encode())
        self.session.agent_input(
            prompt_digest=self.transcript.hexdigest(),
            input_tokens=self.context_tokens,
            cached_tokens=previous,
            n_messages=2 * self.steps + 2,
            content=self.task.instruction if self.steps == 0 else None,
            message_id=message_id,
        )
        output_tokens = tokens(thought) + tokens(command) + 12
        reasoning = self.rng.randrange(0, 400)
        cost = (
            (self.context_tokens - previous) * PRICE_PER_MTOK["input"]
            + previous * PRICE_PER_MTOK["cached"]
            + (output_tokens + reasoning) * PRICE_PER_MTOK["output"]
        ) / 1e6
        self.cost_usd += cost
        self.model_tokens += self.context_tokens + output_tokens + reasoning
        return self.session.action(
            tool,
            arguments=arguments,
            command=command,
            thought=thought,
            output_tokens=output_tokens,
            reasoning_tokens=reasoning,
            cost_usd=round(cost, 8),
            model_latency_ms=round(250 + 18 * (output_tokens + reasoning) + self.rng.uniform(0, 400), 1),
            tool_call_id=f"call_{self.steps}",
            message_id=message_id,
        )

    def call(
        self,
        tool: str,
        command: str,
        thought: str,
        arguments: dict[str, Any] | None = None,
        stdin: str = "",
        timeout: float | None = None,
    ) -> CommandResult:
        """One tool call: model turn, real command (with perturbation), observations.

        Args:
            tool: the tool's name (``gen_ai.tool.name``).
            command: the shell command that implements it in the sandbox.
            thought: the (simulated) reasoning recorded with the action.
            arguments: the tool's arguments as the model gave them (default ``{"command": command}``).
            stdin: bytes fed to the command.
            timeout: seconds before the command is killed (default: the sandbox's).

        Raises:
            SandboxKilled: the sandbox was reaped while the command ran.
            CapReached: a cap (steps, model tokens, cost, deadline) was reached before the call.
            SandboxLimitReached: the command took the sandbox past a host limit (its events are out).
        """
        self.check_caps()  # a command outliving the deadline is the reaper's (exit_reason 'reaper')
        self.check_gateway()  # an agent that caught the first refusal still starts nothing new
        self.check_disk()
        action_id = self._model_turn(thought, command, tool, arguments or {"command": command})
        # the layer as the previous command left it (what changed in between is this command's to report)
        before = self._snapshot if self._snapshot is not None else self.sandbox.snapshot(self.watched)
        result: CommandResult | None = None
        for _ in range(MAX_TRANSIENT_RETRIES + 1):
            delay = self.perturb.delay_s(self.rng)
            failure = self.perturb.transient_failure(self.rng)
            if delay:
                time.sleep(delay)
            if failure is None:
                result = self.sandbox.run(command, stdin=stdin, timeout=timeout)
                result.duration_ms += delay * 1000
                result.output = self.perturb.vary_output(result.output, self.rng)
                break
            # the environment failed transiently; report it, and (like a real harness) retry
            self._feedback(
                action_id,
                CommandResult(
                    failure + "\n",
                    TRANSIENT_EXIT,
                    delay * 1000,
                    len(failure) + 1,
                    failure_reason="transient (injected)",
                ),
            )
            action_id = self._model_turn(
                "The environment hiccuped; retrying the same command.",
                command,
                tool,
                arguments or {"command": command},
            )
        if result is None:
            result = self.sandbox.run(command, stdin=stdin, timeout=timeout)
        self.record_network(action_id)
        self._feedback(action_id, result)
        self._snapshot = after = self.sandbox.snapshot(self.watched)
        self._file_ops(self.sandbox.changes(before, after), after)
        stats = self.sandbox.stats()
        self.session.resource_sample(
            cpu_seconds=stats["cpu_seconds"],
            memory_bytes=int(stats.get("memory_bytes", stats["peak_memory_bytes"])),
            processes=int(stats.get("processes", stats["processes_started"])),
            disk_write_bytes=self.bytes_written,
            network_requests=self.network_attempts,
        )
        self.steps += 1
        self.check_gateway()
        self._usage_after(after)
        return result

    def _file_ops(self, diff: LayerDiff, after: Snapshot) -> None:
        """A ``file_op`` per change, at most ``bounds.file_ops_per_command`` (then one summary)."""
        changes = diff.changes
        limit = self.bounds.file_ops_per_command
        left_out: list[FileChange] = []
        if len(changes) > limit:
            keep = set(emission_order((c.path for c in changes), self.watched)[:limit])
            left_out = [c for c in changes if c.path not in keep]
            changes = [c for c in changes if c.path in keep]
        self.unhashed += self.sandbox.hash_changes(changes)  # only what is reported is hashed
        for change in changes:
            self.bytes_written += change.size_bytes
            self._file_op(change.op, change.path, change.size_bytes, change.sha256)
        if left_out:
            self.bytes_written += sum(c.size_bytes for c in left_out)
            self.file_ops_not_emitted += len(left_out)
            value = {
                "limit": limit,
                "not_emitted": dict(sorted(Counter(c.op for c in left_out).items())),
                "bytes": sum(c.size_bytes for c in left_out),
            }
            self._note("file_ops_not_emitted", value)
        if not after.complete:
            self.scans_incomplete += 1
            if self.scans_incomplete == 1:  # once per session; the count is in session_end
                value = {"stopped_by": after.stopped_by, "entries_seen": len(after.entries), "deletions_unknown": True}
                self._note("workspace_scan_incomplete", value)

    def _note(self, key: str, value: dict[str, Any]) -> None:
        self.session.emit(
            "annotation", {"key": key, "value": json.dumps(value, sort_keys=True), "author": "fleet"}, "system"
        )

    def _usage_after(self, after: Snapshot) -> None:
        """Check the layer against its quota after a command (a complete scan is its own figure).

        Raises:
            SandboxLimitReached: ``disk_quota``.
        """
        quota = self.sandbox.quota
        if quota.mode == "off":
            return
        usage = (
            self.sandbox.disk_usage() if quota.mounted or not after.complete else quota.usage(after.inodes, after.bytes)
        )
        if usage is not None and usage.full:
            self.disk_limit = SandboxLimitReached(
                "disk_quota",
                f"{usage.bytes_used} of {usage.bytes_limit} bytes, {usage.inodes_used} of {usage.inodes_limit} inodes",
            )
            self.sandbox.kill()  # the session ends here: nothing more runs on a full layer
            raise self.disk_limit

    def check_disk(self) -> None:
        """Refuse a new command once the layer reached its quota (an agent that caught the first refusal).

        Raises:
            SandboxLimitReached: ``disk_quota``.
        """
        if self.disk_limit is not None:
            raise self.disk_limit

    def check_gateway(self) -> None:
        """End the session when the sandbox's egress gateway stopped recording (it failed closed).

        Raises:
            SandboxLimitReached: ``egress_monitor_failed``, with the gateway's reason.
        """
        failed = self.sandbox.gateway.failed
        if failed is not None:
            raise SandboxLimitReached("egress_monitor_failed", failed)

    def _file_op(self, op: str, path: str, size_bytes: int, sha256: str | None) -> None:
        """A ``file_op``: ``path`` relative to the workspace root, or absolute outside it.

        The payload's ``path`` stays absolute; ``extra['rel_path']`` is the workspace-relative path
        (absent outside the workspace) and ``extra['workspace_root']`` the root it is relative to.
        """
        absolute = path if path.startswith("/") else f"{WORKSPACE_ROOT}/{path}"
        inside = absolute.startswith(WORKSPACE_ROOT + "/")
        extra = {"workspace_root": WORKSPACE_ROOT}
        if inside:
            extra["rel_path"] = absolute[len(WORKSPACE_ROOT) + 1 :]
        self.session.emit(
            "file_op",
            {"op": op, "path": absolute, "size_bytes": size_bytes, "sha256": sha256, "in_workspace": inside},
            "environment",
            extra=extra,
        )

    def _feedback(self, action_id: str, result: CommandResult) -> None:
        self.context_tokens += tokens(result.output)
        if result.exit_code is not None:
            self.exit_codes.append(result.exit_code)
        self.session.feedback(
            action_id,
            output=result.output,
            exit_code=result.exit_code,
            duration_ms=round(result.duration_ms, 3),
            truncated=result.truncated,
            output_bytes=result.output_bytes,
            failure_reason=result.failure_reason,
            tool_call_id=(self.live_turn or {}).get("tool_call_id") or f"call_{self.steps}",
        )

    def record_network(self, action_id: str | None) -> None:
        """Emit a ``network_request`` per egress attempt the gateway saw since the last call.

        Args:
            action_id: the action whose command made the attempts (``None``: a command that never
                answered, recorded when the agent's phase ends).
        """
        for attempt in self.sandbox.gateway.drain():
            self.network_attempts += 1
            self.network_denied += not attempt.allowed
            self.session.emit(
                "network_request",
                {
                    "host": attempt.host,
                    "port": attempt.port,
                    "protocol": "tcp",
                    "allowed": attempt.allowed,
                    "bytes_sent": attempt.bytes_sent,
                    "error": attempt.error,
                },
                "system",
                ts=attempt.ts_us,
                parent_event_id=action_id,
            )

    # ------------------------------------------------------------------ tools

    def bash(self, command: str, thought: str) -> CommandResult:
        """Run a shell command."""
        return self.call("bash", command, thought)

    def read_file(self, path: str, thought: str = "Read the file.") -> CommandResult:
        """Read a file (recorded as a ``file_op`` read, also outside the workspace)."""
        result = self.call("read_file", f"cat -- {shlex.quote(path)}", thought, {"path": path})
        self._file_op("read", path, result.output_bytes if result.exit_code == 0 else 0, None)
        return result

    def write_file(self, path: str, content: str, thought: str = "Write the file.") -> CommandResult:
        """Write a file through ``cat >`` with the content on stdin."""
        parent = path.rsplit("/", 1)[0] if "/" in path else "."
        command = f"mkdir -p {shlex.quote(parent)} && cat > {shlex.quote(path)}"
        return self.call("write_file", command, thought, {"path": path, "content": content}, stdin=content)

    def run_tests(self, thought: str = "Run the visible tests.") -> CommandResult:
        """Run the visible tests with the workspace's runner."""
        return self.call("run_tests", self.runner_cmd, thought, {"command": self.runner_cmd})

    def look_around(self) -> None:
        """What any agent does first: list the workspace and read the task files."""
        self.bash("ls -la && ls tests", "Look at the workspace.")
        for path in sorted(self.task.files):
            if path.endswith((".md", ".py")) and not path.startswith("tests/"):
                self.read_file(path, f"Read {path}.")
