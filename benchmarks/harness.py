"""What every benchmark shares: figures with their same-run baseline, a home with its own broker, RSS probes.

The machine is shared and noisy, so a single absolute time misleads; every
benchmark reports ``figure``, ``baseline`` and ``ratio`` side by side. Each runs
on its own ``TRAJLAKE_HOME`` (a temporary directory by default) with its own
embedded broker when it needs Kafka, and returns a plain dict.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.broker import ensure_topic, resolve_bootstrap, start_broker, stop_broker, wait_for_kafka
from common.settings import Settings, load_settings
from producers.sdk import EventProducer

BASE_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


@dataclass
class Figure:
    """A measured figure, its same-run baseline, and what "better" means."""

    name: str
    value: float
    baseline: float
    unit: str
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        """value / baseline (speed-up when higher is better), or baseline / value for times."""
        if self.higher_is_better:
            return self.value / self.baseline if self.baseline else float("inf")
        return self.baseline / self.value if self.value else float("inf")

    def line(self) -> str:
        """One printable line: figure, baseline, ratio."""
        unit = self.unit
        return f"{self.name}: {self.value:,.3g} {unit}  baseline {self.baseline:,.3g} {unit}  ratio {self.ratio:.2f}×"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output."""
        return {
            "name": self.name,
            "value": self.value,
            "baseline": self.baseline,
            "unit": self.unit,
            "ratio": self.ratio,
        }


def encoded_events(n_events: int, seed: int = 11) -> list[tuple[str, str, bytes]]:
    """``(session_id, event_id, value)`` of ``n_events`` events of synthetic fleet traffic, pre-encoded.

    Encoding happens before any timing: benchmarks measure what happens after a
    sandbox host has produced bytes. The traffic is the synthetic fleet's (Poisson
    arrivals, the reference tool mix and output sizes), in event-time order.
    """
    from producers.fleet.synthetic import SyntheticFleet

    out: list[tuple[str, str, bytes]] = []
    fleet = SyntheticFleet(start_us=BASE_US)
    while len(out) < n_events:
        sessions = max(10, (n_events - len(out)) // 40)
        stream = fleet.stream(sessions, seed, 0.05)
        out.extend((session_id, event_id, value) for _, session_id, event_id, value in stream)
        seed += 1
    return out[:n_events]


@contextlib.contextmanager
def bench_home(home: Path | None = None, kafka: bool = True) -> Iterator[Settings]:
    """Settings on a fresh TRAJLAKE_HOME, with a running embedded broker and topic when ``kafka``."""
    with contextlib.ExitStack() as stack:
        if home is None:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trajlake-bench-")))
        settings = load_settings(home=home, topic=f"bench-{uuid.uuid4().hex[:8]}")
        if kafka and settings.kafka_bootstrap is None:
            state = start_broker(settings)
            stack.callback(stop_broker, settings)
            settings = load_settings(home=home, topic=settings.topic, kafka_bootstrap=state.bootstrap)
        if kafka:
            wait_for_kafka(resolve_bootstrap(settings))
            ensure_topic(resolve_bootstrap(settings), settings.topic, settings.topic_partitions)
        yield settings


def produce_encoded(settings: Settings, records: list[tuple[str, str, bytes]]) -> float:
    """Send pre-encoded records and wait for acks; returns seconds taken."""
    producer = EventProducer(resolve_bootstrap(settings), settings.topic, "bench-host")
    started = time.perf_counter()
    for session_id, event_id, value in records:
        producer.send(session_id, event_id, value)
    producer.flush(600)
    return time.perf_counter() - started


def timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def print_figures(name: str, figures: list[Figure], result: dict[str, Any]) -> None:
    print(f"== bench {name} ==")
    for figure in figures:
        print("  " + figure.line())
    for key, value in result.items():
        if key != "figures":
            print(f"  {key}: {value:,.4g}" if isinstance(value, float) else f"  {key}: {value}")


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def cli_env(settings: Settings, **overrides: str) -> dict[str, str]:
    """``TRAJLAKE_*`` variables that point a child ``trajlake`` at ``settings``' home, broker, topic, namespace."""
    env = {
        "TRAJLAKE_HOME": str(settings.home_dir),
        "TRAJLAKE_TOPIC": settings.topic,
        "TRAJLAKE_NAMESPACE": settings.namespace,
    }
    if settings.kafka_bootstrap:
        env["TRAJLAKE_KAFKA_BOOTSTRAP"] = settings.kafka_bootstrap
    return {**env, **overrides}


def cli_child(args: list[str], env: dict[str, str]) -> Any:
    """``python -m trajlake.cli *args`` as a child process with ``env`` added (stderr kept for errors)."""
    import os
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "trajlake.cli", *args],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def child_peak_rss(args: list[str], env: dict[str, str]) -> tuple[int, float]:
    """Run ``python -m trajlake.cli *args`` as a child; returns its peak tree RSS (bytes) and seconds."""
    started = time.perf_counter()
    child = cli_child(args, env)
    peak = 0
    while child.poll() is None:
        peak = max(peak, tree_rss_bytes(child.pid))
        time.sleep(0.1)
    if child.returncode != 0:
        raise RuntimeError(
            f"trajlake {' '.join(args)} exited {child.returncode}: {child.stderr.read().decode()[-2000:]}"
        )
    return peak, time.perf_counter() - started


def files_per_partition(table: Any) -> list[dict[str, Any]]:
    """Live data files of ``table`` per partition: files, rows, mean file size (MB)."""
    files = table.inspect.files().select(["partition", "record_count", "file_size_in_bytes"]).to_pylist()
    by_partition: dict[str, list[dict[str, Any]]] = {}
    for row in files:
        by_partition.setdefault(str(row["partition"]), []).append(row)
    return [
        {
            "partition": key,
            "files": len(rows),
            "rows": sum(r["record_count"] for r in rows),
            "mean_file_mb": round(sum(r["file_size_in_bytes"] for r in rows) / len(rows) / 1e6, 2),
        }
        for key, rows in sorted(by_partition.items())
    ]
