"""``trajlake bench startup``: how long the command line takes to answer, against a bare interpreter.

Three commands run as a person runs them (fresh processes, the installed entry point), interleaved
round by round so that a busy machine slows each of them alike: ``python -c pass`` (the floor every
Python program pays), ``trajlake --help`` and a one-row ``trajlake sql "SELECT 1"`` on a small
lakehouse. The figures are median wall seconds and their ratio to the floor.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _entry_point() -> list[str]:
    """The installed ``trajlake`` script beside this interpreter, else ``python -m trajlake.cli``."""
    script = Path(sys.executable).with_name("trajlake")
    return [str(script)] if script.exists() else [sys.executable, "-m", "trajlake.cli"]


def _wall(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=300)
    return time.perf_counter() - started


def bench_startup(rounds: int = 7) -> dict[str, float]:
    """Median wall seconds of each command over ``rounds`` interleaved rounds, and ratios to the floor.

    Raises:
        subprocess.CalledProcessError: a command failed.
    """
    from common.settings import load_settings
    from warehouse.sql import open_views

    with tempfile.TemporaryDirectory(prefix="trajlake-startup-") as tmp:
        home = Path(tmp) / "home"
        open_views(load_settings(home=home)).close()  # a lakehouse with every table, no rows
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJLAKE_")}
        env.update(TRAJLAKE_HOME=str(home))
        trajlake = _entry_point()
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "trajlake --help": [*trajlake, "--help"],
            'trajlake sql "SELECT 1"': [*trajlake, "sql", "SELECT 1"],
        }
        for command in commands.values():  # warm the page cache: the first run of each reads files from disk
            _wall(command, env)
        walls: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(rounds):
            for name, command in commands.items():
                walls[name].append(_wall(command, env))
    medians = {name: statistics.median(values) for name, values in walls.items()}
    floor = medians["python -c pass"]
    print(f"start-up, median of {rounds} interleaved rounds (wall seconds; ratio to python -c pass):")
    for name, seconds in medians.items():
        print(f"  {name:<26} {seconds:7.3f} s  {seconds / floor:6.1f}x")
    figures = {f"{name} s": round(seconds, 3) for name, seconds in medians.items()}
    figures.update({f"{name} ratio": round(seconds / floor, 1) for name, seconds in medians.items()})
    return figures
