"""The ``trajlake`` command line: a thin shell over the packages.

Every command honours ``TRAJLAKE_HOME`` (default ``./.trajlake``). Domain errors
print one red line and exit with code 1 (75 when retrying may help).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from benchmarks.cli import bench_app
from common.errors import EXIT_ERROR, EXIT_TRANSIENT, TrajlakeError, is_transient
from common.settings import Settings, load_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help="trajlake: agent trajectories lakehouse.")
broker_app = typer.Typer(no_args_is_help=True, help="The embedded Kafka-compatible broker.")
app.add_typer(broker_app, name="broker")
app.add_typer(bench_app, name="bench")  # the benchmark commands live beside the benchmarks

err = Console(stderr=True, soft_wrap=True)  # an error is one line, however long (no wrapping at 80 columns)
out = Console(highlight=False, soft_wrap=True)


def _settings() -> Settings:
    return load_settings()


class OutputFormat(StrEnum):
    """Output formats of ``trajlake sql``."""

    table = "table"
    csv = "csv"
    json = "json"


@broker_app.command("start")
def broker_start(port: Annotated[int | None, typer.Option(help="Port; a free one by default.")] = None) -> None:
    """Start the embedded broker (if not running), create the event topic, print its address."""
    from common.broker import start_broker

    state = start_broker(_settings(), port=port)
    out.print(state.bootstrap)


@broker_app.command("stop")
def broker_stop() -> None:
    """Stop the embedded broker."""
    from common.broker import stop_broker

    out.print("stopped" if stop_broker(_settings()) else "not running")


@broker_app.command("status")
def broker_status_cmd() -> None:
    """Print the broker address, or exit 1 when none is running."""
    from common.broker import broker_status
    from common.errors import BrokerNotRunning

    settings = _settings()
    if settings.kafka_bootstrap:
        out.print(f"{settings.kafka_bootstrap} (TRAJLAKE_KAFKA_BOOTSTRAP)")
        return
    state = broker_status(settings)
    if state is None:
        raise BrokerNotRunning(f"no embedded broker running under {settings.broker_dir}")
    out.print(f"{state.bootstrap} (pid {state.pid}, log {state.log})")


@app.command()
def ingest(
    until_idle: Annotated[float | None, typer.Option(help="Drain, then exit after this many idle seconds.")] = None,
    follow: Annotated[bool, typer.Option(help="Run until SIGTERM/SIGINT (finishes the batch).")] = False,
) -> None:
    """Kafka → raw events / dead letters, exactly once."""
    from pipelines.ingest import run_ingest

    if follow and until_idle is not None:
        raise typer.BadParameter("use either --until-idle or --follow")
    stats = run_ingest(_settings(), until_idle=until_idle, follow=follow)
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

    from pipelines.assemble import assemble as run_assemble

    stats = run_assemble(_settings(), full=full, as_of=as_of.replace(tzinfo=UTC) if as_of else None)
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
    from warehouse.sql import stream_query
    from warehouse.sql_output import write_rows

    settings = _settings()
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
        _settings(),
        sessions=sessions,
        seed=seed,
        local_sessions=local_sessions,
        echo=lambda line: out.print(line, markup=False),
    )


@app.command()
def ui(port: Annotated[int, typer.Option()] = 3000) -> None:
    """The Dagster UI on this project's definitions."""
    settings = _settings()
    dagster_home = settings.home_dir / "dagster"
    dagster_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "TRAJLAKE_HOME": str(settings.home_dir)}
    dagster = Path(sys.executable).with_name("dagster")
    command = [
        str(dagster) if dagster.exists() else "dagster",
        "dev",
        "-m",
        "dagster_project.definitions",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    raise typer.Exit(subprocess.call(command, env=env))


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


@app.command("import")
def import_runs(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Recorded runs: files (.traj, .traj.json, .json, .jsonl, OTLP JSON) or directories "
            "(Harbor trials and jobs, OpenHands V1 conversations, folders of runs)."
        ),
    ] = None,
    format: Annotated[ImportFormat, typer.Option("--format", "-f")] = ImportFormat.auto,
    verdicts: Annotated[
        Path | None,
        typer.Option(
            "--verdicts",
            help="Harness reports (SWE-bench keyed or flat, summaries, Multi-SWE-bench, Harbor result.json): "
            "a file or a directory. With PATHS they join those runs; alone, the assembled sessions of their "
            "instances.",
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option("--listen", help="Receive OTLP/HTTP traces on HOST:PORT (e.g. 127.0.0.1:4318) until Ctrl-C."),
    ] = None,
) -> None:
    """Import runs recorded by other agent frameworks into the event stream (Kafka); re-imports are idempotent."""
    from pipelines.importing import import_runs as run_import
    from pipelines.importing import listen as start_receiver
    from producers.importers import ImportFormatError
    from producers.sdk import EventProducer

    if not paths and verdicts is None and listen is None:
        raise typer.BadParameter("give PATHS, --verdicts or --listen")
    settings = _settings()
    # the importers redact every event before splitting large texts into parts: no second pass here
    with EventProducer.from_settings(host_id="importer", redact=False) as producer:
        if listen is not None:
            receiver = start_receiver(
                listen, producer, lambda s: out.print(f"{s.position}: session {s.session_id}, {s.steps} steps")
            )
            out.print(f"receiving OTLP/HTTP traces at {receiver.endpoint} (Ctrl-C to stop)")
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                receiver.stop()
            out.print(f"received {receiver.spans_received} spans, sent {receiver.sessions_sent} sessions")
            return
        run = run_import(settings, list(paths or []), producer, format=format.value, verdicts=verdicts)
    problems = [str(item) for item in run.report.quarantined] + [f"session {sid}: {why}" for sid, why in run.failed]
    if paths and not run.report.summaries and problems:  # nothing could be imported: one line says why
        more = f" (and {len(problems) - 1} more records quarantined)" if len(problems) > 1 else ""
        raise ImportFormatError("import", f"nothing imported: {problems[0]}{more}")
    for summary in run.report.summaries:
        where = f" ({summary.position})" if summary.position else ""
        out.print(
            f"{summary.path}{where}: {summary.framework} session {summary.session_id}, "
            f"{summary.events} events, {summary.steps} steps",
            markup=False,
        )
        if summary.set_aside:
            out.print(f"  set aside: {summary.set_aside}", markup=False)
    for item in run.report.quarantined:
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
    if run.attached is not None:
        attached = run.attached
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


