"""The ``trajlake`` command line: a thin shell over the packages.

Every command honours ``TRAJLAKE_HOME`` (default ``./.trajlake``). Domain errors
print one red line and exit with code 1.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipelines.errors import TrajlakeError
from pipelines.settings import Settings, load_settings
from producers.errors import FleetError, ProducerError
from schemas.errors import SchemaError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="trajlake: agent trajectories lakehouse.")
broker_app = typer.Typer(no_args_is_help=True, help="The embedded Kafka-compatible broker.")
app.add_typer(broker_app, name="broker")

err = Console(stderr=True)
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
    from pipelines.broker import start_broker

    state = start_broker(_settings(), port=port)
    out.print(state.bootstrap)


@broker_app.command("stop")
def broker_stop() -> None:
    """Stop the embedded broker."""
    from pipelines.broker import stop_broker

    out.print("stopped" if stop_broker(_settings()) else "not running")


@broker_app.command("status")
def broker_status_cmd() -> None:
    """Print the broker address, or exit 1 when none is running."""
    from pipelines.broker import broker_status
    from pipelines.errors import BrokerNotRunning

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


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A read-only DuckDB query over the trajlake views.")],
    format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Read-only DuckDB SQL over events, trajectories, steps, scores, flags, …"""
    from warehouse.sql import format_rows, run_query

    columns, rows = run_query(_settings(), query)
    out.print(format_rows(columns, rows, format.value), markup=False)


@app.command()
def demo(
    sessions: Annotated[int, typer.Option(min=1)] = 500,
    seed: Annotated[int | None, typer.Option(help="Fleet seed; random by default.")] = None,
) -> None:
    """Everything end to end on embedded defaults, with a summary."""
    from pipelines.demo import run_demo

    run_demo(_settings(), sessions=sessions, seed=seed, echo=lambda line: out.print(line, markup=False))


@app.command()
def ui(port: Annotated[int, typer.Option()] = 3000) -> None:
    """The Dagster UI on this project's definitions."""
    settings = _settings()
    dagster_home = settings.home_dir / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "TRAJLAKE_HOME": str(settings.home_dir)}
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster) if dagster.exists() else "dagster", "dev", "-m", "dagster_project.definitions",
               "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    raise typer.Exit(subprocess.call(command, env=env))


def main() -> None:
    """Console entry point: run the app, turning domain errors into one red line and exit 1."""
    logging.basicConfig(
        level=os.environ.get("TRAJLAKE_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        app(standalone_mode=False)
    except (TrajlakeError, SchemaError, ProducerError, FleetError) as exc:
        err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
        sys.exit(1)
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
