"""The ``trajlake`` command line: a thin shell over the packages.

Every command honours ``TRAJLAKE_HOME`` (default ``./.trajlake``). Domain errors print one red
line and exit with code 1 (75 when retrying may help); a usage error (unknown command, option or
value) prints one line with the suggestion and exits with 2. Commands that read a lakehouse
refuse a ``TRAJLAKE_HOME`` holding none; commands that create one say where.

Start-up is kept short: this module imports only typer and the bottom layer's errors; every
command imports what it uses when it runs.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.main
from typer import _click
from typer.core import TyperGroup

from benchmarks.cli import bench_app
from common.errors import EXIT_ERROR, EXIT_TRANSIENT, TrajlakeError, environment_fault, is_transient
from trajlake.console import err, out, print_error, print_note, progress_bar
from trajlake.fleet import fleet_app
from trajlake.home import announce_new_lakehouse, open_lakehouse, settings_for

#: Exit code of a usage error (click's and typer's convention).
EXIT_USAGE = 2


class HelpGroup(TyperGroup):
    """A command group whose help lists each command's summary in full, wrapped (click cuts it with "...")."""

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# rich_markup_mode=None on every app: click's plain help, which wraps to any width (rich's option tables
# squeeze the help column to a few characters at 80 columns); tests/trajlake/test_cli_usage.py checks it.
app = typer.Typer(
    cls=HelpGroup,
    rich_markup_mode=None,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="trajlake: agent trajectories lakehouse.",
)
broker_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="The embedded Kafka-compatible broker.")
app.add_typer(broker_app, name="broker", cls=HelpGroup)
app.add_typer(fleet_app, name="fleet", cls=HelpGroup)
app.add_typer(bench_app, name="bench", cls=HelpGroup)  # the benchmark commands live beside the benchmarks


class OutputFormat(StrEnum):
    """Output formats of ``trajlake sql``."""

    table = "table"
    csv = "csv"
    json = "json"


@broker_app.command("start")
def broker_start(port: Annotated[int | None, typer.Option(help="Port; a free one by default.")] = None) -> None:
    """Start the embedded broker (if not running), create the event topic, print its address."""
    from common.broker import start_broker

    state = start_broker(settings_for("any"), port=port)
    out.print(state.bootstrap)


@broker_app.command("stop")
def broker_stop(
    force: Annotated[
        bool, typer.Option("--force", help="Stop even though events in it are not in the lakehouse yet (lost).")
    ] = False,
) -> None:
    """Stop the embedded broker; refused while events in it are not yet ingested (its storage is in memory)."""
    from common.broker import broker_status, stop_broker
    from common.errors import BrokerError

    settings = settings_for("any")
    state = broker_status(settings) if settings.home_path.is_dir() else None
    if state is None:
        if settings.home_path.is_dir():
            stop_broker(settings)  # clears a dead broker's state files
        out.print("not running")
        return
    from pipelines.ingest.observe import uningested

    try:
        pending = uningested(settings, state.bootstrap)
    except TrajlakeError as exc:
        if not force:
            raise BrokerError(f"cannot tell what is not ingested yet ({exc}); `--force` stops it anyway") from exc
        pending = None
    if pending is not None and pending.total:
        where = ", ".join(f"partition {p}: {n:,}" for p, n in sorted(pending.by_partition.items()))
        what = f"{pending.total:,} events in topic {settings.topic} are not in the lakehouse yet ({where})"
        if not force:
            raise BrokerError(
                f"{what}; the broker keeps them only in memory: run `trajlake ingest --until-idle 5` "
                "first, or `trajlake broker stop --force` to drop them"
            )
        print_note(f"dropping {what}")
    stop_broker(settings)
    out.print("stopped")


@broker_app.command("status")
def broker_status_cmd() -> None:
    """Print the broker address, or exit 1 when none is running."""
    from common.broker import broker_status
    from common.errors import BrokerNotRunning

    settings = settings_for("any")
    if settings.kafka_bootstrap:
        out.print(f"{settings.kafka_bootstrap} (TRAJLAKE_KAFKA_BOOTSTRAP)")
        return
    state = broker_status(settings) if settings.home_path.is_dir() else None
    if state is None:
        raise BrokerNotRunning(f"no embedded broker running under {settings.home_path / 'broker'}")
    out.print(f"{state.bootstrap} (pid {state.pid}, log {state.log})")