quality_app = typer.Typer(no_args_is_help=True, help="Quality layer: evaluation against ground truth.")
app.add_typer(quality_app, name="quality")


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
    from pipelines.score import score_all

    stats = score_all(_settings(), force=force)
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
    force: Annotated[bool, typer.Option(help="Write into a non-empty directory (replaces its export).")] = False,
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

    from pipelines.export import ExportFilters, export_training_set

    settings = _settings()
    filters = ExportFilters(
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
    stats = export_training_set(settings, format.value, out_dir, force=force, filters=filters, parquet=parquet)
    for name, sha in stats.files.items():
        out.print(f"{out_dir / name}  sha256 {sha}", markup=False)
    out.print(f"exported {stats.records} trajectories ({stats.format}) to {stats.out_dir}; manifest {stats.manifest}")
    if stats.quarantined:
        out.print(f"  {stats.quarantined} sessions could not be exported (see the quarantine view)", markup=False)
    if stats.left_out:
        out.print(f"  of {stats.considered} sessions considered, left out: {stats.left_out_summary()}", markup=False)


@quality_app.command("evaluate")
def quality_evaluate(
    labels: Annotated[Path, typer.Option("--labels", help="Ground-truth labels JSONL from `trajlake fleet run`.")],
    inject: Annotated[int, typer.Option(help="Near-duplicates to inject for the dedup evaluation.")] = 500,
    seed: Annotated[int, typer.Option(help="Seed of the injection.")] = 0,
) -> None:
    """Precision, recall and false-positive rate of the cheat flags and the deduplication."""
    from pipelines.ground_truth import evaluate_quality

    report = evaluate_quality(_settings(), labels, inject=inject, seed=seed)
    out.print(report.table(), markup=False)


schema_app = typer.Typer(no_args_is_help=True, help="Event schema versions and compatibility.")
app.add_typer(schema_app, name="schema")


@schema_app.command("check")
def schema_check(
    old: Annotated[Path | None, typer.Option(help="Old .avsc; with --new checks just this pair.")] = None,
    new: Annotated[Path | None, typer.Option(help="New .avsc; default: every shipped version pairwise.")] = None,
    mode: Annotated[str, typer.Option(help="backward | forward | full (Avro resolution rules).")] = "backward",
) -> None:
    """Reject a schema change that breaks Avro compatibility (e.g. a new required field without default)."""
    from schemas.compat import Compatibility, assert_compatible, check_shipped, load_schema

    try:
        level = Compatibility(mode.lower())
    except ValueError as exc:
        raise typer.BadParameter(f"mode must be backward, forward or full, not {mode!r}") from exc
    if (old is None) != (new is None):
        raise typer.BadParameter("give both --old and --new, or neither to check the shipped versions")
    if old is not None and new is not None:
        assert_compatible(load_schema(old), load_schema(new), level, f"{new} (from {old})")
        out.print(f"{new} is {level.value.upper()} compatible with {old}")
        return
    failures = {pair: problems for pair, problems in check_shipped(level).items() if problems}
    if failures:
        (first_old, first_new), problems = next(iter(failures.items()))
        from schemas.compat import IncompatibleSchema

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

    from warehouse.tiering import tier as run_tier

    stats = run_tier(_settings(), as_of=as_of.replace(tzinfo=UTC) if as_of else None)
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
    from warehouse.maintenance import maintain as run_maintain

    out.print(f"{'table':<28} {'files':>13} {'MiB':>17} {'max/partition':>13} {'expired':>7} {'orphans':>7}")
    for r in run_maintain(_settings()):
        b, a = r.before, r.after
        out.print(
            f"{r.table:<28} {b.files:>6} → {a.files:<4} {b.bytes / 2**20:>7.2f} → {a.bytes / 2**20:<7.2f} "
            f"{b.max_files_per_partition:>5} → {a.max_files_per_partition:<5} {r.snapshots_expired:>7} "
            f"{r.orphans_removed:>7}"
        )


fleet_app = typer.Typer(no_args_is_help=True, help="The sandbox fleet: real local sandboxes or synthetic traffic.")
app.add_typer(fleet_app, name="fleet")


class FleetBackend(StrEnum):
    """Fleet backends."""

    local = "local"
    synthetic = "synthetic"


@fleet_app.command("run")
def fleet_run(
    backend: Annotated[FleetBackend, typer.Option(help="local: bubblewrap sandboxes; synthetic: reference traffic.")],
    sessions: Annotated[int, typer.Option(min=1)],
    concurrency: Annotated[int, typer.Option(min=1, help="Sandboxes at once (local).")] = 4,
    seed: Annotated[int, typer.Option()] = 0,
    cheat_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of cheating sessions.")] = 0.1,
    labels: Annotated[Path | None, typer.Option(help="Write ground-truth labels (JSONL) here.")] = None,
    perturb: Annotated[
        str | None, typer.Option(help="Environment perturbation, e.g. 'latency=50,jitter=20,fail=0.05,formats'.")
    ] = None,
    rate: Annotated[float, typer.Option(help="Synthetic arrivals per second (35/s = 3M/day).")] = 35.0,
    time_compression: Annotated[
        float | None, typer.Option(help="Synthetic pacing: simulated seconds per wall second (default flat out).")
    ] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="Synthetic generator processes, each sending its shard of the stream.")
    ] = 1,
    agent: Annotated[
        str | None,
        typer.Option(help="Local agent: a built-in policy (solver, ...), llm, module:callable or file.py:callable."),
    ] = None,
    model_endpoint: Annotated[str | None, typer.Option(help="--agent llm: OpenAI-compatible base URL (…/v1).")] = None,
    model: Annotated[str | None, typer.Option(help="--agent llm: the model name.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="--agent llm: env var holding the API key.")] = None,
    temperature: Annotated[float, typer.Option(help="--agent llm: sampling temperature.")] = 0.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="--agent llm: completion tokens per call.")] = 1024,
    token_mode: Annotated[
        str | None,
        typer.Option(help="--agent llm: chat, or tito (token in, token out; TRAJLAKE_LLM_TOKEN_MODE)."),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="--agent llm: the server kind: auto, vllm, sglang or llama.cpp (tito needs one).")
    ] = "auto",
    tokenizer: Annotated[
        str | None, typer.Option(help="--agent llm --token-mode tito: the model's tokenizer directory (SGLang).")
    ] = None,
    request_timeout: Annotated[
        float | None,
        typer.Option(min=0.1, help="--agent llm: seconds per model request (TRAJLAKE_LLM_REQUEST_TIMEOUT_S)."),
    ] = None,
    max_retries: Annotated[
        int | None,
        typer.Option(min=0, help="--agent llm: retries of a transient model error (TRAJLAKE_LLM_MAX_RETRIES)."),
    ] = None,
    max_model_calls: Annotated[
        int | None,
        typer.Option(
            min=1, help="Cap: model calls per LLM session, malformed ones too (TRAJLAKE_LLM_MAX_MODEL_CALLS)."
        ),
    ] = None,
    max_steps: Annotated[int | None, typer.Option(min=0, help="Cap: tool calls per session.")] = None,
    max_model_tokens: Annotated[int | None, typer.Option(min=0, help="Cap: model tokens per session.")] = None,
    max_cost_usd: Annotated[float | None, typer.Option(min=0.0, help="Cap: model cost per session.")] = None,
    timeout: Annotated[float | None, typer.Option(min=0.1, help="Per-session wall-clock deadline (seconds).")] = None,
    group_size: Annotated[int, typer.Option(min=1, help="Attempts of each task instance (one group id).")] = 1,
) -> None:
    """Run a fleet batch; events go to Kafka, labels (if asked) to a JSONL file.

    With --group-size K, each of the --sessions task instances runs K times (K × sessions sessions).
    """
    from producers.fleet import run_fleet
    from producers.fleet.agent_caps import Caps

    settings = _settings()
    llm = _llm_options(
        agent,
        model_endpoint,
        model,
        api_key_env,
        temperature,
        max_tokens,
        token_mode=token_mode,
        engine=engine,
        tokenizer=tokenizer,
        request_timeout=request_timeout,
        max_retries=max_retries,
    )
    model_calls = max_model_calls if max_model_calls is not None else settings.llm_max_model_calls
    caps = Caps(max_steps, max_model_tokens, max_cost_usd, max_model_calls=model_calls)
    report = run_fleet(
        settings,
        backend=backend.value,
        sessions=sessions,
        concurrency=concurrency,
        seed=seed,
        cheat_rate=cheat_rate,
        labels_path=labels,
        perturb=perturb,
        rate_per_s=rate,
        time_compression=time_compression,
        workers=workers,
        agent=agent,
        llm=llm,
        caps=caps,
        group_size=group_size,
        timeout_s=timeout,
    )
    out.print(report.summary(), markup=False)


