"""Long stages say how far they got, and the command line shows it on a terminal only.

Each stage is run with a recorder as its ``Progress``: the counts must rise to the total the
stage reports at the end. Then the command line runs under a pseudo-terminal (a bar with
done/total appears on stderr) and with pipes (no bar, no terminal control codes).
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from common.progress import ProgressCounter
from common.settings import Settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set
from pipelines.score import score_all
from producers.fleet import ListSink, run_fleet
from producers.importers import import_paths
from tests.helpers import AS_OF, real_runs_dir, sample_events, write_raw
from warehouse.lakehouse import Lakehouse

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

REAL_RUNS = real_runs_dir()


class Recorder:
    """A Progress that keeps every call (thread-safe)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int | None, str]] = []
        self._lock = threading.Lock()

    def __call__(self, done: int, total: int | None = None, unit: str = "items") -> None:
        with self._lock:
            self.calls.append((done, total, unit))

    def rising(self, unit: str) -> list[int]:
        done = [d for d, _, u in self.calls if u == unit]
        assert done == sorted(done), f"{unit} went backwards: {done}"
        return done


def test_counter_counts_across_threads() -> None:
    recorder = Recorder()
    counter = ProgressCounter(recorder, 400, "sessions")

    def work() -> None:
        for _ in range(100):
            counter.add()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.done == 400 and max(d for d, _, _ in recorder.calls) == 400
    assert {t for _, t, _ in recorder.calls} == {400}


def test_synthetic_fleet_reports_every_session(settings: Settings) -> None:
    recorder = Recorder()
    report = run_fleet(settings, "synthetic", 50, seed=3, sink=ListSink(decode=False), progress=recorder)
    done = recorder.rising("sessions")
    assert done[-1] == report.sessions == 50 and recorder.calls[-1][1] == 50
    assert len(done) >= 50  # one call per session, not one at the end


@pytest.mark.slow
def test_assembly_scoring_and_export_report_their_units(settings: Settings, tmp_path: Path) -> None:
    write_raw(settings, sample_events(30))
    assembled, scored, exported = Recorder(), Recorder(), Recorder()
    stats = assemble(Lakehouse.open(settings), as_of=AS_OF, progress=assembled)
    assert assembled.rising("sessions")[-1] == stats.sessions == 30
    score_stats = score_all(Lakehouse.open(settings), progress=scored)
    assert scored.rising("sessions indexed")[-1] == score_stats.changed_sessions
    assert scored.rising("sessions scored")[-1] == score_stats.rescored_sessions > 0
    export = export_training_set(
        Lakehouse.open(settings), "openai", tmp_path / "out", min_quality=0.0, progress=exported, filters=ALL_ORIGINS
    )
    assert exported.rising("records") == list(range(1, export.records + 1))


@pytest.mark.skipif(not (REAL_RUNS / "manifest.json").is_file(), reason=f"real trajectories absent at {REAL_RUNS}")
def test_import_reports_each_file() -> None:
    files = [REAL_RUNS / "mini-swe-agent" / "django__django-11099.traj.json", REAL_RUNS / "openhands" / "basic.json"]
    recorder = Recorder()
    import_paths(files, lambda event: None, progress=recorder)
    assert recorder.calls == [(1, 2, "files"), (2, 2, "files")]


def _run_in_terminal(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``command`` with stderr on a pseudo-terminal (stdout a pipe): its exit code and what the terminal got."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL)
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side closed: the process is done with its terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    process.communicate(timeout=300)
    return process.returncode, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
@pytest.mark.integration
def test_the_command_line_draws_progress_on_a_terminal_and_nothing_in_a_pipe(tmp_path: Path, tansu_broker: str) -> None:
    from common.broker import ensure_topic

    suffix = tmp_path.name[-12:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    env.update(
        TRAJLAKE_HOME=str(tmp_path / "home"),
        TRAJLAKE_KAFKA_BOOTSTRAP=tansu_broker,
        TRAJLAKE_TOPIC=f"progress-{suffix}",
        TERM="xterm",
        COLUMNS="120",
    )
    ensure_topic(tansu_broker, env["TRAJLAKE_TOPIC"], 1)
    # paced so that the bar is redrawn while the run goes on: sessions live up to 20 simulated minutes, 2.4 s here
    command = [sys.executable, "-m", "trajlake.cli", "fleet", "run", "--backend", "synthetic", "--sessions", "200"]
    command += ["--rate", "100", "--time-compression", "500"]
    code, terminal = _run_in_terminal(command, env)
    assert code == 0, terminal
    terminal = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)  # colours and cursor moves
    assert re.search(r"fleet\[synthetic\].*\d+/200 sessions", terminal), terminal[-2000:]
    assert "200/200" in terminal and "sessions/s" in terminal
    piped = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == ""  # no bar, no control codes: a log keeps the result lines only
    assert "fleet[synthetic]: 200 sessions" in piped.stdout
    code, dumb = _run_in_terminal(command, {**env, "TERM": "dumb"})  # a terminal that cannot redraw a line
    assert code == 0 and "200/200" not in dumb and "\x1b[" not in dumb