@app.command()
def ingest(
    until_idle: Annotated[float | None, typer.Option(help="Drain, then exit after this many idle seconds.")] = None,
    follow: Annotated[bool, typer.Option(help="Run until SIGTERM/SIGINT (finishes the batch).")] = False,
) -> None:
    """Kafka → raw events / dead letters, exactly once."""
    if follow and until_idle is not None:
        raise typer.BadParameter("use either --until-idle or --follow")
    from pipelines.ingest import run_ingest

    settings = settings_for("any")
    with announce_new_lakehouse(settings), progress_bar("ingest") as progress:
        stats = run_ingest(settings, until_idle=until_idle, follow=follow, progress=progress)
    out.print(
        f"ingested {stats.events} events, {stats.dead_letters} dead letters, {stats.skipped} already present, "
        f"{stats.batches} batches in {stats.seconds:.1f} s"
    )
    for line in stats.describe_resets():  # topic resets and retention gaps must never pass silently
        out.print(f"[yellow]{line}[/yellow]")


@app.command()
def assemble(
    full: Annotated[bool, typer.Option(help="Recompute every session.")] = False,
    as_of: Annotated[
        datetime | None, typer.Option(help="'Now' for idle timeouts (ISO time, UTC); wall clock by default.")
    ] = None,
) -> None:
    """Raw events → hot trajectories and steps (incremental)."""
    from datetime import UTC

    from pipelines.assemble import AssembleOptions
    from pipelines.assemble import assemble as run_assemble

    settings = settings_for("read")
    options = AssembleOptions.from_settings(settings)
    lake = open_lakehouse(settings)
    when = as_of.replace(tzinfo=UTC) if as_of else None
    with progress_bar("assemble") as progress:
        stats = run_assemble(lake, full=full, as_of=when, progress=progress, options=options)
    out.print(
        f"assembled {stats.sessions} sessions ({stats.steps_written} steps) from {stats.new_files} new files "
        f"in {stats.seconds:.1f} s"
    )
    if stats.nulled_sessions or stats.skipped_sessions:
        out.print(
            f"  quarantined: {stats.nulled_sessions} sessions with out-of-range values NULLed, "
            f"{stats.skipped_sessions} left out (see the quarantine view)",
            markup=False,
        )


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A read-only DuckDB query over the trajlake views.")],
    format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Print values byte for byte: control characters (terminal escapes) in table output "
            "and formula-like CSV cells are passed through unchanged.",
        ),
    ] = False,
) -> None:
    """Read-only DuckDB SQL over events, trajectories, steps, scores, flags, …

    The query runs in a process of its own, killed at TRAJLAKE_SQL_TIMEOUT_S and capped at
    TRAJLAKE_SQL_MEMORY_LIMIT; rows are printed as they arrive (table: the first
    TRAJLAKE_SQL_TABLE_ROWS rows and the count).
    """
    settings = settings_for("read")
    from warehouse.query import stream_query
    from warehouse.sql_output import write_rows

    # Data is printed byte for byte (after neutralising, unless --raw): rich would turn ``:x:``
    # into an emoji even with markup off.
    try:
        with stream_query(settings, query) as result:
            rows = result.rows()
            write_rows(result.columns, rows, format.value, sys.stdout, raw=raw, table_rows=settings.sql_table_rows)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``| head``): the query was stopped on the way out; exit quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None


@app.command()
def demo(
    sessions: Annotated[int, typer.Option(min=1)] = 500,
    seed: Annotated[int | None, typer.Option(help="Fleet seed; random by default.")] = None,
    local_sessions: Annotated[int, typer.Option(min=0, help="Sessions in real local sandboxes first.")] = 8,
) -> None:
    """Everything end to end on embedded defaults, with a summary."""
    from trajlake.demo import run_demo

    run_demo(
        settings_for("any"),
        sessions=sessions,
        seed=seed,
        local_sessions=local_sessions,
        echo=lambda line: out.print(line, markup=False),
        progress=progress_bar,
    )


