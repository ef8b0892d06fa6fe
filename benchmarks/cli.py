"""``trajlake bench ...``: the benchmark commands, each a thin shell over one module of this package.

The application's command line mounts :data:`bench_app`; every command imports its module only when it
runs, so ``trajlake --help`` pays for none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

out = Console(highlight=False, soft_wrap=True)

bench_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Benchmarks: a figure, its same-run baseline, the ratio."
)


@bench_app.command("ingest")
def bench_ingest_cmd(
    events: Annotated[int, typer.Option(help="Records in the Kafka backlog.")] = 200_000,
    naive: Annotated[bool, typer.Option(help="Also run the naive pyiceberg baseline.")] = True,
    guard: Annotated[
        bool,
        typer.Option(
            help="Instead: CPU per event against a consume-only loop in the same run (200k events, 5 rounds); "
            "exit 1 when the ratio falls below the recorded floor."
        ),
    ] = False,
) -> None:
    """Kafka → Iceberg raw events vs the consume+decode floor and a naive baseline."""
    if guard:
        from benchmarks.ingest_ab import bench_ingest_guard

        if not bench_ingest_guard()["passed"]:
            raise typer.Exit(1)
        return
    from benchmarks.ingest import bench_ingest

    bench_ingest(events=events, naive=naive)


@bench_app.command("ingest-ab")
def bench_ingest_ab_cmd(
    base: Annotated[Path, typer.Option(help="Checkout A (e.g. `git worktree add /tmp/ab-base d22ce4f`).")],
    head: Annotated[Path | None, typer.Option(help="Checkout B; this tree by default.")] = None,
    other: Annotated[list[Path] | None, typer.Option(help="More checkouts, run in the same rounds.")] = None,
    events: Annotated[int, typer.Option(help="Records in the backlog.")] = 947_050,
    rounds: Annotated[int, typer.Option(help="Rounds (each runs every checkout once, order alternating).")] = 3,
    quick: Annotated[bool, typer.Option(help="100k events, 2 rounds.")] = False,
    consume: Annotated[bool, typer.Option(help="A consume-only run per round.")] = True,
    profile: Annotated[Path | None, typer.Option(help="Then one py-spy run per checkout; raw stacks here.")] = None,
) -> None:
    """Two checkouts' ingest alternated on one backlog: CPU µs/event, events/s, their ratio (B / A)."""
    from benchmarks.ingest_ab import HERE, bench_ingest_ab

    checkouts = {"A": base.resolve(), "B": (head or HERE).resolve()}
    checkouts.update({f"C{i}": path.resolve() for i, path in enumerate(other or [], 1)})
    if quick:
        events, rounds = 100_000, 2
    bench_ingest_ab(checkouts, events=events, rounds=rounds, consume=consume, profile_dir=profile)


@bench_app.command("import")
def bench_import_cmd(
    sizes: Annotated[str, typer.Option(help="Comma-separated run sizes in MB (each imported in a fresh process).")] = (
        "1.6,3.2,6.4,12.8"
    ),
) -> None:
    """Importing a recorded run: seconds and peak RSS per MB at growing sizes, and their ratio (1.0 is linear).

    Then streamed import: peak RSS per trial of two Harbor jobs, and per MB of a run's largest line.
    """
    from benchmarks.importing import bench_import, bench_streaming

    bench_import(tuple(float(s) for s in sizes.split(",") if s.strip()))
    bench_streaming()


@bench_app.command("decode")
def bench_decode_cmd(events: Annotated[int, typer.Option(help="Records to decode.")] = 50_000) -> None:
    """Batch decoding vs per-record decode_event on the same bytes."""
    from benchmarks.ingest import bench_decode

    bench_decode(events=events)


@bench_app.command("memory")
def bench_memory_cmd(events: Annotated[int, typer.Option(help="Records of backlog.")] = 1_000_000) -> None:
    """Ingest peak RSS with a backlog vs a backlog ten times smaller."""
    from benchmarks.ingest import bench_memory

    bench_memory(events=events)


