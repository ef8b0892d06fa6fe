"""A deterministic synthetic session generator (small; the full synthetic fleet builds on it).

``synthetic_sessions(n, seed)`` yields, per session, the complete list of
events a sandbox host would emit: start, agent input/action/feedback turns with
resource samples and file operations, evaluation and end. A few sessions never
end (they close as timed out in assembly). The same seed gives the same stream.
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from producers.sdk import Event, SessionEmitter

TASK_TYPES = {
    "bugfix": ("trajlake/py-bugfix", "1.4.2"),
    "implement": ("trajlake/py-implement", "1.4.2"),
    "data_cli": ("trajlake/data-cli", "2.0.1"),
}
_COMMANDS = {
    "bugfix": [
        "cat src/{m}.py",
        "python -m pytest -q tests",
        "grep -n 'def ' src/{m}.py",
        "sed -i 's/<=/</' src/{m}.py",
    ],
    "implement": ["cat SPEC.md", "cat src/{m}.py", "python -m pytest -q tests", "python -c 'import {m}'"],
    "data_cli": ["head -n 5 data/{m}.csv", "wc -l data/{m}.csv", "python tool.py data/{m}.csv", "cat README.md"],
}


class _Clock:
    def __init__(self, start_us: int) -> None:
        self.now = start_us

    def advance(self, seconds: float) -> int:
        self.now += int(seconds * 1_000_000)
        return self.now

    def __call__(self) -> int:
        return self.now


def synthetic_session(rng: random.Random, start_us: int, host_id: str = "synthetic-host-0") -> list[Event]:
    """All events of one synthetic session starting at ``start_us``."""
    events: list[Event] = []
    task_type = rng.choice(sorted(TASK_TYPES))
    clock = _Clock(start_us)
    module = f"mod_{rng.randrange(1000):03d}"
    emitter = _emitter(events, rng, clock, task_type, host_id)
    instruction = f"Fix the failing tests in src/{module}.py without editing tests/."
    emitter.start(
        cpu_limit=1.0,
        memory_limit_bytes=1 << 30,
        pids_limit=128,
        timeout_s=600.0,
        network_enabled=False,
        egress_allowlist=[],
        config_digest=hashlib.sha256(module.encode()).hexdigest(),
        instruction=instruction,
    )
    n_steps = max(1, int(rng.lognormvariate(2.3, 0.5)))
    succeeded = rng.random() < 0.6
    hangs = rng.random() < 0.03
    session = _Session(emitter, rng, clock, task_type, module, instruction, n_steps, succeeded)
    input_tokens = 600
    for step in range(n_steps):
        input_tokens = _step(session, step, input_tokens)
    if hangs:  # never ends: assembly closes it as timed out
        return events
    _evaluate_and_end(emitter, rng, clock, start_us, succeeded)
    return events


def _emitter(events: list[Event], rng: random.Random, clock: _Clock, task_type: str, host_id: str) -> SessionEmitter:
    """The session's emitter into ``events``: its ids drawn from ``rng``, a scripted agent in the task type's image."""
    image_name, image_version = TASK_TYPES[task_type]
    return SessionEmitter(
        events.append,
        session_id=uuid.UUID(int=rng.getrandbits(128)).hex,
        clock=clock,
        id_factory=lambda: uuid.UUID(int=rng.getrandbits(128)).hex,
        sandbox_id=f"sb-{rng.getrandbits(48):012x}",
        task_id=f"{task_type}-{rng.randrange(12):02d}",
        task_type=task_type,
        host_id=host_id,
        image_name=image_name,
        image_version=image_version,
        agent_name="scripted",
        agent_version="0.1",
        agent_model="synthetic-1",
        policy_version="solver-v1",
    )


@dataclass
class _Session:
    """What every step of one synthetic session draws on."""

    emitter: SessionEmitter
    rng: random.Random
    clock: _Clock
    task_type: str
    module: str
    instruction: str
    n_steps: int
    succeeded: bool


def _step(session: _Session, step: int, input_tokens: int) -> int:
    """One step: the model's input, a shell command and its feedback (pytest fails unless this is the last step
    of a session that succeeds), a file write for ``sed -i``, a resource sample every third step. Returns the
    input tokens so far."""
    emitter, rng, clock, module = session.emitter, session.rng, session.clock, session.module
    clock.advance(rng.uniform(0.5, 4.0))
    input_tokens += rng.randrange(80, 900)
    message_id = f"msg_{step}"
    emitter.agent_input(
        prompt_digest=hashlib.sha256(f"{emitter.session_id}{step}".encode()).hexdigest(),
        input_tokens=input_tokens,
        cached_tokens=int(input_tokens * 0.7),
        n_messages=2 * step + 2,
        content=session.instruction if step == 0 else None,
        message_id=message_id,
    )
    command = rng.choice(_COMMANDS[session.task_type]).format(m=module)
    clock.advance(rng.uniform(0.3, 3.0))
    action_id = emitter.action(
        "bash",
        command=command,
        thought=f"Step {step}: run `{command}`.",
        output_tokens=rng.randrange(20, 300),
        cost_usd=round(rng.uniform(0.0005, 0.01), 6),
        model_latency_ms=rng.uniform(300, 3000),
        tool_call_id=f"call_{step}",
        message_id=message_id,
    )
    duration = rng.uniform(0.01, 2.5)
    clock.advance(duration)
    failed = "pytest" in command and not (session.succeeded and step == session.n_steps - 1)
    output = (
        f"{rng.randrange(1, 5)} failed, {rng.randrange(3, 9)} passed in {duration:.2f}s"
        if failed
        else "\n".join(f"line {i}: {rng.getrandbits(32):08x}" for i in range(rng.randrange(1, 12)))
    )
    emitter.feedback(
        action_id,
        output=output,
        exit_code=1 if failed else 0,
        duration_ms=duration * 1000,
        tool_call_id=f"call_{step}",
    )
    if "sed -i" in command:
        emitter.file_op("write", f"/workspace/src/{module}.py", size_bytes=rng.randrange(200, 4000))
    if step % 3 == 2:
        emitter.resource_sample(
            cpu_seconds=step * rng.uniform(0.1, 0.5),
            memory_bytes=rng.randrange(30, 400) << 20,
            processes=rng.randrange(1, 12),
            disk_write_bytes=rng.randrange(0, 1 << 20),
        )
    return input_tokens


def _evaluate_and_end(
    emitter: SessionEmitter, rng: random.Random, clock: _Clock, start_us: int, succeeded: bool
) -> None:
    """The hidden tests' verdict, then the session's end with its runtime and peaks."""
    clock.advance(rng.uniform(1, 8))
    tests_total = rng.randrange(4, 12)
    emitter.evaluation(
        passed=succeeded,
        tests_total=tests_total,
        tests_passed=tests_total if succeeded else rng.randrange(tests_total),
        reward=1.0 if succeeded else 0.0,
        fresh_sandbox=True,
        evaluator="hidden-pytest",
        duration_ms=1500.0,
        details=json.dumps({"hidden": True}),
    )
    runtime = (clock.now - start_us) / 1e6
    emitter.end(
        "completed" if succeeded else "failed",
        runtime,
        reward=1.0 if succeeded else 0.0,
        cpu_seconds=runtime * 0.2,
        peak_memory_bytes=rng.randrange(50, 500) << 20,
        peak_processes=rng.randrange(2, 20),
    )


def synthetic_sessions(n: int, seed: int = 0, start_us: int = 0, rate_per_s: float = 35.0) -> Iterator[list[Event]]:
    """``n`` sessions with Poisson arrivals at ``rate_per_s``, starting at ``start_us``."""
    rng = random.Random(seed)
    arrival = start_us
    for _ in range(n):
        arrival += int(rng.expovariate(rate_per_s) * 1_000_000)
        yield synthetic_session(random.Random(rng.getrandbits(64)), arrival)