@app.command()
def ui(
    port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (TRAJLAKE_UI_PORT, 3000 by default).")] = None,
) -> None:
    """The Dagster UI on this project's definitions (stopping it stops every Dagster process it started)."""
    from trajlake.supervise import run_supervised
    from trajlake.ui_env import prepare_dagster_home, ui_environment

    settings = settings_for("any")
    port = settings.ui_port if port is None else port
    dagster_home = prepare_dagster_home(settings.home_dir / "dagster")
    # answers only to 127.0.0.1 and localhost (DNS rebinding), without Dagster's supersession warning
    env = ui_environment({**os.environ, "DAGSTER_HOME": str(dagster_home), "TRAJLAKE_HOME": str(settings.home_dir)})
    dagster = Path(sys.executable).with_name("dagster")
    command = [
        str(dagster) if dagster.exists() else "dagster",
        *("dev", "-m", "dagster_project.definitions", "-h", "127.0.0.1", "-p", str(port)),
    ]
    code = run_supervised(
        command,
        env,
        grace_s=settings.ui_stop_timeout_s,
        on_signal=lambda _: print_note("stopping Dagster (webserver, daemon, code servers)…"),
    )
    raise typer.Exit(code)


class ImportFormat(StrEnum):
    """Recorded-run formats of ``trajlake import``."""

    auto = "auto"
    swe_agent = "swe-agent"
    mini_swe_agent = "mini-swe-agent"
    openhands = "openhands"
    openhands_v1 = "openhands-v1"
    atif = "atif"
    harbor = "harbor"
    otel = "otel"


