"""``trajlake bench startup``: how long the command line takes to answer, against a bare interpreter.

Three commands run as a person runs them (fresh processes, the installed entry point), interleaved
round by round so that a busy machine slows each of them alike: ``python -c pass`` (the floor every
Python program pays), ``trajlake --help`` and a one-row ``trajlake sql "SELECT 1"`` on a small
lakehouse — from the view plan (:mod:`warehouse.view_plan`, what every query after the first of a
commit does) and, as the baseline, with the plan turned off (``TRAJLAKE_SQL_VIEW_CACHE=false``:
the views opened through the catalog, as every query did before the plan). The figures are median
wall seconds and their ratio to the floor.
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
        uncached = {**env, "TRAJLAKE_SQL_VIEW_CACHE": "false"}
        commands = {
            "python -c pass": ([sys.executable, "-c", "pass"], env),
            "trajlake --help": ([*trajlake, "--help"], env),
            'trajlake sql "SELECT 1"': ([*trajlake, "sql", "SELECT 1"], env),
            "same, no view plan": ([*trajlake, "sql", "SELECT 1"], uncached),
        }
        # Warm the page cache (the first run of each reads files from disk); the first query saves the plan.
        for command, command_env in commands.values():
            _wall(command, command_env)
        walls: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(rounds):
            for name, (command, command_env) in commands.items():
                walls[name].append(_wall(command, command_env))
    medians = {name: statistics.median(values) for name, values in walls.items()}
    floor = medians["python -c pass"]
    print(f"start-up, median of {rounds} interleaved rounds (wall seconds; ratio to python -c pass):")
    for name, seconds in medians.items():
        print(f"  {name:<26} {seconds:7.3f} s  {seconds / floor:6.1f}x")
    planned = medians['trajlake sql "SELECT 1"'] / medians["same, no view plan"]
    print(f"  trajlake sql from the view plan / without it: {planned:.2f}x")
    figures = {f"{name} s": round(seconds, 3) for name, seconds in medians.items()}
    figures.update({f"{name} ratio": round(seconds / floor, 1) for name, seconds in medians.items()})
    figures["view plan ratio"] = round(planned, 2)
    return figures
