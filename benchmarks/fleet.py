"""Fleet benchmarks: sandbox start latency, local throughput, synthetic encoding rate.

``trajlake bench fleet`` (or ``python -m benchmarks.fleet``) prints and returns:

- ``local_first_command_ms_p50/p95``: sandbox creation → first command answered, one at a time;
- ``local_sessions_per_min_c4``: complete local sessions (agent + evaluation) per minute at
  concurrency 4, with their first-command latency under that load;
- ``synthetic_events_per_s`` (re-run templates, the default at scale), ``..._fresh`` (every
  session generated in full) and ``baseline_events_per_s`` (``producers/session_generator.py`` + the
  per-event ``encode_event``), measured in the same process, with the ratios; and
  ``synthetic_events_per_s_parallel_fresh``: the fleet's multi-process mode
  (``trajlake fleet run --workers N``), one shard of the stream per core, events discarded;
- ``synthetic_hour_*``: one hour of 3M/day traffic (``hour_sessions``, 125k) generated that way
  with template reuse, its wall time, rate (``synthetic_events_per_s_parallel``) and speed-up
  over real time.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from producers.fleet import ListSink, percentiles, run_fleet, run_synthetic_workers
from producers.fleet.sandbox import ImageStore, Limits, Sandbox, bwrap_available

START_US = 1_750_000_000_000_000


def sandbox_start_latency(root: Path, n: int = 30) -> dict[str, float]:
    """Creation → first command (``true``) answered, sequentially, in milliseconds."""
    image = ImageStore(root / "images").ensure("trajlake/bench", "1.0.0")
    samples = []
    for i in range(n):
        started = time.monotonic()
        sandbox = Sandbox(f"bench-{i}", root / "sandboxes", image, {"a.txt": "x\n"}, Limits())
        sandbox.run("true")
        samples.append((time.monotonic() - started) * 1000)
        sandbox.stop()
        sandbox.cleanup()
    return percentiles(samples, "local_first_command_ms")


def _synthetic_rate(sessions: int, reuse: float, seed: int = 1) -> tuple[int, float]:
    from producers.fleet.synthetic import SyntheticFleet

    fleet = SyntheticFleet(start_us=START_US, template_reuse=reuse)
    started = time.perf_counter()
    count = 0
    for _ in fleet.stream(sessions, seed, 0.1):
        count += 1
    return count, time.perf_counter() - started


def _baseline_rate(sessions: int) -> tuple[int, float]:
    from producers.session_generator import synthetic_sessions
    from schemas.registry import encode_event

    started = time.perf_counter()
    count = 0
    for session in synthetic_sessions(sessions, seed=1, start_us=START_US):
        for event in session:
            encode_event(event)
            count += 1
    return count, time.perf_counter() - started


def run_benchmarks(
    settings: Any,
    local_sessions: int = 16,
    synthetic_events: int = 300_000,
    seed: int = 0,
    hour_sessions: int = 125_000,
) -> dict[str, float]:
    """Measure and print the fleet's figures; returns them."""
    figures: dict[str, float] = {}
    sessions = max(300, synthetic_events // 62)  # ~62 events per session on average
    base_n, base_s = _baseline_rate(max(200, sessions // 8))
    figures["baseline_events_per_s"] = round(base_n / base_s)
    fresh_n, fresh_s = _synthetic_rate(max(300, sessions // 3), 1.0)
    figures["synthetic_events_per_s_fresh"] = round(fresh_n / fresh_s)
    fast_n, fast_s = _synthetic_rate(sessions, 16.0)
    figures["synthetic_events_per_s"] = round(fast_n / fast_s)
    figures["synthetic_vs_baseline"] = round(figures["synthetic_events_per_s"] / figures["baseline_events_per_s"], 1)
    figures["synthetic_fresh_vs_baseline"] = round(
        figures["synthetic_events_per_s_fresh"] / figures["baseline_events_per_s"], 1
    )
    workers = os.cpu_count() or 1
    if workers > 1:
        # The fleet's own multi-process mode (``trajlake fleet run --workers N``), events discarded
        # instead of sent: generation rate with one shard of the stream per core.
        n = max(300, sessions // 3)
        report = run_synthetic_workers(
            settings, n * workers, 1, 0.1, None, workers, {"start_us": START_US, "template_reuse": 1.0}, to_kafka=False
        )
        figures["synthetic_events_per_s_parallel_fresh"] = report.figures["generation_events_per_s"]
        figures["synthetic_workers"] = workers
    if hour_sessions:
        # What the figure is for: one hour of 3M/day traffic (35 sessions/s), template reuse as at
        # scale, on every core; steady state (the warm-up of fresh templates is a small share).
        report = run_synthetic_workers(
            settings,
            hour_sessions,
            1,
            0.1,
            None,
            workers,
            {"start_us": START_US, "template_reuse": 16.0},
            to_kafka=False,
        )
        figures["synthetic_hour_sessions"] = hour_sessions
        figures["synthetic_hour_events"] = report.events
        figures["synthetic_hour_generation_s"] = round(report.events / report.figures["generation_events_per_s"], 1)
        figures["synthetic_events_per_s_parallel"] = report.figures["generation_events_per_s"]
        figures["synthetic_hour_vs_real_time"] = round(hour_sessions / 35.0 / figures["synthetic_hour_generation_s"], 1)
    if bwrap_available():
        with tempfile.TemporaryDirectory(prefix="tl-bench-") as tmp:
            figures.update(sandbox_start_latency(Path(tmp)))
        sink = ListSink()
        report = run_fleet(
            settings, "local", local_sessions, concurrency=4, seed=seed, cheat_rate=0.2, sink=sink, timeout_s=10
        )
        figures["local_sessions_per_min_c4"] = round(report.sessions_per_min, 1)
        figures["local_sessions_c4"] = report.sessions
        for key in ("first_command_p50", "first_command_p95"):
            if key in report.latency_ms:
                figures[f"local_c4_{key}_ms"] = report.latency_ms[key]
    try:
        figures["load_average_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value if isinstance(value, int) else format(value, 'g')}")
    return figures


def main() -> None:
    """Entry point: ``python -m benchmarks.fleet [local_sessions] [synthetic_events]``."""
    from common.settings import load_settings

    local = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    events = int(sys.argv[2]) if len(sys.argv) > 2 else 300_000
    with tempfile.TemporaryDirectory(prefix="tl-bench-home-") as home:
        run_benchmarks(load_settings(home=home), local_sessions=local, synthetic_events=events)


if __name__ == "__main__":
    main()
