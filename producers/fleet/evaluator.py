"""Two-phase evaluation: the deliverable alone, in a fresh sandbox, against the hidden tests.

Phase one is the agent's session. Phase two takes only the task's deliverable paths (changed
source files; never tests, the runner, or anything else) from the agent's writable layer,
places them over the pristine task files in a new sandbox built from the same pinned image,
mounts the hidden tests read-only at ``/eval/hidden`` (they exist nowhere else), and runs the
image's own, read-only test runner. Whatever else the agent changed — edited tests, a patched
runner, files outside the deliverable — never reaches the evaluator; it is only listed.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from producers.fleet.sandbox import Limits, Reaper, Sandbox, SandboxError, SandboxKilled
from producers.fleet.tasks import TaskInstance

EVALUATOR = "hidden-tests/tl_test"
RESULT_PREFIX = "TL_RESULT "


@dataclass
class EvalResult:
    """The evaluator's verdict."""

    passed: bool
    tests_total: int
    tests_passed: int
    duration_ms: float
    deliverable: dict[str, str] = field(default_factory=dict)  # path -> sha256
    ignored_changes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def reward(self) -> float:
        """1.0 when every hidden test passes, else the passed fraction scaled by 0.5."""
        if self.passed:
            return 1.0
        return round(0.5 * self.tests_passed / self.tests_total, 4) if self.tests_total else 0.0

    def payload(self) -> dict[str, object]:
        """The ``evaluation`` event payload."""
        details = {
            "deliverable": self.deliverable,
            "ignored_changes": self.ignored_changes,
            "error": self.error,
        }
        return {
            "passed": self.passed,
            "tests_total": self.tests_total,
            "tests_passed": self.tests_passed,
            "reward": self.reward,
            "fresh_sandbox": True,
            "evaluator": EVALUATOR,
            "duration_ms": round(self.duration_ms, 3),
            "details": json.dumps(details, sort_keys=True),
        }


def collect_deliverable(
    task: TaskInstance, workspace: Path, extra_files: dict[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The deliverable files from an agent's writable layer, and every other changed path.

    Args:
        task: the task instance (its ``files`` are the pristine workspace).
        workspace: the agent's writable layer.
        extra_files: other pristine files placed in the workspace (the runner copy).

    Returns:
        (path → text of each deliverable that exists, sorted paths changed outside the deliverable).
    """
    deliverable: dict[str, str] = {}
    for rel in task.deliverables:
        path = workspace / rel
        if path.is_file() and not path.is_symlink():
            deliverable[rel] = path.read_text(errors="replace")
    pristine = {**task.files, **(extra_files or {})}
    ignored: list[str] = []
    seen: set[str] = set()
    if workspace.is_dir():
        for path in workspace.rglob("*"):
            if path.is_file() or path.is_symlink():
                rel = path.relative_to(workspace).as_posix()
                seen.add(rel)
                if rel in task.deliverables:
                    continue
                original = pristine.get(rel)
                try:
                    changed = original is None or path.read_text(errors="replace") != original
                except OSError:
                    changed = True
                if changed:
                    ignored.append(rel)
    ignored += [rel for rel in pristine if rel not in seen and rel not in task.deliverables]
    return deliverable, sorted(set(ignored))


def evaluate(
    task: TaskInstance,
    deliverable: dict[str, str],
    image: Path,
    sandbox_root: Path,
    reaper: Reaper,
    limits: Limits | None = None,
    ignored_changes: list[str] | None = None,
) -> EvalResult:
    """Run the hidden tests on ``deliverable`` in a fresh sandbox of the pinned ``image``."""
    limits = limits or Limits(timeout_s=30.0)
    started = time.monotonic()
    files = {rel: text for rel, text in task.files.items() if not rel.startswith("tests/")}
    files.update(deliverable)
    eval_id = f"eval-{uuid.uuid4().hex[:12]}"
    hidden_dir = sandbox_root / f"{eval_id}.hidden"
    hidden_dir.mkdir(parents=True)
    for name, text in task.hidden_tests.items():
        (hidden_dir / name).write_text(text)
    shas = {rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in sorted(deliverable.items())}
    result = EvalResult(False, 0, 0, 0.0, shas, ignored_changes or [])
    sandbox = None
    try:
        sandbox = Sandbox(
            eval_id,
            sandbox_root,
            image,
            files,
            limits,
            env=dict(task.config),
            allowlist=task.egress_allowlist,
            services=task.services,
            ro_binds=((hidden_dir, "/eval/hidden"),),
        )
        reaper.watch(sandbox, limits.timeout_s)
        run = sandbox.run("python3 /opt/tl/bin/tl_test.py /eval/hidden --json --root /workspace")
        line = next((ln for ln in reversed(run.output.splitlines()) if ln.startswith(RESULT_PREFIX)), None)
        if line is None:
            result.error = f"no result from the runner (exit {run.exit_code}): {run.output[-300:]}"
        else:
            summary = json.loads(line[len(RESULT_PREFIX) :])
            result.tests_total, result.tests_passed = int(summary["total"]), int(summary["passed"])
            result.passed = run.exit_code == 0 and result.tests_total > 0 and result.tests_passed == result.tests_total
    except SandboxKilled:
        result.error = f"evaluation exceeded its {limits.timeout_s:.0f} s deadline"
    except SandboxError as exc:
        result.error = str(exc)
    finally:
        if sandbox is not None:
            sandbox.stop()
            sandbox.cleanup()
        for path in hidden_dir.iterdir():
            path.unlink()
        hidden_dir.rmdir()
    result.duration_ms = (time.monotonic() - started) * 1000
    return result
