"""What every task family shares: the instance types, the family registry and the generators' helpers."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WORDS = (
    "amber",
    "birch",
    "cobalt",
    "delta",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lumen",
    "maple",
    "nimbus",
    "onyx",
    "pylon",
    "quartz",
    "raven",
    "sierra",
    "tundra",
    "umber",
    "vector",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
)

#: Pinned image per task type: (image name, version). Bumping a version builds a new read-only
#: layer beside the old one; a task type only moves when its pin here changes.
IMAGES: dict[str, tuple[str, str]] = {
    "bugfix": ("trajlake/py-bugfix", "1.3.0"),
    "implement": ("trajlake/py-implement", "1.3.0"),
    "data_cli": ("trajlake/data-cli", "1.3.0"),
}  # 1.1.0: tl_test.py runs one hidden case per process and reports frames (host-side verdict);
# 1.2.0: tl_exec.py is the sandbox init, non-dumpable, nonce-tagged replies (host hardening);
# 1.3.0: tl_test.py's probe also watches unittest's judging machinery, import hooks and planted test modules


@dataclass(frozen=True)
class HiddenCase:
    """One hidden test: what the sandbox gets (``inputs``) and what only the host knows (``expected``).

    Attributes:
        test_id: the test's name (unique within the task).
        kind: ``call`` (import ``inputs['module']``, call ``inputs['func'](*inputs['args'])``) or
            ``cli`` (run ``inputs['script']`` on a file holding ``inputs['csv']``; the outcome is
            its stdout lines).
        inputs: JSON-serializable input of the case.
        expected: JSON-serializable expected outcome (compared on the host, after a JSON round trip).
    """

    test_id: str
    kind: str
    inputs: dict[str, Any]
    expected: Any


@dataclass(frozen=True)
class TaskInstance:
    """One randomized task instance.

    Attributes:
        task_id: family plus a digest of the seed (same seed, same id).
        task_type: one of ``IMAGES``.
        family: the generator's name.
        seed: the instance seed.
        instruction: the task statement given to the agent.
        files: the agent's workspace (relative path → text), visible tests included.
        hidden_tests: the hidden cases as a test file (name → text), for reading and local runs.
        deliverables: the only workspace paths copied to the evaluator.
        solution: a correct version of the deliverables.
        wrong_guess: a plausible but wrong version of the deliverables.
        egress_allowlist: ``host:port`` the sandbox may reach.
        services: ``host:port`` → {HTTP path → body} served behind the allowlist.
        config: per-task configuration, injected as ``TL_*`` environment variables.
        timeout_s: the wall-clock deadline of a session on this task.
    """

    task_id: str
    task_type: str
    family: str
    seed: int
    instruction: str
    files: dict[str, str]
    hidden_tests: dict[str, str]
    deliverables: tuple[str, ...]
    solution: dict[str, str]
    wrong_guess: dict[str, str]
    egress_allowlist: tuple[str, ...] = ()
    services: dict[str, dict[str, str]] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 20.0
    hidden_cases: tuple[HiddenCase, ...] = ()

    @property
    def image(self) -> tuple[str, str]:
        """(image name, pinned version) of this task's type."""
        return IMAGES[self.task_type]

    @property
    def config_digest(self) -> str:
        """sha256 of the per-task configuration and initial files."""
        blob = json.dumps({"config": self.config, "files": self.files, "allow": self.egress_allowlist}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


Generator = Callable[[random.Random, int], TaskInstance]
FAMILIES: dict[str, Generator] = {}


def family(name: str) -> Callable[[Generator], Generator]:
    """Register a task generator under ``name``."""

    def register(func: Generator) -> Generator:
        FAMILIES[name] = func
        return func

    return register


def make_id(name: str, seed: int) -> str:
    """A task id stable for (family, seed)."""
    return f"{name}-{hashlib.sha256(f'{name}:{seed}'.encode()).hexdigest()[:10]}"


def ident(rng: random.Random, n: int = 2) -> str:
    """A random snake_case identifier from ``WORDS``."""
    return "_".join(rng.sample(WORDS, n))


def unit_tests(module: str, func: str, cases: list[tuple[tuple, object]], prefix: str) -> str:
    """A test file asserting ``func(*args) == expected`` for every case."""
    lines = [f"from {module} import {func}", ""]
    for i, (args, expected) in enumerate(cases):
        lines += ["", f"def test_{prefix}_{i}():", f"    assert {func}(*{args!r}) == {expected!r}", ""]
    return "\n".join(lines)


def call_cases(module: str, func: str, cases: list[tuple[tuple, object]], prefix: str) -> tuple[HiddenCase, ...]:
    """``unit_tests``' cases as structured hidden cases (same test ids)."""
    return tuple(
        HiddenCase(f"test_{prefix}_{i}", "call", {"module": module, "func": func, "args": list(args)}, expected)
        for i, (args, expected) in enumerate(cases)
    )


def make_task(name: str, seed: int) -> TaskInstance:
    """The instance of family ``name`` for ``seed``.

    Raises:
        KeyError: unknown family.
    """
    return FAMILIES[name](random.Random(f"{name}:{seed}"), seed)


def task_for(seed: int, index: int) -> TaskInstance:
    """The ``index``-th task of a fleet run seeded with ``seed`` (families round-robin)."""
    names = sorted(FAMILIES)
    return make_task(names[index % len(names)], seed * 1_000_003 + index)