def _visible(text: str) -> str:
    """``text`` with every character that is not printable (controls, escapes, bidi) shown as its code."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


@app.command("import")
def import_runs(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Recorded runs: files (.traj, .traj.json, .json, .jsonl, OTLP JSON) or directories "
            "(Harbor trials and jobs, OpenHands conversations saved one event per file, trees of runs); a path that "
            "gives no session fails the command."
        ),
    ] = None,
    format: Annotated[
        ImportFormat,
        typer.Option(
            "--format",
            "-f",
            metavar="FORMAT",
            help=f"The runs' format: {', '.join(f.value for f in ImportFormat)} (auto: told by each file).",
        ),
    ] = ImportFormat.auto,
    verdicts: Annotated[
        Path | None,
        typer.Option(
            "--verdicts",
            help="Harness reports (SWE-bench keyed or flat, summaries, Multi-SWE-bench, Harbor result.json): "
            "a file or a directory. With PATHS they join those runs; alone, the assembled sessions of their "
            "instances. Matched by exact instance id; verdicts that match no session fail the command.",
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option("--listen", help="Receive OTLP/HTTP traces on HOST:PORT (e.g. 127.0.0.1:4318) until Ctrl-C."),
    ] = None,
) -> None:
    """Import runs recorded by other agent frameworks into the event stream (Kafka); re-imports are idempotent."""
    if not paths and verdicts is None and listen is None:
        raise typer.BadParameter("give PATHS, --verdicts or --listen")
    from pipelines.intake.importing import import_runs as run_import
    from producers.importers import ImportFormatError
    from producers.sdk import EventProducer

    settings = settings_for("read" if verdicts is not None and not paths else "any")
    # the importers redact every event before splitting large texts into parts: no second pass here
    with EventProducer.from_settings(host_id="importer", redact=False) as producer:
        if listen is not None:
            _import_listen(listen, producer, settings)
            return
        with progress_bar("import") as progress:
            run = run_import(
                settings, list(paths or []), producer, format=format.value, verdicts=verdicts, progress=progress
            )
    _print_imported(run, paths)
    failures = _import_failures(run, paths or [])
    if run.attached is not None:
        _print_attached(run.attached)
    if failures:
        raise ImportFormatError("import", "; ".join(failures))


def _import_listen(listen: str, producer: Any, settings: Any) -> None:
    """``import --listen``: receive OTLP/HTTP traces on ``listen`` until Ctrl-C or SIGTERM, then say what came in.

    Both signals get a handler of their own: a process started in the background by a non-interactive shell (or a
    supervisor) inherits SIGINT ignored, and Python then never raises ``KeyboardInterrupt`` for it.
    """
    import signal
    import threading

    from pipelines.intake.importing import listen as start_receiver
    from producers.importers.otlp_receiver import read_credentials

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    receiver = start_receiver(  # names come from the client: printed as text, never as markup
        listen,
        producer,
        lambda s: out.print(
            f"{_visible(s.position)}: session {s.session_id}, {s.steps} steps", markup=False, highlight=False
        ),
        token=settings.otlp_token,
        credentials=read_credentials(settings.otlp_tokens_file) if settings.otlp_tokens_file else None,
        settings=settings,
    )
    out.print(f"receiving OTLP/HTTP traces at {receiver.endpoint} (Ctrl-C to stop)", markup=False)
    while not stop.wait(1):
        pass
    receiver.stop()
    out.print(f"received {receiver.spans_received} spans, sent {receiver.sessions_sent} sessions")


def _print_imported(run: Any, paths: list[Path] | None) -> None:
    """One line per imported session, then what was quarantined, not sent or skipped, and the totals."""
    for summary in run.report.summaries:
        where = f" ({summary.position})" if summary.position else ""
        out.print(
            f"{summary.path}{where}: {summary.framework} session {summary.session_id}, "
            f"{summary.events} events, {summary.steps} steps",
            markup=False,
        )
        if summary.set_aside:
            out.print(f"  set aside: {summary.set_aside}", markup=False)
    # a path that gave no session at all is named with its reason in the one-line error below
    whole = tuple(f"{path}: " for path, _ in run.report.empty)
    for item in run.report.quarantined:
        if not str(item).startswith(whole):
            err.print(f"quarantined {item}", markup=False)
    for session_id, why in run.failed:
        err.print(f"not sent: session {session_id}: {why}", markup=False)
    if run.report.skipped:
        out.print(f"skipped {len(run.report.skipped)} files that are no recorded run", markup=False)
    if paths:
        out.print(
            f"imported {len(run.report.summaries)} sessions, {sum(s.events for s in run.report.summaries)} events"
            + (
                f"; {len(run.report.quarantined) + len(run.failed)} quarantined"
                if run.report.quarantined or run.failed
                else ""
            )
        )


def _print_attached(attached: Any) -> None:
    """What ``--verdicts`` attached: verdicts for no session, instances run several times, errors, totals."""
    for verdict in attached.unknown:
        err.print(f"no session for {verdict.instance_id} ({verdict.source}): kept in quarantine", markup=False)
    for instance, count in attached.shared.items():
        out.print(f"{instance}: verdict attached to {count} sessions (several runs of one instance)", markup=False)
    for line in attached.errors:
        err.print(line, markup=False)
    passed = sum(1 for _, _, ok in attached.attached if ok)
    out.print(
        f"attached {len(attached.attached)} verdicts ({passed} passed) from {attached.files} files; "
        f"{len(attached.unknown)} for unknown instances, {len(attached.unevaluated)} not evaluated by the harness"
    )


def _import_failures(run: Any, paths: list[Path]) -> list[str]:
    """What an import could not do, each a clause of the one-line error it exits with (empty when all went in)."""
    failures = []
    empty = run.report.empty
    if empty:
        named = "; ".join(f"{path}: {why}" for path, why in empty[:3]) + (
            f"; and {len(empty) - 3} more" if len(empty) > 3 else ""
        )
        failures.append(f"{len(empty)} of {len(paths)} paths gave no session ({named})")
    if run.verdict_instances and run.unmatched_verdicts:
        unmatched, total = run.unmatched_verdicts, run.verdict_instances
        failures.append(
            f"{len(unmatched)} of {len(total)} verdicts match no imported session by instance id "
            f"(first: {unmatched[0]})"
        )
    attached = run.attached
    if attached is not None:
        if not attached.instances and not attached.unevaluated:
            why = f" ({attached.errors[0]})" if attached.errors else ""
            failures.append(f"the verdict files hold no verdict{why}")
        elif attached.unknown or not attached.attached:
            failures.append(
                f"{len(attached.unknown)} of {attached.instances} verdicts match no assembled session by instance id "
                "(kept in quarantine)"
            )
    return failures


quality_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Quality layer: evaluation against ground truth."
)
app.add_typer(quality_app, name="quality", cls=HelpGroup)


class ExportFormat(StrEnum):
    """Training-set formats of ``trajlake export``."""

    hf = "hf"
    openai = "openai"
    sharegpt = "sharegpt"
    rl = "rl"
    atif = "atif"
    verl = "verl"
    skyrl = "skyrl"


@app.command()
def score(
    force: Annotated[
        bool, typer.Option(help="Rescore every session from its events, even if nothing changed.")
    ] = False,
) -> None:
    """Quality scores, cheat flags, anomalies and duplicates: incremental (what changed since the last run)."""
    from pipelines.score import ScoreOptions, score_all

    settings = settings_for("read")
    options = ScoreOptions.from_settings(settings)
    lake = open_lakehouse(settings)
    with progress_bar("score") as progress:
        stats = score_all(lake, force=force, progress=progress, options=options)
    if not stats.skipped and stats.sessions == 0:
        out.print("nothing to score: there are no trajectories yet (run `trajlake assemble` first)")
        return
    if stats.skipped:
        out.print(f"scores up to date (trajectories snapshot {stats.trajectories_snapshot_id}, {stats.scorer_version})")
        return
    out.print(
        f"scored {stats.sessions} sessions ({stats.scorer_version}): {stats.flagged_sessions} flagged for cheating, "
        f"{stats.duplicate_sessions} duplicates in {stats.clusters} clusters, {stats.exportable} exportable, "
        f"mean quality {stats.mean_quality} in {stats.seconds:.1f} s"
    )
    out.print(
        f"  {stats.mode}: facts of {stats.changed_sessions} sessions recomputed, "
        f"{stats.rescored_sessions} sessions over {stats.affected_days} days rescored"
    )
    if stats.flags_by_type:
        out.print("  flags: " + ", ".join(f"{k}={v}" for k, v in stats.flags_by_type.items()))
    phases = {k: v for k, v in stats.phases.items() if "." not in k}
    if phases:
        out.print("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))


@app.command()
def export(
    format: Annotated[ExportFormat, typer.Option("--format", "-f", help="Training-set format.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write (nothing is written outside it).")],
    min_quality: Annotated[
        float | None, typer.Option(help="Quality threshold (default: TRAJLAKE_QUALITY_MIN for hf/openai/sharegpt, 0).")
    ] = None,
    outcome: Annotated[
        str | None,
        typer.Option(
            help="success, failure, any (every evaluated policy session) or all (every ended session); "
            "default: success for hf/openai/sharegpt, any for rl, all for atif."
        ),
    ] = None,
    day: Annotated[datetime | None, typer.Option(help="Only sessions started on this UTC day.")] = None,
    force: Annotated[
        bool,
        typer.Option(help="Export into a directory holding other files too (kept; the earlier export is replaced)."),
    ] = False,
    origin: Annotated[
        str | None,
        typer.Option(
            help="Only these origins, comma-separated: sandbox, synthetic, sdk, otlp, import (every "
            "import:<format>), import:<format>, or all. Default: every origin but synthetic "
            "(the load generator's text)."
        ),
    ] = None,
    policy_version: Annotated[str | None, typer.Option(help="Only this policy version.")] = None,
    task_family: Annotated[str | None, typer.Option(help="Only this task family.")] = None,
    since: Annotated[datetime | None, typer.Option(help="Only sessions started at or after this time (UTC).")] = None,
    until: Annotated[datetime | None, typer.Option(help="Only sessions started before this time (UTC).")] = None,
    split: Annotated[str | None, typer.Option(help="train, validation or test (by task family).")] = None,
    group_complete: Annotated[bool, typer.Option(help="Only rollout groups whose K attempts all finished.")] = False,
    parquet: Annotated[bool, typer.Option(help="Parquet instead of JSON lines (--format rl).")] = False,
) -> None:
    """Export trajectories as a training set plus manifest.json (SFT formats: verified successes only)."""
    from datetime import UTC

    from pipelines.export import ExportFilters, ExportOptions, export_training_set
    from pipelines.export.select import parse_origins

    settings = settings_for("read")
    lake = open_lakehouse(settings)
    filters = ExportFilters(
        origins=parse_origins(origin),
        min_quality=min_quality,
        outcome=outcome,
        day=day.date() if day else None,
        policy_version=policy_version,
        task_family=task_family,
        since=since.replace(tzinfo=since.tzinfo or UTC) if since else None,
        until=until.replace(tzinfo=until.tzinfo or UTC) if until else None,
        split=split,
        group_complete=group_complete,
    )
    with progress_bar("export") as progress:
        stats = export_training_set(
            lake,
            format.value,
            out_dir,
            force=force,
            filters=filters,
            parquet=parquet,
            progress=progress,
            options=ExportOptions.from_settings(settings),
        )
    for name, sha in stats.files.items():
        out.print(f"{out_dir / name}  sha256 {sha}", markup=False)
    out.print(f"exported {stats.records} trajectories ({stats.format}) to {stats.out_dir}; manifest {stats.manifest}")
    if stats.quarantined:
        out.print(f"  {stats.quarantined} sessions could not be exported (see the quarantine view)", markup=False)
    if stats.left_out:
        out.print(f"  of {stats.considered} sessions considered, left out: {stats.left_out_summary()}", markup=False)


@app.command()
def show(
    session: Annotated[
        str | None, typer.Argument(help="A session id, or a prefix of one that only it has.", show_default=False)
    ] = None,
    flagged: Annotated[
        bool, typer.Option("--flagged", help="The most severe flagged session (security first, then the newest).")
    ] = False,
    full: Annotated[
        bool, typer.Option(help="Print every message, output and file whole (default: long ones cut, saying so).")
    ] = False,
    pager: Annotated[
        bool | None,
        typer.Option(
            "--pager/--no-pager",
            help="Page the output ($PAGER, else less). Default: on a terminal.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """One session: its flags with their evidence, scores as arithmetic, each model call's messages and reply,
    each step's command and output, files written as diffs, the evaluation."""
    if (session is None) == (not flagged):
        raise typer.BadParameter("give a SESSION id or --flagged (not both)")
    settings = settings_for("read")
    import sys
    from contextlib import nullcontext

    from pipelines.report.inspect import load_session, most_severe_flagged
    from trajlake.console import SafeConsole
    from trajlake.show import render_session

    lake = open_lakehouse(settings)
    with lake.views() as con:
        detail = load_session(lake, session if session is not None else most_severe_flagged(con), con)
    # wrapped to the terminal (the result console keeps long lines whole for pipes and copying)
    console = SafeConsole(highlight=False)
    paged = sys.stdout.isatty() if pager is None else pager
    # less shows colours with -R (and -F leaves a short session on screen); a $PAGER or $LESS of one's own wins
    os.environ.setdefault("LESS", "-FRX")
    styles = bool(os.environ.get("PAGER")) or "r" in os.environ["LESS"].lower()
    with console.pager(styles=styles) if paged else nullcontext():
        render_session(console, detail, full=full)


