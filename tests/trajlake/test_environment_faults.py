"""Environment faults are one line naming the cause and the path, with their exit code, at once.

Injected for real: a file-size limit (``resource.setrlimit`` in the child), a read-only home (a read-only bind
mount by bubblewrap), no space (a tmpfs just large enough for the lakehouse) and a truncated table metadata
file, for ``ingest``, ``assemble``, ``score``, ``export`` and ``sql``. The lakehouse is built once (on the
embedded broker) and restored at the same path before every fault, so its absolute paths stay true.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.errors import EXIT_CORRUPT, EXIT_ENVIRONMENT

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.slow]

CLI = [sys.executable, "-m", "trajlake.cli"]


def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(["bwrap", "--dev-bind", "/", "/", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


needs_bwrap = pytest.mark.skipif(not _bwrap_works(), reason="needs bubblewrap with mount namespaces (bwrap)")


@dataclass
class Lake:
    home: Path
    env: dict[str, str]
    stages: dict[str, Path]  # a copy of the home after each stage: ingested, assembled, scored

    def restore(self, stage: str) -> None:
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.copytree(self.stages[stage], self.home, symlinks=True)


def run(*args: str, env: dict[str, str], wrap: list[str] | None = None, fsize: int | None = None) -> tuple:
    def limit() -> None:
        assert fsize is not None
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    started = time.monotonic()
    result = subprocess.run(
        [*(wrap or []), *CLI, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit if fsize is not None else None,
    )
    return result, time.monotonic() - started


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, tansu_broker: str) -> Iterator[Lake]:
    root = tmp_path_factory.mktemp("faults")
    home = root / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
    suffix = uuid.uuid4().hex[:8]
    env.update(
        TRAJLAKE_HOME=str(home),
        TRAJLAKE_KAFKA_BOOTSTRAP=tansu_broker,
        TRAJLAKE_TOPIC=f"faults-{suffix}",
        TRAJLAKE_CONSUMER_GROUP=f"faults-{suffix}",
        TRAJLAKE_TOPIC_PARTITIONS="1",
    )
    stages: dict[str, Path] = {}
    for step in (
        ["fleet", "run", "--backend", "synthetic", "--sessions", "6", "--seed", "3"],
        ["ingest", "--until-idle", "2"],
    ):
        result, _ = run(*step, env=env)
        assert result.returncode == 0, result.stderr
    shutil.copytree(home, stages.setdefault("ingested", root / "ingested"), symlinks=True)
    for stage, step in [("assembled", ["assemble"]), ("scored", ["score"])]:
        result, _ = run(*step, env=env)
        assert result.returncode == 0, result.stderr
        shutil.copytree(home, stages.setdefault(stage, root / stage), symlinks=True)
    # more events wait in the topic, for ingest to fail on
    result, _ = run("fleet", "run", "--backend", "synthetic", "--sessions", "4", "--seed", "4", env=env)
    assert result.returncode == 0, result.stderr
    yield Lake(home, env, stages)


COMMANDS = {  # command → the stage it has work to do after
    "ingest": (["ingest", "--until-idle", "2"], "ingested"),
    "assemble": (["assemble"], "assembled_pending"),
    "score": (["score"], "scored_pending"),
    "export": (["export", "--format", "openai", "--outcome", "any", "--out", "{home}/exports/x"], "scored"),
}
STAGE_OF = {"assembled_pending": "ingested", "scored_pending": "assembled"}


def one_line_fault(result: subprocess.CompletedProcess[str], seconds: float, code: int, *words: str) -> str:
    lines = [line for line in result.stderr.splitlines() if not line.startswith(("WARNING ", "INFO "))]
    assert result.returncode == code, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr and "holds the catalog lock" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert seconds < 90, f"{seconds:.0f} s: an environment fault is no lock to wait for"
    return lines[0]


def _args(command: str, lake: Lake) -> tuple[list[str], str]:
    args, stage = COMMANDS[command]
    return [a.replace("{home}", str(lake.home)) for a in args], STAGE_OF.get(stage, stage)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_file_size_limit_is_one_line_at_once(lake: Lake, command: str) -> None:
    args, stage = _args(command, lake)
    lake.restore(stage)
    result, seconds = run(*args, env=lake.env, fsize=1024)
    line = one_line_fault(result, seconds, EXIT_ENVIRONMENT, "file size limit reached (RLIMIT_FSIZE 1,024 bytes")
    assert str(lake.home) in line


@needs_bwrap
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_read_only_home_is_one_line_at_once(lake: Lake, command: str) -> None:
    args, stage = _args(command, lake)
    lake.restore(stage)
    wrap = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(lake.home), str(lake.home)]
    result, seconds = run(*args, env=lake.env, wrap=wrap)
    line = one_line_fault(result, seconds, EXIT_ENVIRONMENT, "read-only file system")
    assert str(lake.home) in line


@needs_bwrap
@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_space_left_is_one_line_at_once(lake: Lake, command: str) -> None:
    args, stage = _args(command, lake)
    source = lake.stages[stage]
    # tmpfs counts whole pages: every file rounded up, every directory a page, some to spare, then filled
    paths = list(source.rglob("*"))
    size = sum(-(-p.stat().st_size // 4096) * 4096 if p.is_file() else 4096 for p in paths) + 64 * 4096
    home = str(lake.home)
    inner = " ".join(f"'{a}'" for a in [*CLI, *args])
    wrap = ["bwrap", "--dev-bind", "/", "/", "--size", str(size), "--tmpfs", home]
    script = f"cp -a '{source}'/. '{home}'/ && (cat /dev/zero > '{home}/.fill' 2>/dev/null; exec {inner})"
    started = time.monotonic()
    result = subprocess.run([*wrap, "sh", "-c", script], env=lake.env, capture_output=True, text=True, timeout=300)
    line = one_line_fault(result, time.monotonic() - started, EXIT_ENVIRONMENT, "no space left on the device")
    assert home in line


def _current_metadata(home: Path, table: str) -> Path:
    return max((home / "hot").rglob(f"{table}/metadata/*.metadata.json"), key=lambda p: p.stat().st_mtime_ns)


@pytest.mark.parametrize(
    ("command", "table"),
    [
        ("ingest", "raw_events"),
        ("assemble", "raw_events"),
        ("score", "trajectories"),
        ("export", "trajectories"),
        ("sql", "trajectories"),
    ],
)
def test_a_truncated_metadata_file_is_one_line_naming_it(lake: Lake, command: str, table: str) -> None:
    if command == "sql":
        args, stage = ["sql", "select count(*) from trajectories"], "scored"
    else:
        args, stage = _args(command, lake)
    lake.restore(stage)
    metadata = _current_metadata(lake.home, table)
    text = metadata.read_bytes()
    metadata.write_bytes(text[: len(text) // 2])
    result, seconds = run(*args, env=lake.env)
    line = one_line_fault(result, seconds, EXIT_CORRUPT, "corrupt table metadata file")
    assert metadata.name in line


@needs_bwrap
def test_sql_reads_a_read_only_home(lake: Lake) -> None:
    lake.restore("scored")
    wrap = ["bwrap", "--dev-bind", "/", "/", "--ro-bind", str(lake.home), str(lake.home)]
    result, _ = run("sql", "select count(*) n from trajectories", "--format", "csv", env=lake.env, wrap=wrap)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["n", "6"]
