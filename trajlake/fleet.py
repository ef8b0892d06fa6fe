"""``trajlake fleet …``: run the sandbox fleet, retry what failed for infrastructure reasons, and serve
the scripted test model that LLM agents can be tried against without a real model."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from trajlake.console import out, print_note, progress_bar
from trajlake.home import settings_for

fleet_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="The sandbox fleet: real local sandboxes or synthetic traffic."
)


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
    settings = settings_for("any")
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
    from producers.fleet import run_fleet
    from producers.fleet.agent_caps import Caps

    model_calls = max_model_calls if max_model_calls is not None else settings.llm_max_model_calls

    with progress_bar(f"fleet[{backend.value}]") as progress:
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
            caps=Caps(max_steps, max_model_tokens, max_cost_usd, max_model_calls=model_calls),
            group_size=group_size,
            timeout_s=timeout,
            progress=progress,
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

        settings = settings_for("any")
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

    llm = _llm_options(None, model_endpoint, model, api_key_env, 0.0, 1024)
    settings = settings_for("read")
    from pipelines.fleet.retry import retry_sessions

    with progress_bar("fleet retry") as progress:
        outcome = retry_sessions(
            settings,
            since=since.replace(tzinfo=since.tzinfo or UTC) if since else None,
            max_attempts=max_attempts,
            concurrency=concurrency,
            labels_path=labels,
            llm=llm,
            progress=progress,
        )
    if outcome.report is None:
        out.print("nothing to retry")
        return
    out.print(f"retried {outcome.retried} sessions (of {outcome.originals} originals seen)")
    out.print(outcome.report.summary(), markup=False)


@fleet_app.command("test-model")
def fleet_test_model(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0: a free one).")] = 8000,
    seed: Annotated[int, typer.Option(help="The --seed of the fleet runs it will answer.")] = 0,
    sessions: Annotated[int, typer.Option(min=1, help="The --sessions of those runs (task instances).")] = 4,
) -> None:
    """Serve a scripted OpenAI-compatible model on loopback for trying `--agent llm` (no model runs).

    It answers chat completions as the scripted solver would decide, for the task instances of a
    fleet run with the same --seed and --sessions (other tasks get a turn without tool calls), with
    vLLM-style tool calls, usage, token ids and logprobs. Stops on Ctrl-C or SIGTERM.
    """
    import signal
    import threading

    from producers.fleet.llm.testing import FakeOpenAIServer, solver_script
    from producers.fleet.tasks import task_for

    tasks = [task_for(seed, index) for index in range(sessions)]
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    with FakeOpenAIServer(solver_script(tasks), port=port) as server:
        out.print(server.url, markup=False)
        print_note(
            f"scripted test model for --seed {seed} --sessions {sessions}: "
            f"trajlake fleet run --backend local --sessions {sessions} --seed {seed} --agent llm "
            f"--model-endpoint {server.url} --model scripted"
        )
        stop.wait()