@bench_app.command("query")
def bench_query_cmd(events: Annotated[int, typer.Option(help="Events loaded into raw_events.")] = 1_000_000) -> None:
    """DuckDB aggregates and one session's events vs a full scan."""
    from benchmarks.lakehouse import bench_query

    bench_query(events=events)


@bench_app.command("cold")
def bench_cold_cmd(
    events: Annotated[int, typer.Option(help="Cold events at the first measurement.")] = 1_000_000,
    larger: Annotated[int, typer.Option(help="Cold events at the second.")] = 3_000_000,
    per_day: Annotated[int, typer.Option(help="Events per day partition.")] = 250_000,
    baseline: Annotated[bool, typer.Option(help="Also time the old whole-table load.")] = True,
) -> None:
    """Cold tier on S3 (a local moto server): session lookup and day aggregate at two sizes; peak RSS."""
    from benchmarks.cold import bench_cold

    bench_cold(events=events, larger=larger, per_day=per_day, baseline=baseline)


@bench_app.command("scaleout")
def bench_scaleout_cmd(events: Annotated[int, typer.Option(help="Records of backlog.")] = 300_000) -> None:
    """Two ingest processes in one group vs one: throughput, duplicates and loss."""
    from benchmarks.ingest import bench_scaleout

    bench_scaleout(events=events)


@bench_app.command("replay")
def bench_replay_cmd(
    sessions: Annotated[int, typer.Option(help="Synthetic sessions (125,000 at 35/s ≈ one hour of 3M/day).")] = 125_000,
    seed: Annotated[int, typer.Option(help="Traffic seed.")] = 3,
    template_reuse: Annotated[float, typer.Option(help="Runs per generated session body (1 = all fresh).")] = 1.0,
    workers: Annotated[int, typer.Option(min=1, help="Synthetic generator processes.")] = 2,
) -> None:
    """One hour of traffic: produce → ingest → assemble → score → export, wall vs traffic span."""
    from benchmarks.replay import bench_replay

    bench_replay(sessions=sessions, seed=seed, template_reuse=template_reuse, workers=workers)


@bench_app.command("export")
def bench_export_cmd(
    sessions: Annotated[int, typer.Option(help="Trajectories in the lakehouse (baseline: ten times fewer).")] = 200_000,
    steps: Annotated[int, typer.Option(help="Steps per trajectory.")] = 8,
    format: Annotated[
        str, typer.Option("--format", "-f", help="Training-set format: hf, openai, sharegpt, rl, atif.")
    ] = ("rl"),
    parquet: Annotated[bool, typer.Option(help="Parquet (--format rl).")] = False,
) -> None:
    """Export peak RSS over a large lakehouse vs one ten times smaller (bounded memory: ratio near 1)."""
    from benchmarks.export import bench_export

    bench_export(sessions=sessions, steps=steps, fmt=format, parquet=parquet)


@bench_app.command("freshness")
def bench_freshness_cmd(
    rate: Annotated[float, typer.Option(help="Events per second sent (the demo's rate).")] = 2_000.0,
    seconds: Annotated[float, typer.Option(help="Seconds of traffic per run.")] = 60.0,
    scale: Annotated[float, typer.Option(help="A second run at this many times the rate (1: none).")] = 10.0,
    poll: Annotated[float, typer.Option(help="Seconds between looks at the catalog's pointers.")] = 0.05,
) -> None:
    """``ingest --follow``: send → visible in the events view (p50/p95/max) vs send → Kafka consumer."""
    from benchmarks.ingest import bench_freshness

    bench_freshness(rate=rate, seconds=seconds, scale=scale, poll_s=poll)


@bench_app.command("assemble")
def bench_assemble_cmd(events: Annotated[int, typer.Option(help="Raw events to assemble.")] = 10_000_000) -> None:
    """Assembly peak RSS over a large raw-events table vs one ten times smaller."""
    from benchmarks.lakehouse import bench_assemble

    bench_assemble(events=events)


