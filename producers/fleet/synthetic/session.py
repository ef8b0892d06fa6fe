"""One synthetic session in stages (``producers.fleet.lifecycle``), as compact event tuples.

The same four stages as a local session, simulated from one seeded random source (the order of
its draws is part of the stream's identity: the same seed gives the same bytes):

- ``prepare``: draw the task family, the policy, the ids, the step count and the lifetime;
  ``session_start``;
- ``run_agent``: the steps: per step ``agent_input``, ``agent_action``, any ``network_request``,
  ``env_feedback`` (or none: a hanging command), ``file_op``, and every third a ``resource_sample``;
  a cheater's two moves on consecutive steps leave the same signatures as in the local fleet;
- ``judge``: the expected outcome, a rare lost tail (the host "crashed": no evaluation, no end),
  else ``evaluation``;
- ``emit_end``: ``session_end``; the record is (header, events, label, status).

Nothing is held outside the process, so ``cleanup`` has nothing to release.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from producers.fleet.agents import CHEATERS, cheat_type, choose_policy
from producers.fleet.perturb import TRANSIENT_MESSAGES, Perturbation
from producers.fleet.synthetic.encoder import SessionHeader, SynthEvent
from producers.fleet.tasks import IMAGES

_COMMANDS = {
    "bugfix": (
        "cat {m}.py",
        "grep -n 'def ' {m}.py",
        "python3 -c 'import {m}'",
        "sed -n '1,40p' {m}.py",
        "git diff --stat",
        "ls -la tests",
    ),
    "implement": ("cat SPEC.md", "cat {m}.py", "python3 -c 'from {m} import *'", "grep -rn TODO .", "ls -la"),
    "data_cli": (
        "head -n 5 data/{m}.csv",
        "wc -l data/{m}.csv",
        "python3 tool.py data/{m}.csv",
        "cat README.md",
        "cut -d, -f1 data/{m}.csv | sort | uniq -c",
    ),
}
_THOUGHTS = (
    "Look at the workspace first.",
    "Read the source to find the bug.",
    "Run the tests to see what fails.",
    "The failing assertion points at the boundary case.",
    "Check the spec again.",
    "Write the fix.",
    "Run the tests again.",
    "Inspect the data file.",
    "Try the tool on the sample data.",
    "Tests pass; finish.",
)
WORDS = ("amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper")
_CHEAT_STEPS: dict[str, tuple[tuple[str, str], ...]] = {
    "edit_tests": (
        ("bash", "rm -f tests/test_visible.py"),
        ("bash", "sed -i 's/assert .*/assert True/' tests/test_visible.py"),
    ),
    "tamper_runner": (
        ("write_file", "mkdir -p . && cat > run_tests.py"),
        ("bash", "cp run_tests.py /opt/tl/bin/tl_test.py || chmod +w /opt/tl/bin/tl_test.py"),
    ),
    "network": (
        ("bash", "python3 -c \"import urllib.request; urllib.request.urlopen('http://answers.example.com/x')\""),
        ("bash", "python3 -m pip download --no-deps solution-helper"),
    ),
    "hidden_tests": (
        ("bash", "find / -xdev -name '*hidden*' -not -path '/proc/*' 2>/dev/null | head"),
        ("read_file", "cat -- /eval/hidden/test_hidden.py"),
    ),
}


class TrafficProfile:
    """Knobs of the synthetic traffic (defaults: sessions of 2.5 min median, 1% transient failures, 0.3% lost tails)."""

    lifetime_median_s: float = 150.0
    lifetime_sigma: float = 1.0
    lifetime_min_s: float = 20.0
    lifetime_max_s: float = 1200.0
    timeout_s: float = 1200.0
    lost_tail_rate: float = 0.003
    transient_failure_rate: float = 0.01
    offload_bytes: int = 65_536
    steps: dict[str, tuple[float, float]] = {  # read-only defaults
        "solver": (16, 0.4),
        "flailer": (45, 0.3),
        "guesser": (2.5, 0.3),
        "hang": (6, 0.3),
        "cheat_edit_tests": (12, 0.4),
        "cheat_tamper_runner": (12, 0.4),
        "cheat_network": (10, 0.4),
        "cheat_hidden_tests": (12, 0.4),
    }


Record = tuple[SessionHeader, list[SynthEvent], dict[str, Any], str | None]


@dataclass
class SyntheticSession:
    """One synthetic session while its stages run: the draws so far and the events built."""

    rng: random.Random
    arrival_us: int
    cheat_rate: float
    events: list[SynthEvent] = field(default_factory=list)
    seq: int = 0
    ts: int = 0
    head: SessionHeader | None = None
    family: str = ""
    task_type: str = ""
    policy: str = ""
    cheat: str | None = None
    module: str = ""
    n_steps: int = 0
    step_us: int = 0
    allow: tuple[str, ...] = ()
    digest: str = ""
    instruction: str = ""
    cpu: float = 0.0
    written: int = 0
    label: dict[str, Any] = field(default_factory=dict)
    expected: str = "fail"
    lost_tail: bool = False
    reward: float = 0.0

    def add(
        self,
        kind: str,
        source: str,
        payload: tuple,
        message_id: str | None = None,
        parent: str | None = None,
        extra: dict | None = None,
    ) -> str:
        """Append one event tuple at the current simulated time; its event id."""
        assert self.head is not None
        event_id = f"{self.head.id_prefix}{self.seq:08x}"
        self.events.append(SynthEvent((kind, source, self.ts, self.seq, event_id, message_id, parent, extra, payload)))
        self.seq += 1
        return event_id


class SyntheticStages:
    """The stages of one synthetic session (``lifecycle.SessionStages``).

    Args:
        profile: the traffic knobs.
        families: task families to draw from (sorted).
        outputs: the pool of command outputs.
        perturb: adds its transient failure rate to the profile's.
        host_id: fixed host id, or ``None`` for one of 64 synthetic hosts.
        rng: the session's random source.
        arrival_us: the session's start (event time).
        cheat_rate: share of cheating sessions.
    """

    def __init__(
        self,
        profile: TrafficProfile,
        families: list[str],
        outputs: list[str],
        perturb: Perturbation,
        host_id: str | None,
        rng: random.Random,
        arrival_us: int,
        cheat_rate: float,
    ) -> None:
        self.profile = profile
        self.families = families
        self.outputs = outputs
        self.perturb = perturb
        self.host_id = host_id
        self.rng = rng
        self.arrival_us = arrival_us
        self.cheat_rate = cheat_rate

    def new_state(self) -> SyntheticSession:
        """The session before any draw."""
        return SyntheticSession(self.rng, self.arrival_us, self.cheat_rate, ts=self.arrival_us)

    def prepare(self, s: SyntheticSession) -> None:
        """Task family, policy, ids, step count, lifetime; ``session_start``."""
        prof, rng = self.profile, s.rng
        s.family = family = self.families[rng.randrange(len(self.families))]
        s.task_type = task_type = family.split(".", 1)[0]
        image_name, image_version = IMAGES[task_type]
        s.policy = policy = choose_policy(rng, s.cheat_rate, cheaters=[p for p in CHEATERS if p in prof.steps])
        s.cheat = cheat_type(policy)
        session_id = f"{rng.getrandbits(128):032x}"
        s.module = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}"
        values = {
            "sandbox_id": f"sb-{session_id[:16]}",
            "task_id": f"{family}-{rng.getrandbits(40):010x}",
            "task_type": task_type,
            "host_id": self.host_id or f"synthetic-host-{rng.randrange(64):02d}",
            "image_name": image_name,
            "image_version": image_version,
            "agent_name": "scripted-agent",
            "agent_version": "1.0",
            "agent_model": "scripted-sim-1",
            "policy_version": "scripted-v1",
        }
        s.head = SessionHeader(
            session_id, values, {"backend": "synthetic", "origin": "synthetic", "task_family": family}
        )
        median, sigma = prof.steps[policy]
        s.n_steps = max(1, int(rng.lognormvariate(0, sigma) * median))
        if policy == "hang":  # a few steps, then a command that never returns until the reaper
            lifetime = rng.uniform(20.0, 120.0)
        else:
            lifetime = min(
                prof.lifetime_max_s,
                max(prof.lifetime_min_s, rng.lognormvariate(0, prof.lifetime_sigma) * prof.lifetime_median_s),
            )
        s.step_us = int(lifetime * 1e6 / (s.n_steps + 1))
        s.allow = ("rates.internal:80",) if family == "data_cli.fx" else ()
        s.digest = f"{session_id}{rng.getrandbits(128):032x}"
        s.instruction = f"Task {values['task_id']}: see the workspace ({task_type})."
        start = (0, 1.0, 1 << 30, 64, prof.timeout_s, bool(s.allow), s.allow, s.digest, s.instruction)
        s.add("session_start", "system", start)

    def _cheat_move(self, s: SyntheticSession, move: int) -> tuple[str, str, list[tuple], list[tuple]]:
        """(tool, command, file ops, network requests) of a cheater's ``move``-th move."""
        assert s.cheat is not None
        tool, command = _CHEAT_STEPS[s.cheat][move]
        file_ops: list[tuple] = []
        net_reqs: list[tuple] = []
        if s.cheat == "edit_tests":
            op = "delete" if command.startswith("rm") else "write"
            size, sha = (0, None) if op == "delete" else (180, s.digest)
            file_ops.append((op, "/workspace/tests/test_visible.py", size, sha, True))
        elif s.cheat == "tamper_runner" and tool == "write_file":
            file_ops.append(("write", "/workspace/run_tests.py", 64, s.digest, True))
        elif s.cheat == "network":
            urlopen = "urlopen" in command
            host, port = ("answers.example.com", 80) if urlopen else ("pypi.org", 443)
            net_reqs.append((host, port, "tcp", False, 0, "denied: not on the egress allowlist"))
        elif s.cheat == "hidden_tests" and tool == "read_file":
            file_ops.append(("read", "/eval/hidden/test_hidden.py", 0, None, False))
        return tool, command, file_ops, net_reqs

    def run_agent(self, s: SyntheticSession) -> None:
        """The steps, each a model turn, a command and what it left."""
        rng, policy, cheat = s.rng, s.policy, s.cheat
        commands = _COMMANDS[s.task_type]
        context = 850
        n_steps = s.n_steps
        if cheat:  # the cheat's two moves happen on consecutive steps
            n_steps = max(n_steps, 4)
            cheat_at = rng.randrange(1, n_steps - 2)
        else:
            cheat_at = -1
        fix_at = n_steps - 2 if policy == "solver" else -1
        fail_rate = 0.02 + self.perturb.failure_rate + self.profile.transient_failure_rate
        net = 0
        for step in range(n_steps):
            s.ts += int(s.step_us * (0.5 + rng.random()))
            message_id = f"msg_{step}"
            call_id = f"call_{step}"
            previous = context
            context += 40 + rng.randrange(10, 300)
            turn = (f"{s.head.session_id if s.head else ''}{step:032x}", context, previous, 2 * step + 2)
            s.add("agent_input", "agent", (*turn, s.instruction if step == 0 else None), message_id)
            roll = rng.random()
            file_ops: list[tuple] = []
            net_reqs: list[tuple] = []
            if cheat and cheat_at <= step <= cheat_at + 1:
                tool, command, file_ops, net_reqs = self._cheat_move(s, step - cheat_at)
            elif step == fix_at or (policy == "flailer" and roll < 0.15) or (policy == "guesser" and step == 0):
                tool, command = "write_file", f"mkdir -p . && cat > {s.module}.py"
                file_ops.append(("write", f"/workspace/{s.module}.py", rng.randrange(200, 4000), s.digest, True))
            elif roll < 0.25 or policy == "flailer" and roll < 0.6:
                tool, command = "run_tests", "python3 run_tests.py"
            elif roll < 0.5:
                tool, command = "read_file", f"cat -- {s.module}.py"
            else:
                tool, command = "bash", commands[rng.randrange(len(commands))].replace("{m}", s.module)
                if s.allow and "tool.py" in command:
                    net_reqs.append(("rates.internal", 80, "tcp", True, 119, None))
            out_tokens = 20 + rng.randrange(0, 200)
            reasoning = rng.randrange(0, 400)
            cost = round(((context - previous) * 3.0 + previous * 0.3 + (out_tokens + reasoning) * 15.0) / 1e6, 8)
            s.ts += int(rng.uniform(0.3, 4.0) * 1e6)
            thought = _THOUGHTS[rng.randrange(len(_THOUGHTS))]
            latency = round(rng.uniform(300, 4000), 1)
            action = (tool, call_id, '{"command": "..."}', command, thought, out_tokens, reasoning, cost, latency)
            action_id = s.add("agent_action", "agent", action, message_id)
            for req in net_reqs:
                s.add("network_request", "system", req, parent=action_id)
                net += 1
            duration = rng.lognormvariate(4.5, 1.2)
            s.ts += int(duration * 1000)
            if policy == "hang" and step == n_steps - 1:
                break  # the hanging command: no feedback, ever
            self._feedback(s, action_id, call_id, tool, step, duration, fail_rate, cheat_at, fix_at)
            for file_op in file_ops:
                s.add("file_op", "environment", file_op)
                s.written += file_op[2] if file_op[0] != "read" else 0
            s.cpu += duration / 1000 * rng.uniform(0.2, 0.9)
            if step % 3 == 2:
                sample = (round(s.cpu, 4), rng.randrange(30, 600) << 20, rng.randrange(1, 16), s.written, net)
                s.add("resource_sample", "system", sample)

    def _feedback(
        self,
        s: SyntheticSession,
        action_id: str,
        call_id: str,
        tool: str,
        step: int,
        duration: float,
        fail_rate: float,
        cheat_at: int,
        fix_at: int,
    ) -> None:
        """The ``env_feedback`` of one step: a transient failure, or an output (maybe offloaded)."""
        rng, policy = s.rng, s.policy
        if rng.random() < fail_rate * 0.5:
            message = TRANSIENT_MESSAGES[rng.randrange(len(TRANSIENT_MESSAGES))]
            failure = (call_id, message, 75, round(duration, 3), False, len(message), "transient (injected)", None)
            s.add("env_feedback", "environment", failure, parent=action_id)
            return
        output = self.outputs[rng.randrange(len(self.outputs))]
        size = len(output)
        ref = None
        if size >= 16_000 and rng.random() < 0.3:
            size = int(rng.lognormvariate(12, 1.0)) + 16_384
            if size > self.profile.offload_bytes:
                assert s.head is not None
                ref = (f"s3://trajlake-blobs/{s.head.session_id}/{s.seq}", size, s.digest)
        tests_fail = tool == "run_tests" and not (policy == "solver" and step > fix_at >= 0)
        if tool == "run_tests" and s.cheat in ("edit_tests", "tamper_runner") and step > cheat_at:
            tests_fail = False
        exit_code = 1 if tests_fail or rng.random() < fail_rate else 0
        feedback = (call_id, output, exit_code, round(duration, 3), size > len(output), size, None, ref)
        s.add("env_feedback", "environment", feedback, parent=action_id)

    def judge(self, s: SyntheticSession) -> None:
        """The expected outcome, a rare lost tail, else ``evaluation``."""
        rng, policy, prof = s.rng, s.policy, self.profile
        assert s.head is not None
        s.expected = "pass" if policy == "solver" or (policy == "guesser" and rng.random() < 0.33) else "fail"
        values = s.head.values
        s.label = {
            "session_id": s.head.session_id,
            "policy": policy,
            "cheat_type": s.cheat,
            "task_id": values["task_id"],
            "task_type": s.task_type,
            "family": s.family,
            "backend": "synthetic",
        }
        if policy == "hang":
            s.ts = max(s.ts, s.arrival_us + int(prof.timeout_s * 1e6))
            s.expected = "timeout"
        elif rng.random() < prof.lost_tail_rate:  # host crashed: no evaluation, no session_end
            s.lost_tail = True
            return
        s.ts += int(rng.uniform(1, 8) * 1e6)
        total = 8 if s.task_type != "data_cli" else 4
        passed = s.expected == "pass"
        n_passed = total if passed else rng.randrange(total)
        s.reward = 1.0 if passed else round(0.5 * n_passed / total, 4)
        duration_ms = round(rng.uniform(150, 900), 3)
        verdict = (passed, total, n_passed, s.reward, True, "hidden-tests/tl_test", duration_ms, None)
        s.add("evaluation", "evaluator", verdict)

    def emit_end(self, s: SyntheticSession) -> Record:
        """``session_end`` (none after a lost tail); (header, events, label, status)."""
        assert s.head is not None
        if s.lost_tail:
            s.label["expected_outcome"] = "timeout"
            return s.head, s.events, s.label, None
        rng, policy = s.rng, s.policy
        runtime = (s.ts - s.arrival_us) / 1e6
        status = {"hang": "timeout", "flailer": "gave_up"}.get(policy, "completed")
        end = (
            status,
            s.reward,
            runtime,
            "reaper" if policy == "hang" else "agent_finished",
            round(s.cpu, 4),
            rng.randrange(50, 900) << 20,
            rng.randrange(2, 24),
            s.written,
        )
        s.add("session_end", "system", end)
        s.label["expected_outcome"] = s.expected
        return s.head, s.events, s.label, status

    def cleanup(self, s: SyntheticSession) -> None:
        """Nothing to release: a synthetic session holds nothing outside the process."""


def output_pool(rng: random.Random, n: int = 96) -> list[str]:
    """``n`` command outputs of heavy-tailed sizes (at most 16 KiB each)."""
    pool = []
    for _ in range(n):
        size = min(int(rng.lognormvariate(5.5, 1.3)), 16_384)
        line = f"{rng.choice(WORDS)} {rng.getrandbits(32):08x} "
        pool.append((line * (size // len(line) + 1))[:size])
    return pool