@app.command()
def report(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the HTML report into (created).")],
    export_dir: Annotated[
        Path | None, typer.Option("--export", help="Report on this export (its directory) instead of the lakehouse.")
    ] = None,
    max_pages: Annotated[
        int | None, typer.Option(min=0, help="Session pages at most (flagged first); TRAJLAKE_REPORT_MAX_SESSIONS.")
    ] = None,
) -> None:
    """A static HTML report: pass rates, quality and cost plots, flagged sessions and one page per session."""
    settings = settings_for("read")
    from pipelines.report import write_report

    pages = settings.report_max_sessions if max_pages is None else max_pages
    with progress_bar("report") as progress:
        stats = write_report(
            open_lakehouse(settings), out_dir, export_dir=export_dir, max_pages=pages, progress=progress
        )
    out.print(
        f"report of {stats.sessions} sessions ({stats.flagged} flagged, {stats.pages} session pages) "
        f"in {stats.seconds:.1f} s: {stats.index}",
        markup=False,
    )


@quality_app.command("evaluate")
def quality_evaluate(
    labels: Annotated[Path, typer.Option("--labels", help="Ground-truth labels JSONL from `trajlake fleet run`.")],
    inject: Annotated[int, typer.Option(help="Near-duplicates to inject for the dedup evaluation.")] = 500,
    seed: Annotated[int, typer.Option(help="Seed of the injection.")] = 0,
) -> None:
    """Precision, recall and false-positive rate of the cheat flags and the deduplication."""
    from pipelines.score.ground_truth import evaluate_quality

    result = evaluate_quality(open_lakehouse(settings_for("read")), labels, inject=inject, seed=seed)
    out.print(result.table(), markup=False)