@bench_app.command("quality")
def bench_quality_cmd(
    sessions: Annotated[int, typer.Option(help="Synthetic trajectories to score and deduplicate.")] = 1_000_000,
) -> None:
    """Scoring + deduplication vs datasketch's per-document MinHash LSH on a sample."""
    from benchmarks.quality import run_quality_benchmark

    out.print(run_quality_benchmark(sessions).summary(), markup=False)


@bench_app.command("incremental")
def bench_incremental_cmd(
    history: Annotated[str, typer.Option(help="History sizes in sessions, comma-separated.")] = "1000000,5000000",
    day: Annotated[int, typer.Option(min=1, help="Sessions of the new day scored on top of each history.")] = 100_000,
    force: Annotated[bool, typer.Option(help="Also time a full rescore (score --force) of the largest.")] = True,
    quick: Annotated[bool, typer.Option(help="Small sizes (history 10000,50000, day 2500): < 2 min.")] = False,
) -> None:
    """Scoring one new day on top of histories of different sizes (wall, peak RSS), and a full rescore."""
    from benchmarks.incremental import bench_incremental, parse_sizes

    sizes, day = ([10_000, 50_000], 2_500) if quick else (parse_sizes(history), day)
    bench_incremental(history=sizes, day=day, force=force)


@bench_app.command("judgement")
def bench_judgement_cmd(
    per_kind: Annotated[int, typer.Option(help="Local sessions of each cheating policy.")] = 3,
    honest: Annotated[int, typer.Option(help="Scripted honest sessions (plus one hang).")] = 12,
    own_agent: Annotated[int, typer.Option(help="Sessions of docs/fleet.md's my_agent.py.")] = 4,
    llm_agent: Annotated[int, typer.Option(help="Sessions of the LLM agent against the scripted test model.")] = 4,
    synthetic: Annotated[int, typer.Option(help="Synthetic-load sessions (5 % cheaters).")] = 300,
    seed: Annotated[int, typer.Option(help="Fleet seed (default: one never used in development).")] = 5_550_123,
    real: Annotated[Path | None, typer.Option(help="Directory of real agent runs to import and judge.")] = None,
) -> None:
    """Recall per cheat kind beside the honest-flag rate per origin (sandbox, synthetic, imports)."""
    from benchmarks.judgement import DEFAULT_REAL, run_judgement

    report = run_judgement(
        per_kind=per_kind,
        honest=honest,
        seed=seed,
        real_dir=real or DEFAULT_REAL,
        own_agent=own_agent,
        llm_agent=llm_agent,
        synthetic=synthetic,
    )
    out.print(report.summary(), markup=False)


@bench_app.command("redaction")
def bench_redaction_cmd(
    seed: Annotated[int, typer.Option(help="Seed of the fake secrets.")] = 0,
    real: Annotated[Path | None, typer.Option(help="Recorded real runs, the must-not-change side.")] = None,
    detect_secrets: Annotated[bool, typer.Option(help="Also measure the detect-secrets library (slow).")] = True,
    public: Annotated[
        bool, typer.Option(help="Also measure the public corpora (gitleaks examples, ordinary code/docs/shell).")
    ] = True,
    corpus: Annotated[
        Path | None,
        typer.Option(help="A corpus of texts with their channels (default ../shared/data/redaction-corpus)."),
    ] = None,
) -> None:
    """Redaction recall per secret kind and per layer, false positives on real runs and public corpora, us per event."""
    from benchmarks.redaction import REAL_RUNS_DIR, SHARED_CORPUS_DIR, run_redaction_benchmark

    report = run_redaction_benchmark(
        seed,
        real or REAL_RUNS_DIR,
        detect_secrets=detect_secrets,
        public=public,
        carrier_dir=corpus or SHARED_CORPUS_DIR,
    )
    out.print(report.summary(), markup=False)


