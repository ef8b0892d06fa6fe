"""``trajlake demo``: the whole pipeline end to end on embedded defaults, with a summary."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from common.broker import broker_status, start_broker
from common.progress import Progress
from common.settings import CATALOG_FILE, Settings
from pipelines.assemble import assemble
from pipelines.export import export_training_set
from pipelines.ingest import run_ingest
from pipelines.score import score_all
from producers.fleet import run_fleet
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query
from warehouse.sql import format_rows

EXAMPLE_QUERIES = [
    (
        "Sessions by status",
        "SELECT status, count(*) AS sessions, round(avg(n_steps), 1) AS avg_steps, "
        "round(avg(duration_s), 1) AS avg_duration_s FROM trajectories GROUP BY status ORDER BY sessions DESC",
    ),
    (
        "Finished (ended by the agent) and passed evaluation, with cost, per task type",
        "SELECT task_type, count(*) AS sessions, round(avg(completed::int), 3) AS finished_rate, "
        "round(avg(coalesce(eval_passed, false)::int), 3) AS passed_eval_rate, "
        "round(sum(cost_usd), 2) AS cost_usd, sum(output_tokens) AS output_tokens "
        "FROM trajectories GROUP BY task_type ORDER BY task_type",
    ),
    (
        "Most failing commands",
        "SELECT command, count(*) AS runs, sum((exit_code <> 0)::int) AS failures FROM steps "
        "GROUP BY command ORDER BY failures DESC, runs DESC LIMIT 5",
    ),
]


#: Shares of cheating agents the demo plants on purpose, so that there is cheating for the flags to catch.
LOCAL_CHEAT_RATE = 0.25
SYNTHETIC_CHEAT_RATE = 0.05


@dataclass
class DemoReport:
    """What the demo did, step by step."""

    sessions_emitted: int = 0
    events_emitted: int = 0
    cheaters_planted: int = 0
    steps: dict[str, Any] = field(default_factory=dict)


def run_demo(
    settings: Settings,
    sessions: int = 500,
    seed: int | None = None,
    echo: Callable[[str], None] = print,
    local_sessions: int = 8,
    progress: Callable[[str], AbstractContextManager[Progress | None]] = lambda _: nullcontext(),
) -> DemoReport:
    """Broker → fleet (local sandboxes + synthetic traffic) → ingest → assemble → score → summary → what next.

    Safe to run repeatedly: each run emits new sessions (a fresh seed unless given)
    and every stage is idempotent. ``progress(stage)`` gives each stage's progress sink.
    """
    report = DemoReport()
    new = not settings.catalog_is_external and not (settings.home_path / CATALOG_FILE).exists()
    echo(f"lakehouse: {settings.home_dir} (TRAJLAKE_HOME{', new' if new else ''})")
    if not settings.kafka_bootstrap:
        state = start_broker(settings)
        echo(f"broker: embedded tansu at {state.bootstrap}")
    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    _say_cheaters_planted(sessions, local_sessions, echo)
    _run_fleets(settings, report, sessions, local_sessions, seed, echo, progress)
    echo(f"emitted this run: {report.sessions_emitted} sessions, {report.events_emitted} events")
    _run_stages(settings, report, echo, progress)
    _summarise(settings, echo)
    return report


def _say_cheaters_planted(sessions: int, local_sessions: int, echo: Callable[[str], None]) -> None:
    """Say that the demo plants cheaters on purpose, and how many, so that its flags are read as those caught."""
    planted = [
        f"{LOCAL_CHEAT_RATE:.0%} of {local_sessions} real-sandbox sessions" if local_sessions else "",
        f"{SYNTHETIC_CHEAT_RATE:.0%} of {sessions} synthetic ones" if sessions else "",
    ]
    if any(planted):
        echo(
            f"cheaters: the demo plants cheating agents on purpose ({' and '.join(p for p in planted if p)}), "
            "so the flags it shows are those cheaters caught"
        )


def _run_fleets(
    settings: Settings,
    report: DemoReport,
    sessions: int,
    local_sessions: int,
    seed: int,
    echo: Callable[[str], None],
    progress: Callable[[str], AbstractContextManager[Progress | None]],
) -> None:
    """The local fleet's real sandboxes, then the synthetic reference traffic; what they emitted into ``report``."""
    # Real sandboxes first (bubblewrap; the synthetic fleet stands in when it is unavailable).
    if local_sessions:
        with progress("fleet[local]") as shown:
            local = run_fleet(
                settings,
                "local",
                local_sessions,
                concurrency=4,
                seed=seed,
                cheat_rate=LOCAL_CHEAT_RATE,
                fallback=True,
                progress=shown,
            )
        for note in local.notes:
            echo(f"fleet: {note}")
        echo(f"fleet[{local.backend}]: {local.sessions} sessions, {local.events} events in {local.wall_s:.1f} s")
        report.sessions_emitted, report.events_emitted = local.sessions, local.events
        report.cheaters_planted = local.cheaters
    # Then the reference traffic, placed far enough in the past that sessions which never ended are
    # already past the idle deadline, so the demo shows them closed as timed out.
    start_us = int((time.time() - settings.session_idle_timeout_s - 3600) * 1_000_000)
    with progress("fleet[synthetic]") as shown:
        synthetic = run_fleet(
            settings,
            "synthetic",
            sessions,
            seed=seed,
            cheat_rate=SYNTHETIC_CHEAT_RATE,
            start_us=start_us,
            progress=shown,
        )
    echo(
        f"fleet[synthetic]: {synthetic.sessions} sessions, {synthetic.events} events (seed {seed}) "
        f"in {synthetic.wall_s:.1f} s"
    )
    report.sessions_emitted += synthetic.sessions
    report.events_emitted += synthetic.events
    report.cheaters_planted += synthetic.cheaters