schema_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Event schema versions and compatibility.")
app.add_typer(schema_app, name="schema", cls=HelpGroup)


class CompatibilityMode(StrEnum):
    """Avro compatibility levels of ``trajlake schema check``."""

    backward = "backward"
    forward = "forward"
    full = "full"


@schema_app.command("check")
def schema_check(
    old: Annotated[Path | None, typer.Option(help="Old .avsc; with --new checks just this pair.")] = None,
    new: Annotated[Path | None, typer.Option(help="New .avsc; default: every shipped version pairwise.")] = None,
    mode: Annotated[
        CompatibilityMode, typer.Option(case_sensitive=False, help="Avro resolution rules to check.")
    ] = CompatibilityMode.backward,
) -> None:
    """Reject a schema change that breaks Avro compatibility (e.g. a new required field without default)."""
    from schemas.compat import Compatibility, IncompatibleSchema, assert_compatible, check_shipped, load_schema

    level = Compatibility(mode.value)
    if (old is None) != (new is None):
        raise typer.BadParameter("give both --old and --new, or neither to check the shipped versions")
    if old is not None and new is not None:
        assert_compatible(load_schema(old), load_schema(new), level, f"{new} (from {old})")
        out.print(f"{new} is {level.value.upper()} compatible with {old}")
        return
    failures = {pair: problems for pair, problems in check_shipped(level).items() if problems}
    if failures:
        (first_old, first_new), problems = next(iter(failures.items()))
        raise IncompatibleSchema(
            f"event schema v{first_new} is not {level.value.upper()} compatible with v{first_old}: "
            + "; ".join(problems)
        )
    out.print(f"all shipped event schema versions are pairwise {level.value.upper()} compatible")


