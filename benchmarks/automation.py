"""Automation latency: a closed session's ``session_end`` send → visible in ``trajectories`` and in ``scores``.

The control plane as a user runs it: ``trajlake ingest --follow`` tails the topic and the Dagster
daemon runs our definitions (``ingest_observer`` reports each new ``raw_events`` snapshot, the
``lakehouse_automation`` sensor launches the eager assembly, then the eager scoring). Baseline in
the same run, on the same broker and home (own topic and namespace, one after the other): the
same ingest with a plain ``trajlake assemble && trajlake score`` loop run back to back by the
benchmark, no Dagster.

Traffic: the synthetic fleet at ``rate`` sessions per *wall* second (35/s = 3M sessions/day,
≈2,000 events/s: the reference load of the pipeline). Session lifetimes (20 s–20 min, median
2.5 min of simulated time) are compressed ``time_compression``-fold so they close within the run:
the fleet paces its sends by its simulated clock (``SyntheticFleet.run``: an event of simulated
time ``ts`` is sent at ``start + (ts - first_ts) / time_compression`` of wall time), so it gets
``rate_per_s = rate / time_compression`` simulated arrivals per simulated second, i.e. ``rate``
per wall second. The simulated clock starts at wall "now" (``start_us``): it runs ahead of the
wall clock, never behind it, so assembly's idle deadline never closes a session early. The fleet
is stopped after ``seconds`` of wall time; a session counts as *closed during the run* when its
``session_end`` was sent by then.

What is measured, per closed session: the wall time its ``session_end`` was handed to the Kafka
producer (recorded by the benchmark's sink for every event, so no clock mapping is assumed), and

- **trajectories**: the first time a poll of the table (every ``poll_s``) saw the session's row
  with a status other than ``running``; the row's own ``assembled_at`` (the wall time of the
  assembly run that wrote it: assembly stamps only the sessions it rewrites) is reported too;
- **scores**: ``score_all`` rewrites every row, and ``scored_at`` on each run, and it scores
  running sessions too, so neither the row's presence nor its ``scored_at`` says when the closed
  session was first scored. The poll instead reads which ``trajectories`` snapshot the current
  ``scores`` cover (the ``trajlake.scored-trajectories-snapshot`` table property) and the sessions
  closed *in that snapshot*; a session's time is the first poll that saw it there (and, reported
  too, the ``scored_at`` of that scoring run).

Poll times are upper bounds (a commit is seen up to ``poll_s`` plus one poll later); the row
stamps are lower bounds (taken before the commit). The figures use the poll times.

The floor with automation: up to ``OBSERVE_INTERVAL_S`` (``dagster_project/defs/streaming.py``)
until the observer notices the snapshot, then up to ``AUTOMATION_INTERVAL_S`` until the
automation sensor evaluates, plus the run's launch (a queued run, a run worker process importing
the definitions, a step worker process per step) and assembly; scores add their own step
worker and scoring.

What dominates (daemon logs, 2026-12-01, load average 12–18 on the 2 shared cores): not the
sensor intervals but process start-ups. Eager automation puts trajectories, steps and the
quality tables (and their checks) in *one* run: queued → launched 10–15 s, run worker up
13–19 s, then the default multiprocess executor starts a fresh Python process per step, 30–46 s
each at that load (assembly, scoring and each of ~8 asset checks), so one run lasts ~4 min, and
eager does not start the next run while one is in progress. The intervals add at most 30 s
(15 + 15) to trajectories; lowering ``OBSERVE_INTERVAL_S`` / ``AUTOMATION_INTERVAL_S`` to 5 s did
not help (same traffic: 576 of 2,958 closed sessions still unseen 300 s after the traffic, while with
15 s every one was seen, p95 138 s; the extra ticks compete for the same cores), so they stay at 15 s. Running
automation's steps in the run worker (``in_process_executor``) and the checks outside the
materializing run would remove most of the rest; the floor is then ~interval + interval + launch
(~30 s at that load) + assembly (~5 s).
"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import numpy as np

from benchmarks.harness import Figure, bench_home, cli_env, print_figures
from common.broker import ensure_topic, resolve_bootstrap
from common.settings import Settings
from pipelines.score import SCORED_SNAPSHOT
from producers.fleet import run_fleet
from producers.sdk import EventProducer
from schemas.registry import encode_event
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.tables import SCORES, TRAJECTORIES

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Targets of issue 21 (seconds, p95): closed session → trajectories, → scores.
TRAJECTORIES_TARGET_S = 60.0
SCORES_TARGET_S = 120.0
# The daemon's instance: local storage under the bench home (what `trajlake ui` gets without a
# dagster.yaml), telemetry off so a benchmark does not phone home.
_DAGSTER_YAML = "telemetry:\n  enabled: false\n"


def sensor_intervals() -> dict[str, int]:
    """``OBSERVE_INTERVAL_S`` and ``AUTOMATION_INTERVAL_S`` of the definitions the daemon runs.

    Read from the source, not imported: benchmarks sit beside ``dagster_project``, not above it.
    """
    tree = ast.parse((REPO_ROOT / "dagster_project" / "defs" / "streaming.py").read_text())
    wanted = {"OBSERVE_INTERVAL_S", "AUTOMATION_INTERVAL_S"}
    return {
        node.targets[0].id.lower(): int(ast.literal_eval(node.value))
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in wanted
    }


class _FleetDeadline(Exception):
    """Raised by the sink to stop the fleet at the end of the run (control flow, caught right there)."""


class _TimedSink:
    """Forwards the fleet's encoded events to Kafka, stamping each event's send (wall) time."""

    def __init__(self, producer: EventProducer, deadline: float) -> None:
        self.producer = producer
        self.deadline = deadline
        self.sent: dict[str, float] = {}
        self.sessions: set[str] = set()

    def emit(self, event: dict[str, Any]) -> str:
        """Encode one event dict and send it like an encoded one (the synthetic fleet sends bytes)."""
        self.send(event["session_id"], event["event_id"], encode_event(event))
        return str(event["event_id"])

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Send one event, or stop the fleet once the run's wall time is over."""
        if time.monotonic() >= self.deadline:
            raise _FleetDeadline
        self.sent[event_id] = time.time()
        self.sessions.add(session_id)
        self.producer.send(session_id, event_id, value)


