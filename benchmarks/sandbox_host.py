"""Benchmark: what a sandbox full of files costs its host per command (``trajlake bench sandbox-host``).

One real sandbox, its quota off so that its layer can hold ``files`` empty files, then the same
agent command (``true``) run through the fleet's tool layer (``AgentContext.call``: the command,
the scan of the layer, the file operations, the events) under two configurations in the same run:

- unbounded: every entry scanned before and after every command, every change hashed and emitted
  (how the host worked before its scans and events were bounded);
- bounded: the default ``Limits`` and ``EventBounds`` (scan entries and seconds, hash bytes, file
  operations per command, events per session).

Printed per configuration: host CPU seconds for the command that made the files and its events,
host CPU per later command, and the ratio. A third line runs the default quota (``auto``): the
files cannot be made at all past the inode quota, and the session ends at ``disk_quota``.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from producers.errors import SandboxLimitReached
from producers.fleet.agents import AgentContext
from producers.fleet.bounds import BoundedEmitter, EventBounds
from producers.fleet.sandbox import ImageStore, Limits, Sandbox
from producers.fleet.sandbox.files import scan_layer
from producers.fleet.tasks import make_task

#: The bench's sandboxes may spend CPU for as long as making the files takes on a loaded machine.
CPU_SECONDS = 3600
UNBOUNDED_LIMITS = Limits(scan_entries=1 << 40, scan_seconds=1e9, hash_bytes=1 << 60, disk_quota="off")
UNBOUNDED_EVENTS = EventBounds(file_ops_per_command=1 << 40, events_per_session=1 << 40)


def _make_files(files: int) -> str:
    # a thousand per directory: a directory of 250,000 entries makes the sandbox itself slow to fill it
    return (
        'python3 -I -S -c "import os\n'
        f"for i in range({files}):\n"
        "    d = 'many/%d' % (i // 1000)\n"
        "    i % 1000 or os.makedirs(d, exist_ok=True)\n"
        "    os.close(os.open('%s/f%d' % (d, i), os.O_CREAT | os.O_WRONLY, 0o644))\"; echo made"
    )


def _measure(root: Path, image: Path, files: int, commands: int, limits: Limits, bounds: EventBounds) -> dict:
    """Host CPU of the command making ``files`` files and of each later command, events emitted."""
    task = make_task("bugfix.clamp", 1)
    events: list[dict] = []
    limits = replace(limits, timeout_s=3600, cpu_seconds=CPU_SECONDS)
    sandbox = Sandbox(f"bench-{time.monotonic_ns()}", root, image, dict(task.files), limits)
    emitter = BoundedEmitter(events.append, bounds.events_per_session, task_id=task.task_id, task_type="bugfix")
    ctx = AgentContext(emitter, sandbox, task, random.Random(1), bounds=bounds, watched=frozenset(task.files))
    unbounded = bounds is UNBOUNDED_EVENTS
    out: dict = {"ended": None}
    try:
        ctx.call("bash", "ls", "warm up")
        started = time.process_time()
        try:
            ctx.call("bash", _make_files(files), "Make the files.")
        except SandboxLimitReached as exc:
            out["ended"] = exc.reason
        out["make_cpu_s"] = time.process_time() - started
        out["make_events"] = len(events)
        per_command = []
        for _ in range(commands if out["ended"] is None else 0):
            if unbounded:
                ctx._snapshot = None  # the host scanned the layer before and after every command
            started = time.process_time()
            ctx.call("bash", "true", "A command that changes nothing.")
            per_command.append(time.process_time() - started)
        out["command_cpu_s"] = sorted(per_command)[len(per_command) // 2] if per_command else None
        out["events"] = len(events)
        # counted by the host after the measurement (a sandbox ended at its quota answers no more commands)
        out["entries"] = len(scan_layer(sandbox.workspace / "many", limit=1 << 40).entries)
    finally:
        sandbox.stop()
        sandbox.cleanup()
    return out


def bench_sandbox_host(files: int = 250_000, commands: int = 5) -> None:
    """Print host CPU per command and events with ``files`` files in a sandbox's layer, bounded vs unbounded."""
    with tempfile.TemporaryDirectory(prefix="trajlake-bench-host-") as directory:
        root = Path(directory)
        image = ImageStore(root / "images").ensure("trajlake/py-bugfix", "bench")
        runs = {
            "unbounded": _measure(root / "sb", image, files, commands, UNBOUNDED_LIMITS, UNBOUNDED_EVENTS),
            "bounded": _measure(root / "sb", image, files, commands, Limits(disk_quota="off"), EventBounds()),
            "bounded+quota": _measure(root / "sb", image, files, commands, Limits(), EventBounds()),
        }
    print(f"a sandbox making {files:,} empty files, then {commands} commands that change nothing (host CPU)")
    header = ("configuration", "files made", "making: cpu s", "events", "per command", "ended")
    print("{:<15} {:>10} {:>14} {:>8} {:>12} {:>11}".format(*header))
    for name, run in runs.items():
        per = f"{run['command_cpu_s'] * 1000:.1f} ms" if run["command_cpu_s"] is not None else "-"
        print(
            f"{name:<15} {run['entries']:>10} {run['make_cpu_s']:>14.2f} {run['make_events']:>8} {per:>12}"
            f" {run['ended'] or '-':>11}"
        )
    before, after = runs["unbounded"]["command_cpu_s"], runs["bounded"]["command_cpu_s"]
    if before and after:
        print(f"per command: bounded / unbounded = {after / before:.3f} ({before / after:.0f}x less host CPU)")