def _llm_options(
    agent: str | None,
    endpoint: str | None,
    model: str | None,
    api_key_env: str | None,
    temperature: float,
    max_tokens: int,
    *,
    token_mode: str | None = None,
    engine: str = "auto",
    tokenizer: str | None = None,
    request_timeout: float | None = None,
    max_retries: int | None = None,
) -> object:
    """The LLM configuration of ``fleet run``/``fleet retry`` (``None`` without ``--model-endpoint``).

    Flags left unset take the ``TRAJLAKE_LLM_*`` settings.
    """
    llm = None
    if endpoint or model:
        if not (endpoint and model):
            raise typer.BadParameter("--model-endpoint and --model go together")
        from producers.fleet.llm import LLMConfig

        settings = _settings()
        llm = LLMConfig(
            endpoint,
            model,
            api_key_env,
            temperature=temperature,
            max_tokens=max_tokens,
            timeout_s=request_timeout if request_timeout is not None else settings.llm_request_timeout_s,
            max_retries=max_retries if max_retries is not None else settings.llm_max_retries,
            backoff_s=settings.llm_backoff_s,
            token_mode=token_mode or settings.llm_token_mode,
            engine=engine,
            tokenizer=tokenizer,
        )
    elif agent == "llm":
        raise typer.BadParameter("--agent llm needs --model-endpoint URL and --model NAME")
    return llm