@app.command()
def tier(
    as_of: Annotated[
        datetime | None, typer.Option(help="'Now' the hot retention counts back from (ISO time, UTC).")
    ] = None,
) -> None:
    """Move data older than the hot retention (TRAJLAKE_HOT_RETENTION_DAYS) to the cold tier."""
    from datetime import UTC

    from warehouse.tiering import TierOptions
    from warehouse.tiering import tier as run_tier

    settings = settings_for("read")
    when = as_of.replace(tzinfo=UTC) if as_of else None
    stats = run_tier(open_lakehouse(settings), as_of=when, options=TierOptions.from_settings(settings))
    out.print(
        f"tiered before {stats.boundary}: days {', '.join(stats.days_tiered) or 'none'}; "
        f"{stats.events_copied} events, {stats.sessions_copied} sessions, {stats.steps_copied} steps copied; "
        f"{stats.event_files_removed} hot event files and {stats.sessions_removed} hot sessions removed"
        + (f"; deferred (open sessions): {', '.join(stats.days_deferred)}" if stats.days_deferred else "")
        + f" in {stats.seconds:.1f} s"
    )


@app.command()
def maintain() -> None:
    """Compact small files, expire old snapshots, remove orphans; files and bytes per table before/after."""
    from warehouse.maintenance import MaintainOptions
    from warehouse.maintenance import maintain as run_maintain

    settings = settings_for("read")
    reports = run_maintain(open_lakehouse(settings), options=MaintainOptions.from_settings(settings))
    out.print(f"{'table':<28} {'files':>13} {'MiB':>17} {'max/partition':>13} {'expired':>7} {'orphans':>7}")
    for r in reports:
        b, a = r.before, r.after
        out.print(
            f"{r.table:<28} {b.files:>6} → {a.files:<4} {b.bytes / 2**20:>7.2f} → {a.bytes / 2**20:<7.2f} "
            f"{b.max_files_per_partition:>5} → {a.max_files_per_partition:<5} {r.snapshots_expired:>7} "
            f"{r.orphans_removed:>7}"
        )