@bench_app.command("agents")
def bench_agents_cmd(
    sessions: Annotated[int, typer.Option(min=1, help="Local sessions per agent (LLM vs scripted).")] = 8,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """LLM agent: host overhead per model call, sessions/min at concurrency 4, bytes per model-call event."""
    from benchmarks.agents import run_agent_benchmarks
    from common.settings import load_settings

    run_agent_benchmarks(load_settings(), sessions=sessions, seed=seed)


@bench_app.command("fleet")
def bench_fleet_cmd(
    local_sessions: Annotated[int, typer.Option(help="Local sandbox sessions at concurrency 4.")] = 16,
    synthetic_events: Annotated[int, typer.Option(help="Synthetic events to generate and encode.")] = 300_000,
    hour_sessions: Annotated[
        int, typer.Option(help="Sessions of the multi-process run (125k = one hour at 3M/day); 0 skips it.")
    ] = 125_000,
) -> None:
    """Sandbox start latency, local sessions/min, synthetic generation vs the per-event baseline."""
    from benchmarks.fleet import run_benchmarks
    from common.settings import load_settings

    run_benchmarks(load_settings(), local_sessions, synthetic_events, hour_sessions=hour_sessions)


@bench_app.command("sandbox-host")
def bench_sandbox_host_cmd(
    files: Annotated[int, typer.Option(min=1, help="Empty files the sandbox makes in its layer.")] = 250_000,
    commands: Annotated[int, typer.Option(min=1, help="Later commands measured (the median is printed).")] = 5,
) -> None:
    """Host CPU per command and events with a layer full of files: bounded scans and events vs unbounded."""
    from benchmarks.sandbox_host import bench_sandbox_host

    bench_sandbox_host(files=files, commands=commands)


@bench_app.command("automation")
def bench_automation_cmd(
    seconds: Annotated[float, typer.Option(min=1, help="Wall seconds of traffic per side.")] = 120.0,
    rate: Annotated[float, typer.Option(min=0.01, help="Sessions per wall second (35 = 3M/day).")] = 35.0,
    time_compression: Annotated[
        float, typer.Option(min=1, help="Simulated seconds per wall second (closes 20 s-20 min sessions in the run).")
    ] = 10.0,
) -> None:
    """Closed session → trajectories / scores p95 with Dagster automation vs an assemble && score loop."""
    from benchmarks.automation import bench_automation

    bench_automation(seconds=seconds, rate=rate, time_compression=time_compression)


@bench_app.command("sql-start")
def bench_sql_start_cmd(repeat: Annotated[int, typer.Option(help="Runs of each measurement (median).")] = 10) -> None:
    """`select 1` in its own query process vs in the calling process, and `trajlake sql` end to end."""
    from benchmarks.sql_start import bench_sql_start

    bench_sql_start(repeat=repeat)


@bench_app.command("fuzz")
def bench_fuzz_cmd(
    examples: Annotated[int, typer.Option(min=1, help="Hypothesis examples per fuzz test.")] = 5_000,
    select: Annotated[str | None, typer.Option("-k", help="pytest -k expression choosing fuzzers.")] = None,
    workers: Annotated[int, typer.Option(min=0, help="pytest-xdist workers (0: one process).")] = 0,
) -> None:
    """Every boundary's fuzzer under a long, random Hypothesis budget (CI runs a short, fixed one)."""
    from benchmarks.fuzz import run_fuzzers

    code = run_fuzzers(examples, select=select, workers=workers)
    if code:
        raise typer.Exit(code)


@bench_app.command("startup")
def bench_startup_cmd(
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved rounds of the three commands.")] = 7,
) -> None:
    """`trajlake --help` and a one-row `trajlake sql` start-up vs `python -c pass`, in the same run."""
    from benchmarks.startup import bench_startup

    bench_startup(rounds=rounds)


@bench_app.command("commits")
def bench_commits_cmd(
    snapshots: Annotated[str, typer.Option(help="History sizes (snapshots kept), comma-separated.")] = "100,1000,5000",
    rounds: Annotated[int, typer.Option(help="Commits per size and staging, alternated.")] = 5,
) -> None:
    """CPU per ingest-shaped commit against the table's history: trajlake's staging vs pyiceberg's deep copies."""
    from benchmarks.commits import bench_commits

    bench_commits(snapshots=tuple(int(x) for x in snapshots.split(",")), rounds=rounds)