def _run_stages(
    settings: Settings,
    report: DemoReport,
    echo: Callable[[str], None],
    progress: Callable[[str], AbstractContextManager[Progress | None]],
) -> None:
    """Ingest, assemble, score and export, each said in one line and kept in ``report.steps``."""
    with progress("ingest") as shown:
        ingest_stats = run_ingest(settings, until_idle=3.0, progress=shown)
    report.steps["ingest"] = ingest_stats.as_dict()
    echo(
        f"ingest: {ingest_stats.events} events, {ingest_stats.dead_letters} dead letters, "
        f"{ingest_stats.batches} batches in {ingest_stats.seconds:.1f} s"
    )
    lake = Lakehouse.open(settings)  # ingest made it; every stage from here is handed the one lakehouse
    with progress("assemble") as shown:
        assemble_stats = assemble(lake, progress=shown)
    report.steps["assemble"] = assemble_stats.as_dict()
    echo(
        f"assemble: {assemble_stats.sessions} sessions, {assemble_stats.steps_written} steps "
        f"in {assemble_stats.seconds:.1f} s"
    )
    with progress("score") as shown:
        score_stats = score_all(lake, progress=shown)
    report.steps["score"] = score_stats.as_dict()
    echo(
        f"score: {score_stats.sessions} sessions, {score_stats.flagged_sessions} flagged for cheating "
        f"({report.cheaters_planted} cheaters planted this run), "
        f"{score_stats.duplicate_sessions} duplicates, {score_stats.exportable} exportable "
        f"(mean quality {score_stats.mean_quality}) in {score_stats.seconds:.1f} s"
    )
    with progress("export") as shown:
        # the training set a user takes from here: verified successes, never the synthetic load fleet's
        exported = export_training_set(lake, "hf", lake.home / "exports" / "hf" / "demo", progress=shown)
    report.steps["export"] = exported.as_dict()
    echo(
        f"export: {exported.records} SFT records (hf) from {exported.sessions} sessions "
        f"({', '.join(f'{o} {n}' for o, n in sorted(exported.per_origin.items())) or 'none'}) "
        f"to {exported.out_dir}; left out of {exported.considered}: {exported.left_out_summary()}"
    )


def _summarise(settings: Settings, echo: Callable[[str], None]) -> None:
    """The whole lakehouse's counts, the example queries with their answers, and what to run next."""
    columns, rows = run_query(
        settings,
        "SELECT (SELECT count(*) FROM trajectories) AS trajectories, (SELECT count(*) FROM events) AS events, "
        "(SELECT count(*) FROM dead_letters) AS dead_letters",
    )
    echo("\nSummary (whole lakehouse)\n" + format_rows(columns, rows, "table"))
    for title, query in EXAMPLE_QUERIES:
        echo(f'\n{title}:\n  trajlake sql "{query}"\n' + format_rows(*run_query(settings, query), "table"))
    for line in next_steps(settings):
        echo(line)


def next_steps(settings: Settings) -> list[str]:
    """The demo's last lines: three commands to run next (on this lakehouse) and the broker's state."""
    port = settings.ui_port
    commands = [
        ("trajlake show --flagged", "the most severe flagged session: steps, output, evaluation, evidence"),
        ("trajlake report --out trajlake-report", "the lakehouse as HTML: open trajlake-report/index.html"),
        ("trajlake ui", f"the Dagster UI on http://127.0.0.1:{port} (Ctrl-C stops it)"),
    ]
    width = max(len(command) for command, _ in commands)
    lines = ["\nNext:"] + [f"  {command:<{width}}  # {why}" for command, why in commands]
    if settings.kafka_bootstrap:
        lines.append(f"Kafka: {settings.kafka_bootstrap} (TRAJLAKE_KAFKA_BOOTSTRAP); the demo started no broker.")
    else:
        state = broker_status(settings)
        if state is not None:
            lines.append(
                f"The embedded broker is still running at {state.bootstrap} (pid {state.pid}): "
                "`trajlake broker stop` stops it (events not yet ingested are lost with it)."
            )
    return lines
