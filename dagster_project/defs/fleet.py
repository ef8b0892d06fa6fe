"""The sandbox fleet as Dagster's upstream asset: ``sandbox_runs`` launches a batch of sessions.

Importing this module has no side effects; ``definitions.py`` merges its ``defs`` and binds
``FleetResource()`` under the key ``fleet``.
"""

from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetSelection,
    Config,
    ConfigurableResource,
    DefaultScheduleStatus,
    Definitions,
    MaterializeResult,
    MetadataValue,
    ScheduleDefinition,
    asset,
    define_asset_job,
)

from common.settings import Settings
from dagster_project.resources import LakehouseResource, transient_retries
from producers.fleet import FleetReport, run_fleet


class FleetResource(ConfigurableResource):
    """A sandbox fleet backend and its defaults.

    Attributes:
        backend: ``local`` (bubblewrap sandboxes) or ``synthetic``.
        concurrency: sandboxes at once (local).
        seed: task instances, policies and the synthetic stream derive from it.
        cheat_rate: share of cheating sessions.
        perturb: environment perturbation spec, e.g. ``latency=50,jitter=20,fail=0.05,formats``.
        timeout_s: per-session deadline override (local).
        fallback: run the synthetic fleet when bubblewrap is unavailable (instead of failing).
        rate_per_s: synthetic arrival rate.
        time_compression: synthetic pacing (simulated seconds per wall second); ``None`` = flat out.
        workers: synthetic generator processes, each sending its shard of the stream.
        agent: the local fleet's agent (``producers.fleet.agent_api``): a built-in policy, ``llm``,
            ``module:callable`` or ``path/file.py:callable``; ``None`` draws scripted policies.
        model_endpoint: ``agent='llm'``: OpenAI-compatible base URL (``…/v1``).
        model: ``agent='llm'``: the model name.
        api_key_env: ``agent='llm'``: environment variable holding the API key.
        temperature: ``agent='llm'``: sampling temperature.
        max_tokens: ``agent='llm'``: completion tokens per call.
        max_steps: cap: tool calls per session.
        max_model_tokens: cap: model tokens per session.
        max_cost_usd: cap: model cost per session.
        group_size: attempts of each task instance (a rollout group with one ``group_id``).
    """

    backend: str = "local"
    concurrency: int = 4
    seed: int = 0
    cheat_rate: float = 0.1
    perturb: str | None = None
    timeout_s: float | None = None
    fallback: bool = True
    rate_per_s: float = 35.0
    time_compression: float | None = None
    workers: int = 1
    agent: str | None = None
    model_endpoint: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    temperature: float = 0.0
    max_tokens: int = 1024
    max_steps: int | None = None
    max_model_tokens: int | None = None
    max_cost_usd: float | None = None
    max_model_calls: int | None = None  # None: TRAJLAKE_LLM_MAX_MODEL_CALLS
    token_mode: str | None = None  # chat | tito; None: TRAJLAKE_LLM_TOKEN_MODE
    engine: str = "auto"  # auto | vllm | sglang | llama.cpp (tito needs one)
    tokenizer: str | None = None  # tito without a template endpoint (SGLang): the model's tokenizer directory
    group_size: int = 1

    def launch(
        self,
        settings: Settings,
        sessions: int,
        labels_path: Path | None,
        seed: int | None = None,
        backend: str | None = None,
        cheat_rate: float | None = None,
        agent: str | None = None,
    ) -> FleetReport:
        """Run one batch of ``sessions`` sessions; events go to Kafka, labels to ``labels_path``.

        ``seed``, ``backend``, ``cheat_rate`` and ``agent`` override the resource's defaults for this
        batch (a campaign's run config).
        """
        from producers.fleet.agent_caps import Caps
        from producers.fleet.llm import LLMConfig

        llm = None
        if self.model_endpoint and self.model:
            llm = LLMConfig(
                self.model_endpoint,
                self.model,
                self.api_key_env,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                timeout_s=settings.llm_request_timeout_s,
                max_retries=settings.llm_max_retries,
                backoff_s=settings.llm_backoff_s,
                token_mode=self.token_mode or settings.llm_token_mode,
                engine=self.engine,
                tokenizer=self.tokenizer,
            )
        model_calls = self.max_model_calls if self.max_model_calls is not None else settings.llm_max_model_calls
        return run_fleet(
            settings,
            backend=backend or self.backend,
            sessions=sessions,
            concurrency=self.concurrency,
            seed=self.seed if seed is None else seed,
            cheat_rate=self.cheat_rate if cheat_rate is None else cheat_rate,
            labels_path=labels_path,
            perturb=self.perturb,
            fallback=self.fallback,
            timeout_s=self.timeout_s,
            rate_per_s=self.rate_per_s,
            time_compression=self.time_compression,
            workers=self.workers,
            agent=agent or self.agent,
            llm=llm,
            caps=Caps(self.max_steps, self.max_model_tokens, self.max_cost_usd, max_model_calls=model_calls),
            group_size=self.group_size,
        )


class SandboxRunsConfig(Config):
    """Per-run settings of ``sandbox_runs``."""

    sessions: int = 20
    seed: int | None = None
    backend: str | None = None
    cheat_rate: float | None = None
    agent: str | None = None  # overrides FleetResource.agent for this run
    write_labels: bool = True


@asset(
    group_name="fleet",
    description="A batch of agent sessions in sandboxes; their events go to Kafka (upstream of raw_events).",
    kinds={"kafka"},
)
def sandbox_runs(
    context: AssetExecutionContext,
    config: SandboxRunsConfig,
    fleet: FleetResource,
    lakehouse: LakehouseResource,
) -> MaterializeResult:
    """Launch a batch through ``FleetResource`` and record its outcome as metadata."""
    settings = lakehouse.settings()
    labels = None
    if config.write_labels:
        labels = settings.home_dir / "fleet" / "labels" / f"{context.run.run_id}.jsonl"
    with transient_retries():
        report = fleet.launch(
            settings, config.sessions, labels, config.seed, config.backend, config.cheat_rate, config.agent
        )
    context.log.info(report.summary())
    metadata: dict[str, Any] = dict(report.metadata())
    metadata["sessions_by_status"] = MetadataValue.json(report.by_status)
    metadata["latency_ms"] = MetadataValue.json(report.latency_ms)
    if report.labels_path:
        metadata["labels_path"] = MetadataValue.path(report.labels_path)
    return MaterializeResult(metadata=metadata)


#: A fleet campaign: batches of sessions launched on a schedule, each configured by its run config
#: (``ops.sandbox_runs.config``: sessions, seed, backend, cheat_rate). Off until switched on in the UI.
fleet_campaign = define_asset_job(
    "fleet_campaign",
    selection=AssetSelection.assets(sandbox_runs),
    config={"ops": {"sandbox_runs": {"config": {"sessions": 50}}}},
)
fleet_campaign_schedule = ScheduleDefinition(
    job=fleet_campaign,
    cron_schedule="0 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
)

defs = Definitions(assets=[sandbox_runs], jobs=[fleet_campaign], schedules=[fleet_campaign_schedule])

__all__ = ["FleetResource", "SandboxRunsConfig", "defs", "fleet_campaign", "sandbox_runs"]