@dataclass
class _Seen:
    """First sightings of closed sessions by the poller (wall times, epoch seconds)."""

    trajectories: dict[str, float] = field(default_factory=dict)
    assembled_at: dict[str, float] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    scored_at: dict[str, float] = field(default_factory=dict)
    polls: int = 0
    poll_errors: int = 0
    last_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


def _epoch(value: datetime) -> float:
    return value.timestamp()


def _poll_once(lake: Lakehouse, seen: _Seen, covered: set[int]) -> None:
    """One look at trajectories (closed rows) and at what the current scores cover."""
    trajectories = lake.table(TRAJECTORIES.name)
    now = time.time()
    closed = (
        trajectories.scan(row_filter="status != 'running'", selected_fields=("session_id", "assembled_at"))
        .to_arrow()
        .to_pylist()
    )
    with seen.lock:
        for row in closed:
            if row["session_id"] not in seen.trajectories:
                seen.trajectories[row["session_id"]] = now
                seen.assembled_at[row["session_id"]] = _epoch(row["assembled_at"])
    scores = lake.table(SCORES.name)
    snapshot = scores.properties.get(SCORED_SNAPSHOT)
    if not snapshot or int(snapshot) in covered:
        return
    now = time.time()
    stamp = scores.scan(selected_fields=("scored_at",), limit=1).to_arrow().column("scored_at").to_pylist()
    scored = (
        trajectories.scan(row_filter="status != 'running'", selected_fields=("session_id",), snapshot_id=int(snapshot))
        .to_arrow()
        .column("session_id")
        .to_pylist()
    )
    covered.add(int(snapshot))
    with seen.lock:
        for session_id in scored:
            if session_id not in seen.scores:
                seen.scores[session_id] = now
                seen.scored_at[session_id] = _epoch(stamp[0]) if stamp else now