def _usage_error(exc: typer.TyperException) -> int:
    """Print a usage error as one line (with typer's suggestion and where to find help); its exit code.

    A command group called without a command has already printed its help: nothing more is said.
    """
    code = int(getattr(exc, "exit_code", EXIT_USAGE))
    # typer validates values with pydantic, whose wording ("Value error, ...") says nothing to a user
    message = exc.format_message().replace(": Value error, ", ": ").strip()
    if message:
        context = getattr(exc, "ctx", None)
        path = getattr(context, "command_path", None) if context is not None else None
        print_error(message + (f" (see '{path} --help')" if path else ""))
    return code


def _finite_numbers_only(command: Any) -> Any:
    """``command`` (and its subcommands) refusing NaN and infinity for every number option or argument.

    ``float`` parses ``nan`` and ``inf``; a bound (``min=0``) lets ``inf`` through and an unbounded
    option takes both, so ``--max-cost-usd inf`` or ``--timeout nan`` would be a cap that never
    holds. Every parameter of every command is checked after conversion, so no float option added
    later can forget it: a usage error (exit 2) naming the option.
    """
    for param in command.params:
        convert = param.process_value

        def finite(ctx: Any, value: Any, convert: Any = convert, param: Any = param) -> Any:
            result = convert(ctx, value)
            values = result if isinstance(result, list | tuple) else [result]
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                raise typer.BadParameter(f"{value!r} is not a finite number", ctx=ctx, param=param)
            return result

        param.process_value = finite
    for sub in getattr(command, "commands", {}).values():
        _finite_numbers_only(sub)
    return command


def main() -> None:
    """Console entry point: run the app, turning trajlake errors into one red line.

    The exit code is 1, or 75 (``EX_TEMPFAIL``) when the error is transient, so a scheduler
    can tell "retry later" from "fix something first"; 2 for a usage error. Files and
    directories trajlake creates (under TRAJLAKE_HOME, exports) are owner-only: the umask is 0o077.
    """
    os.umask(0o077)  # lakehouse data and exports may hold trajectories' secrets: no group/world access
    logging.basicConfig(
        level=os.environ.get("TRAJLAKE_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        # without standalone mode click hands back a command's ``typer.Exit`` code instead of exiting
        code = _finite_numbers_only(typer.main.get_command(app))(standalone_mode=False)
    except TrajlakeError as exc:
        fault = environment_fault(exc)
        if fault is not None and fault is not exc:  # a stage's error raised from a refused write: name the cause
            detail = fault.cause if fault.path == "?" or fault.path in str(exc) else str(fault)
            print_error(f"{str(exc).strip()} ({detail})")
            sys.exit(fault.exit_code)
        print_error(str(exc).strip() or type(exc).__name__)
        sys.exit(getattr(exc, "exit_code", None) or (EXIT_TRANSIENT if is_transient(exc) else EXIT_ERROR))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print_error("aborted")
        sys.exit(EXIT_ERROR)
    except typer.TyperException as exc:  # usage errors: typer's own (vendored) click exceptions derive from it
        sys.exit(_usage_error(exc))
    except Exception as exc:  # what the environment refused, as libraries raise it (else a bug: its traceback)
        fault = environment_fault(exc, os.environ.get("TRAJLAKE_HOME"))
        if fault is None:
            raise
        print_error(str(fault))
        sys.exit(fault.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