@fleet_app.command("retry")
def fleet_retry(
    since: Annotated[
        datetime | None, typer.Option(help="Only sessions started at or after this time (ISO, UTC).")
    ] = None,
    max_attempts: Annotated[int, typer.Option(min=1, help="Attempts of an original session in all.")] = 3,
    concurrency: Annotated[int, typer.Option(min=1, help="Sandboxes at once.")] = 4,
    labels: Annotated[Path | None, typer.Option(help="Write ground-truth labels (JSONL) here.")] = None,
    model_endpoint: Annotated[str | None, typer.Option(help="For llm sessions: OpenAI-compatible base URL.")] = None,
    model: Annotated[str | None, typer.Option(help="For llm sessions: the model name.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="For llm sessions: env var holding the API key.")] = None,
) -> None:
    """Re-run local sessions whose failure cause advises it (scores.retry_advice: rerun, rerun_once).

    Infrastructure failures and transient model-API errors are retried; capability failures never.
    Each retry records attempt and retry_of (the original session). Run `trajlake score` first.
    """
    from datetime import UTC

    from producers.fleet import run_fleet
    from producers.fleet.retry import plan_retries, retry_query
    from warehouse.sql import run_query

    settings = _settings()
    columns, rows = run_query(settings, retry_query(since.replace(tzinfo=UTC) if since else None))
    plans = plan_retries(columns, rows, max_attempts)
    if not plans:
        out.print("nothing to retry")
        return
    llm = _llm_options(None, model_endpoint, model, api_key_env, 0.0, 1024)
    if llm is None and any(plan.agent == "llm" for plan in plans):
        raise typer.BadParameter("sessions of --agent llm are among the retries: give --model-endpoint and --model")
    report = run_fleet(
        settings,
        backend="local",
        sessions=len(plans),
        concurrency=concurrency,
        labels_path=labels,
        llm=llm,
        plans=plans,
    )
    out.print(f"retried {len(plans)} sessions (of {len({row[6] for row in rows})} originals seen)")
    out.print(report.summary(), markup=False)


def main() -> None:
    """Console entry point: run the app, turning trajlake errors into one red line.

    The exit code is 1, or 75 (``EX_TEMPFAIL``) when the error is transient, so a scheduler
    can tell "retry later" from "fix something first". Files and directories trajlake
    creates (under TRAJLAKE_HOME, exports) are owner-only: the umask is 0o077.
    """
    os.umask(0o077)  # lakehouse data and exports may hold trajectories' secrets: no group/world access
    logging.basicConfig(
        level=os.environ.get("TRAJLAKE_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        app(standalone_mode=False)
    except TrajlakeError as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)
        sys.exit(EXIT_TRANSIENT if is_transient(exc) else EXIT_ERROR)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("[red]aborted[/]")
        sys.exit(1)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