def _poller(settings: Settings, seen: _Seen, stop: threading.Event, poll_s: float) -> None:
    covered: set[int] = set()
    lake: Lakehouse | None = None
    while not stop.wait(poll_s):
        try:
            lake = lake or Lakehouse.open(settings)  # once it opens, every poll reads through it
            _poll_once(lake, seen, covered)
        # A poll racing a commit (a file replaced under it) is counted and retried next time.
        except Exception as exc:
            seen.poll_errors += 1
            seen.last_error = f"{type(exc).__name__}: {exc}"[:300]
        seen.polls += 1


class _Children:
    """Child processes, each in its own process group, stopped with SIGTERM then SIGKILL."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
        self.lock = threading.Lock()

    def spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ``command`` in a new session, output to ``logs/name.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            command,
            env={**os.environ, **env},
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with self.lock:
            self.procs.append((proc, log))
        return proc

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        """Drop a child that exited on its own."""
        with self.lock:
            for item in [p for p in self.procs if p[0] is proc]:
                self.procs.remove(item)
                item[1].close()

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
        """SIGTERM the child's process group, SIGKILL it after ``grace_s``."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        # The group may outlive its leader (the daemon's code server, a run worker): kill what is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 0)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                os.killpg(proc.pid, 0)
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        self.forget(proc)

    def stop_all(self) -> None:
        """Stop every child still tracked (newest first)."""
        with self.lock:
            procs = [p for p, _ in reversed(self.procs)]
        for proc in procs:
            self.stop(proc)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "trajlake.cli", *args]


def _loop_assemble_score(
    children: _Children, env: dict[str, str], stop: threading.Event, counts: dict[str, int]
) -> None:
    """The baseline: ``trajlake assemble && trajlake score`` back to back until ``stop``."""
    while not stop.is_set():
        for step in ("assemble", "score"):
            if stop.is_set():
                return
            proc = children.spawn(f"loop-{step}", _cli(step), env)
            proc.wait()
            children.forget(proc)
            counts[step] = counts.get(step, 0) + 1
            if proc.returncode != 0:
                counts["failed"] = counts.get("failed", 0) + 1
                break


def _wait_for_log(path: Path, needle: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{path.stem} exited {proc.returncode}: {path.read_text()[-2000:]}")
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        time.sleep(1)
    raise RuntimeError(f"{path.stem} did not log {needle!r} within {timeout_s:.0f} s: {path.read_text()[-2000:]}")


def _stats(values: list[float], name: str) -> dict[str, float]:
    if not values:
        return {}
    array = np.array(values)
    return {
        f"{name}_p50_s": round(float(np.percentile(array, 50)), 2),
        f"{name}_p95_s": round(float(np.percentile(array, 95)), 2),
        f"{name}_max_s": round(float(array.max()), 2),
    }


def _run_phase(
    settings: Settings,
    mode: str,
    seconds: float,
    rate: float,
    time_compression: float,
    poll_s: float,
    max_wait_s: float,
    seed: int,
) -> dict[str, Any]:
    """One run of traffic with ``mode`` = ``dagster`` (daemon automation) or ``loop`` (the baseline)."""
    phase = settings.model_copy(
        update={
            "namespace": f"automation_{mode}",
            "topic": f"{settings.topic}-{mode}",
            "consumer_group": f"automation-{mode}-{uuid.uuid4().hex[:6]}",
        }
    )
    ensure_topic(resolve_bootstrap(phase), phase.topic, phase.topic_partitions)
    env = cli_env(phase, TRAJLAKE_CONSUMER_GROUP=phase.consumer_group)
    logs = phase.home_dir / "logs" / mode
    children = _Children(logs)
    stop = threading.Event()
    seen = _Seen()
    counts: dict[str, int] = {}
    threads: list[threading.Thread] = []
    try:
        ingest = children.spawn("ingest", _cli("ingest", "--follow"), env)
        if mode == "dagster":
            dagster_home = phase.home_dir / "dagster"
            dagster_home.mkdir(mode=0o700, parents=True, exist_ok=True)
            (dagster_home / "dagster.yaml").write_text(_DAGSTER_YAML)
            daemon_bin = Path(sys.executable).with_name("dagster-daemon")
            daemon = children.spawn(
                "dagster-daemon",
                [
                    str(daemon_bin) if daemon_bin.exists() else "dagster-daemon",
                    "run",
                    "-m",
                    "dagster_project.definitions",
                ],
                {**env, "DAGSTER_HOME": str(dagster_home), "PYTHONPATH": str(REPO_ROOT)},
            )
            # Traffic starts once the daemon evaluates our sensors (it has loaded the code location).
            _wait_for_log(logs / "dagster-daemon.log", "ingest_observer", 180, daemon)
        else:
            threads.append(
                threading.Thread(target=_loop_assemble_score, args=(children, env, stop, counts), daemon=True)
            )
        time.sleep(8)  # ingest joins its group before traffic begins
        if ingest.poll() is not None:
            raise RuntimeError(
                f"ingest --follow exited {ingest.returncode}: {(logs / 'ingest.log').read_text()[-2000:]}"
            )
        threads.append(threading.Thread(target=_poller, args=(phase, seen, stop, poll_s), daemon=True))
        for thread in threads:
            thread.start()

        producer = EventProducer(
            resolve_bootstrap(phase), phase.topic, "automation-bench", extra_config={"linger.ms": "5"}
        )
        sink = _TimedSink(producer, time.monotonic() + seconds)
        started = time.monotonic()
        with contextlib.suppress(_FleetDeadline):
            run_fleet(
                phase,
                backend="synthetic",
                # More than the run can send: the sink stops the fleet at the deadline.
                sessions=int(rate * seconds * 2) + 100,
                seed=seed,
                sink=sink,
                rate_per_s=rate / time_compression,
                time_compression=time_compression,
                start_us=time.time_ns() // 1000,
            )
        traffic_s = time.monotonic() - started
        producer.flush(60)

        # Every sent event must land before the closed set is read from the lakehouse.
        deadline = time.monotonic() + max_wait_s
        landed = 0
        while time.monotonic() < deadline:
            landed = int(run_query(phase, "SELECT count(DISTINCT event_id) FROM events")[1][0][0])
            if landed >= len(sink.sent):
                break
            time.sleep(2)
        if landed < len(sink.sent):
            raise RuntimeError(f"{mode}: only {landed} of {len(sink.sent)} sent events reached raw_events")
        ends = dict(run_query(phase, "SELECT session_id, event_id FROM events WHERE event_type = 'session_end'")[1])
        closed = {sid: sink.sent[eid] for sid, eid in ends.items()}
        deadline = time.monotonic() + max_wait_s
        while time.monotonic() < deadline:
            with seen.lock:
                if all(s in seen.trajectories and s in seen.scores for s in closed):
                    break
            time.sleep(1)
        given_up = time.time()
        stop.set()
        for thread in threads:
            thread.join(300)
    finally:
        stop.set()
        children.stop_all()
        for thread in threads:
            thread.join(60)
        children.stop_all()  # a loop child started while the first stop ran
    with seen.lock:
        # A session not seen by the end of the wait counts with the wait's end: a lower bound, so a
        # slow side cannot look faster by leaving its slowest sessions out of the percentiles.
        traj = [seen.trajectories.get(s, given_up) - t for s, t in closed.items()]
        traj_stamp = [seen.assembled_at[s] - t for s, t in closed.items() if s in seen.assembled_at]
        score = [seen.scores.get(s, given_up) - t for s, t in closed.items()]
        score_stamp = [seen.scored_at[s] - t for s, t in closed.items() if s in seen.scored_at]
        measured_traj = sum(s in seen.trajectories for s in closed)
        measured_scores = sum(s in seen.scores for s in closed)
    result: dict[str, Any] = {
        "sessions_started": len(sink.sessions),
        "events_sent": len(sink.sent),
        "traffic_s": round(traffic_s, 1),
        "closed_sessions": len(closed),
        "measured_trajectories": measured_traj,
        "measured_scores": measured_scores,
        "polls": seen.polls,
        "poll_errors": seen.poll_errors,
        **_stats(traj, "trajectories"),
        **_stats(traj_stamp, "trajectories_assembled_at"),
        **_stats(score, "scores"),
        **_stats(score_stamp, "scores_scored_at"),
    }
    if seen.last_error:
        result["last_poll_error"] = seen.last_error
    if counts:
        result["loop_runs"] = counts
    return result


def bench_automation(
    seconds: float = 120.0,
    rate: float = 35.0,
    time_compression: float = 10.0,
    home: Path | None = None,
    poll_s: float = 2.0,
    max_wait_s: float = 300.0,
    seed: int = 21,
) -> dict[str, Any]:
    """Closed session → ``trajectories`` / ``scores`` latency with Dagster automation vs a plain loop.

    Args:
        seconds: wall seconds of traffic per side.
        rate: sessions arriving per wall second (35 = the reference 3M sessions/day).
        time_compression: simulated seconds per wall second (shortens the 20 s–20 min lifetimes).
        home: TRAJLAKE_HOME to use (a temporary directory by default).
        poll_s: seconds between the poller's looks at the tables.
        max_wait_s: after the traffic, the longest wait for the events to land, and then for every
            closed session to be measured (one not seen by then counts with the wait's end).
        seed: the synthetic fleet's seed.

    Returns:
        Per side (``dagster``, ``loop``): counts and p50/p95/max of both latencies; the figures.

    Raises:
        RuntimeError: a child process failed or the events did not all land.
    """
    if seconds <= 0 or rate <= 0 or time_compression <= 0:
        raise ValueError("seconds, rate and time_compression must be positive")
    load_before = os.getloadavg()[0]
    with bench_home(home) as settings:
        dagster = _run_phase(settings, "dagster", seconds, rate, time_compression, poll_s, max_wait_s, seed)
        loop = _run_phase(settings, "loop", seconds, rate, time_compression, poll_s, max_wait_s, seed)
    figures = []
    for table, target in (("trajectories", TRAJECTORIES_TARGET_S), ("scores", SCORES_TARGET_S)):
        key = f"{table}_p95_s"
        if key in dagster:
            # "baseline" = the target: the ratio is target / p95 (≥ 1 meets it).
            figures.append(
                Figure(f"closed session → {table} p95, automation vs target", dagster[key], target, "s", False)
            )
        if key in dagster and key in loop:
            figures.append(
                Figure(
                    f"closed session → {table} p95, automation vs assemble && score loop",
                    dagster[key],
                    loop[key],
                    "s",
                    higher_is_better=False,
                )
            )
    result: dict[str, Any] = {
        "seconds": seconds,
        "rate_per_wall_s": rate,
        "time_compression": time_compression,
        **sensor_intervals(),
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "trajectories_target_over_p95": round(TRAJECTORIES_TARGET_S / dagster["trajectories_p95_s"], 2)
        if dagster.get("trajectories_p95_s")
        else None,
        "scores_target_over_p95": round(SCORES_TARGET_S / dagster["scores_p95_s"], 2)
        if dagster.get("scores_p95_s")
        else None,
        "dagster": dagster,
        "loop": loop,
        "figures": [f.as_dict() for f in figures],
    }
    print_figures("automation", figures, result)
    return result
