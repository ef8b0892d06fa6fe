"""Typed settings for every trajlake component, read from ``TRAJLAKE_*`` variables.

One place for configuration: each field documents its environment variable and
default. The only other ``TRAJLAKE_*`` variables read directly are test hooks that must work
before settings load: ``TRAJLAKE_FAULT`` (named crash points) and ``TRAJLAKE_LOG_LEVEL``.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from common.errors import ConfigError
from common.prices import PriceTable

#: The SQLite catalog's file name under TRAJLAKE_HOME (the default set-up).
CATALOG_FILE = "catalog.db"


class Settings(BaseSettings):
    """All trajlake settings; ``Settings()`` reads the environment at call time."""

    # allow_inf_nan: no setting is NaN or infinite (a weight of NaN compares false with every bound).
    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_", extra="ignore", allow_inf_nan=False)

    home: Path = Field(Path(".trajlake"), description="TRAJLAKE_HOME: state, catalog and warehouses.")

    # Kafka
    kafka_bootstrap: str | None = Field(
        None, description="TRAJLAKE_KAFKA_BOOTSTRAP: any Kafka; unset means the embedded broker."
    )
    # NoDecode: the validator below parses the JSON, so an empty variable means {} instead of an error.
    kafka_extra: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="TRAJLAKE_KAFKA_EXTRA: JSON object of librdkafka settings (security, SASL, ...).",
    )
    topic: str = Field("trajlake.events", description="TRAJLAKE_TOPIC: the event topic.")
    topic_partitions: int = Field(8, ge=1, description="partitions of the event topic when trajlake creates it.")
    consumer_group: str = Field("trajlake-ingest", description="Kafka consumer group of the ingest workers.")

    # Iceberg
    catalog_name: str = Field("trajlake", description="name of the Iceberg catalog (pyiceberg load_catalog).")
    catalog_uri: str | None = Field(
        None, description="TRAJLAKE_CATALOG_URI: SQLAlchemy URI; unset means SQLite under home."
    )
    catalog_properties: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="TRAJLAKE_CATALOG_PROPERTIES: JSON object passed to pyiceberg load_catalog "
        '(e.g. {"type": "rest", "uri": ...}).',
    )
    namespace: str = Field(
        "trajlake", description="TRAJLAKE_NAMESPACE: Iceberg namespace of the tables (cold tables: <namespace>_cold)."
    )
    hot_warehouse: str | None = Field(None, description="TRAJLAKE_HOT_WAREHOUSE: URI; default home/hot.")
    cold_warehouse: str | None = Field(None, description="TRAJLAKE_COLD_WAREHOUSE: URI; default home/cold.")
    hot_retention_days: float = Field(
        7.0, gt=0, description="days data stays in the hot tier before `trajlake tier` moves it to cold storage."
    )
    cold_target_file_bytes: int = Field(
        128 << 20, ge=1 << 10, description="TRAJLAKE_COLD_TARGET_FILE_BYTES: Parquet file size in the cold tier."
    )
    cold_row_group_rows: int = Field(
        65_536,
        ge=1_024,
        description="TRAJLAKE_COLD_ROW_GROUP_ROWS: rows per Parquet row group in the cold tier (a lookup "
        "reads the row groups its session's Bloom filter and statistics keep).",
    )
    footer_cache_bytes: int = Field(
        1 << 30,
        ge=0,
        description="TRAJLAKE_FOOTER_CACHE_BYTES: local disk kept for the footers (and Bloom filters) of "
        "object-store Parquet files, so a new process does not fetch them again; 0 turns the cache off.",
    )
    footer_cache_dir: Path | None = Field(
        None, description="TRAJLAKE_FOOTER_CACHE_DIR: where that cache lives; default home/cache/footers."
    )
    rewrite_memory_bytes: int = Field(
        768 << 20,
        ge=1 << 20,
        description="TRAJLAKE_REWRITE_MEMORY_BYTES: Arrow rows a compaction or tier copy holds at once "
        "(peak memory is about three times this).",
    )
    compact_min_files: int = Field(
        4, ge=2, description="TRAJLAKE_COMPACT_MIN_FILES: compact a partition once it has this many small files."
    )
    snapshot_retention_hours: float = Field(
        24.0, ge=0, description="TRAJLAKE_SNAPSHOT_RETENTION_HOURS: expire older snapshots (time travel window)."
    )
    orphan_min_age_hours: float = Field(
        24.0, ge=0, description="TRAJLAKE_ORPHAN_MIN_AGE_HOURS: only delete unreferenced files older than this."
    )

    # Ingest
    ingest_max_rows: int = Field(50_000, ge=1, description="rows of one ingest batch at most.")
    ingest_max_bytes: int = Field(
        16 << 20, ge=1024, description="bytes of one ingest batch at most (bounds ingest memory: ~1 GB peak)."
    )
    ingest_max_seconds: float = Field(5.0, gt=0, description="seconds an ingest batch collects records at most.")
    ingest_follow_linger_seconds: float = Field(
        0.5,
        gt=0,
        description="TRAJLAKE_INGEST_FOLLOW_LINGER_SECONDS: `ingest --follow` commits a batch once its first "
        "record is this old (or the commit before it ends, if later), so events are queryable within ~2 s.",
    )
    ingest_follow_upkeep_seconds: float = Field(
        300.0,
        ge=0,
        description="TRAJLAKE_INGEST_FOLLOW_UPKEEP_SECONDS: `ingest --follow` expires raw_events' and "
        "dead_letters' old snapshots this often, between two commits; 0 leaves it to `trajlake maintain`.",
    )
    ingest_follow_compact: bool = Field(
        False,
        description="TRAJLAKE_INGEST_FOLLOW_COMPACT: a follower's upkeep also compacts its small files; off by "
        "default: the rewrite holds the next commit back (p95 freshness 1.6 s -> 5.1 s with 20 s rounds).",
    )
    ingest_follow_retention_seconds: float = Field(
        600.0,
        ge=0,
        description="TRAJLAKE_INGEST_FOLLOW_RETENTION_SECONDS: a follower's upkeep expires raw_events' and "
        "dead_letters' snapshots older than this (never the current one, nor assembly's watermark and later); "
        "every commit rewrites the table's metadata, which grows by ~1 kB a snapshot.",
    )
    max_event_bytes: int = Field(
        1 << 20, ge=1024, description="TRAJLAKE_MAX_EVENT_BYTES: larger records are dead-lettered."
    )
    ingest_dedupe_window: int = Field(
        500_000,
        ge=0,
        description="TRAJLAKE_INGEST_DEDUPE_WINDOW: most recent event ids an ingest worker remembers (warmed "
        "from raw_events at start) to drop re-sent events (producer spool replays, re-imports); 0 disables.",
    )
    reset_dedupe_records: int = Field(
        100_000,
        ge=0,
        description="TRAJLAKE_RESET_DEDUPE_RECORDS: after a topic reset, records per partition beyond the old "
        "offsets whose event ids are checked against events ingested before the reset.",
    )

    # Producer outage spool
    spool_dir: Path | None = Field(
        None, description="TRAJLAKE_SPOOL_DIR: on-disk spool of EventProducer.from_settings; default home/spool."
    )
    spool_max_bytes: int = Field(
        256 << 20, ge=1 << 10, description="TRAJLAKE_SPOOL_MAX_BYTES: past it emit raises SpoolFullError."
    )

    # Assembly
    session_idle_timeout_s: float = Field(
        900.0, gt=0, description="TRAJLAKE_SESSION_IDLE_TIMEOUT_S: close sessions idle this long."
    )
    assemble_chunk_events: int = Field(
        1_000_000,
        ge=1,
        description="TRAJLAKE_ASSEMBLE_CHUNK_EVENTS: assembly handles the affected sessions in chunks of about "
        "this many events (memory is bounded by a chunk).",
    )
    # NoDecode: a comma-separated list (the validator splits it), not JSON.
    trusted_verdicts: Annotated[tuple[str, ...], NoDecode] = Field(
        ("fleet_evaluator", "harness_report", "harbor_verifier"),
        description="TRAJLAKE_TRUSTED_VERDICTS: comma-separated verdict provenances that set eval_passed and the "
        "reward (fleet_evaluator, harness_report, harbor_verifier, self_reported); a verdict of any other "
        "provenance is kept in the events but counts for nothing.",
    )
    assemble_memory_limit: str = Field(
        "2GB",
        description="TRAJLAKE_ASSEMBLE_MEMORY_LIMIT: DuckDB memory limit for assembly; beyond it DuckDB "
        "spills to TRAJLAKE_HOME/tmp (out-of-core), so a large backlog does not need a large machine.",
    )

    # The LLM agent (``trajlake fleet run --agent llm``); each has a ``fleet run`` flag that overrides it
    llm_request_timeout_s: float = Field(
        120.0,
        gt=0,
        description="TRAJLAKE_LLM_REQUEST_TIMEOUT_S: seconds one model request may take (a slow server's long "
        "generation needs more; a try past it is retried as a timeout).",
    )
    llm_max_retries: int = Field(
        4, ge=0, description="TRAJLAKE_LLM_MAX_RETRIES: retries of a transient model-API failure (429, 5xx, timeout)."
    )
    llm_backoff_s: float = Field(
        0.5, ge=0, description="TRAJLAKE_LLM_BACKOFF_S: first wait between tries of a model request (doubling)."
    )
    llm_max_model_calls: int | None = Field(
        200,
        ge=1,
        description="TRAJLAKE_LLM_MAX_MODEL_CALLS: model calls an LLM session may make (malformed and unknown tool "
        "calls count); unset for no cap.",
    )
    llm_token_mode: str = Field(
        "chat",
        pattern=r"^(chat|tito)$",
        description="TRAJLAKE_LLM_TOKEN_MODE: chat (messages to the chat endpoint) or tito (token in, token out: "
        "the conversation kept as token ids, each turn sent as ids).",
    )

    # The sandbox host (``--backend local``): each sandbox's disk quota and what the host spends reading it
    sandbox_disk_quota: str = Field(
        "auto",
        pattern=r"^(auto|loop|tmpfs|accounting|off)$",
        description="TRAJLAKE_SANDBOX_DISK_QUOTA: how a sandbox's writable layer is limited: auto (the strongest "
        "this host can run), loop (its own ext4 image; root with loop devices), tmpfs (root), accounting (summed "
        "after each command, the session ended past it; any host) or off.",
    )
    sandbox_disk_bytes: int = Field(
        256 << 20, ge=1 << 20, description="TRAJLAKE_SANDBOX_DISK_BYTES: bytes a sandbox's writable layer may hold."
    )
    sandbox_disk_inodes: int = Field(
        32_768,
        ge=256,
        description="TRAJLAKE_SANDBOX_DISK_INODES: files, directories and links a sandbox's writable layer may hold.",
    )
    sandbox_tmp_bytes: int = Field(
        64 << 20,
        ge=1 << 20,
        description="TRAJLAKE_SANDBOX_TMP_BYTES: size of a sandbox's private /tmp and of its /dev/shm (each a tmpfs).",
    )
    sandbox_scan_entries: int = Field(
        20_000,
        ge=100,
        description="TRAJLAKE_SANDBOX_SCAN_ENTRIES: entries of the writable layer the host looks at after each "
        "command to find what changed (beyond, the scan ends there and the session says so).",
    )
    sandbox_scan_seconds: float = Field(
        0.5,
        gt=0,
        description="TRAJLAKE_SANDBOX_SCAN_SECONDS: wall seconds one scan of the writable layer may take.",
    )
    sandbox_hash_bytes: int = Field(
        64 << 20,
        ge=0,
        description="TRAJLAKE_SANDBOX_HASH_BYTES: bytes of changed files the host hashes per command (beyond, a "
        "file_op has no sha256).",
    )
    sandbox_file_ops_per_command: int = Field(
        200,
        ge=1,
        description="TRAJLAKE_SANDBOX_FILE_OPS_PER_COMMAND: file_op events one command may cause (changes to the "
        "task's own and test-framework files first; the rest summed up in one annotation).",
    )
    sandbox_events_per_session: int = Field(
        20_000,
        ge=100,
        description="TRAJLAKE_SANDBOX_EVENTS_PER_SESSION: events one session may emit (beyond, counted and summed "
        "up in one annotation before session_end; session_start, evaluation and session_end always go).",
    )

    # SQL (``trajlake sql`` and every ``warehouse.sql.run_query``)
    sql_timeout_s: float = Field(
        300.0, gt=0, description="TRAJLAKE_SQL_TIMEOUT_S: a query still running after this long is interrupted."
    )
    export_memory_limit: str = Field(
        "512MB",
        pattern=r"(?i)^\s*\d+(\.\d+)?\s*([KMGT]i?B|B|bytes)\s*$",
        description="TRAJLAKE_EXPORT_MEMORY_LIMIT: DuckDB memory of an export's query; past it the ordering spills "
        "to TRAJLAKE_HOME/tmp/export, so an export's memory does not follow its size.",
    )
    sql_memory_limit: str = Field(
        "4GB",
        pattern=r"(?i)^\s*\d+(\.\d+)?\s*([KMGT]i?B|B|bytes)\s*$",
        description="TRAJLAKE_SQL_MEMORY_LIMIT: DuckDB memory limit of a query (for example 512MB, 4GB); "
        "a query needing more fails, it never spills to disk.",
    )
    sql_memory_headroom: str = Field(
        "256MB",
        pattern=r"(?i)^\s*\d+(\.\d+)?\s*([KMGT]i?B|B|bytes)\s*$",
        description="TRAJLAKE_SQL_MEMORY_HEADROOM: a query's process may grow by TRAJLAKE_SQL_MEMORY_LIMIT plus "
        "this much address space (a hard cap, RLIMIT_AS) for what DuckDB does not count: string results, "
        "thread stacks, the batches in flight.",
    )
    sql_table_rows: int = Field(
        1000,
        ge=1,
        description="TRAJLAKE_SQL_TABLE_ROWS: `trajlake sql --format table` renders at most this many rows "
        "(the row count covers all); csv and json print every row as it arrives.",
    )

    sql_view_cache: bool = Field(
        True,
        description="TRAJLAKE_SQL_VIEW_CACHE: `trajlake sql` opens the views from a plan kept in "
        "TRAJLAKE_HOME/view-plan.json while the SQLite catalog still points where the plan was made, "
        "without loading the catalog stack (any commit, setting or code change makes a new plan); false: "
        "always through the catalog.",
    )

    # Command line: the Dagster UI's lifecycle and the HTML report
    ui_stop_timeout_s: float = Field(
        2.0,
        gt=0,
        description="TRAJLAKE_UI_STOP_TIMEOUT_S: on SIGTERM/SIGINT/SIGHUP `trajlake ui` gives Dagster this long to "
        "stop gracefully, then terminates its remaining processes, and kills them after as long again.",
    )
    ui_port: int = Field(
        3000,
        ge=1,
        le=65535,
        description="TRAJLAKE_UI_PORT: the port `trajlake ui` serves on (127.0.0.1) unless --port.",
    )
    report_max_sessions: int = Field(
        500,
        ge=0,
        description="TRAJLAKE_REPORT_MAX_SESSIONS: session pages `trajlake report` writes at most (flagged sessions "
        "first, then the most recent); every session still counts in the plots and tables and is in the "
        "report's search index.",
    )

    otlp_tokens_file: Path | None = Field(
        None,
        description="TRAJLAKE_OTLP_TOKENS_FILE: the OTLP clients `trajlake import --listen` accepts, one NAME:TOKEN "
        "a line (mode 600): each request is the client whose bearer token it carries, and a conversation belongs "
        "to the client that opened it (another client's spans under its id are quarantined). With "
        "TRAJLAKE_OTLP_TOKEN as well, that token is the client `default`.",
    )
    otlp_token: str | None = Field(
        None,
        min_length=16,
        description="TRAJLAKE_OTLP_TOKEN: the bearer token `trajlake import --listen` requires of every request "
        "(Authorization: Bearer …); without it the receiver listens only on a loopback address.",
    )

    # Quality (quality/config.py documents each knob)
    # NoDecode: parsed by _parse_json below (bounded nesting, no NaN), not by pydantic-settings.
    quality_weights: Annotated[tuple[float, float, float], NoDecode] = Field(
        (0.5, 0.3, 0.2), description="TRAJLAKE_QUALITY_WEIGHTS: JSON [completion, validity, novelty], sum 1."
    )
    quality_min: float = Field(
        0.5, ge=0, le=1, description="TRAJLAKE_QUALITY_MIN: quality a session needs to be exportable."
    )
    quality_behavioural_weight: float = Field(
        0.5, ge=0, le=1, description="TRAJLAKE_QUALITY_BEHAVIOURAL_WEIGHT: quality factor for behavioural flags."
    )
    quality_outlier_z: float = Field(3.5, gt=0, description="TRAJLAKE_QUALITY_OUTLIER_Z: robust z of anomalies.")
    quality_min_profile_sessions: int = Field(
        50,
        ge=2,
        description="TRAJLAKE_QUALITY_MIN_PROFILE_SESSIONS: sessions a behaviour profile needs before it flags.",
    )
    quality_governance: Annotated[dict[str, dict[str, Any]], NoDecode] = Field(
        default_factory=dict,
        description="TRAJLAKE_QUALITY_GOVERNANCE: JSON per-flag overrides of the governance table "
        '(quality/config.py), e.g. {"edited_tests": {"weight": 0.3}}; changing it rescores.',
    )
    dedup_threshold: float = Field(
        0.8,
        gt=0,
        le=1,
        description="TRAJLAKE_DEDUP_THRESHOLD: estimated Jaccard at which two sessions are near-duplicates.",
    )
    dedup_bands: int = Field(14, ge=1, description="TRAJLAKE_DEDUP_BANDS: LSH bands of a MinHash signature.")
    dedup_rows: int = Field(8, ge=1, description="TRAJLAKE_DEDUP_ROWS: LSH rows per band.")
    score_watermark_lag_s: float = Field(
        120.0,
        ge=0,
        description="TRAJLAKE_SCORE_WATERMARK_LAG_S: a scoring run looks again at trajectories assembled this long "
        "before the last run's watermark (clocks of machines assembling into one catalog may differ by this much).",
    )
    score_chunk_sessions: int = Field(
        100_000,
        ge=1,
        description="TRAJLAKE_SCORE_CHUNK_SESSIONS: sessions a scoring run holds in memory at once (whole days; "
        "a full rescore streams day partitions in chunks of about this many sessions).",
    )
    quality_max_flag_rate: float = Field(
        0.3, ge=0, le=1, description="TRAJLAKE_QUALITY_MAX_FLAG_RATE: asset-check limit on cheat-flagged sessions."
    )
    quality_max_duplicate_rate: float = Field(
        0.5, ge=0, le=1, description="TRAJLAKE_QUALITY_MAX_DUPLICATE_RATE: asset-check limit on shadowed sessions."
    )
    max_dead_letter_rate: float = Field(
        0.01, ge=0, le=1, description="TRAJLAKE_MAX_DEAD_LETTER_RATE: asset-check limit on dead letters per record."
    )
    max_missing_seq_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="TRAJLAKE_MAX_MISSING_SEQ_RATE: asset-check limit on closed sessions with sequence gaps "
        "(a gap means events were lost upstream of Kafka).",
    )
    price_cpu_second_usd: float = Field(
        0.0000139,
        ge=0,
        description="TRAJLAKE_PRICE_CPU_SECOND_USD: environment cost of one sandbox CPU-second (costs view; "
        "the default is about $0.05 per vCPU-hour).",
    )
    price_memory_gb_second_usd: float = Field(
        0.0000015,
        ge=0,
        description="TRAJLAKE_PRICE_MEMORY_GB_SECOND_USD: environment cost of one GB-second of sandbox memory.",
    )
    price_table: str = Field(
        "",
        description="TRAJLAKE_PRICE_TABLE: model prices in USD per million tokens, as a JSON object or the path of "
        'a JSON file: {"model": {"input": 3.0, "cached": 0.3, "output": 15.0}} ("cached" defaults to "input"). '
        "Applied when costs are read (trajectories, costs, exports), so a change needs no re-ingest; a cost the "
        "server reported is used as is; a model without a price costs 0.",
    )
    max_score_drift: float = Field(
        0.15,
        ge=0,
        le=1,
        description="TRAJLAKE_MAX_SCORE_DRIFT: asset-check limit on the change of mean quality between the two "
        "latest days with sessions.",
    )

    @field_validator("kafka_extra", "catalog_properties", mode="before")
    @classmethod
    def _parse_json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            parsed = _json_setting(value) if value.strip() else {}
            if not isinstance(parsed, dict):
                raise ValueError("must be a JSON object")
            return {str(k): str(v) for k, v in parsed.items()}
        return value

    @field_validator("quality_weights", "quality_governance", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        return _json_setting(value) if isinstance(value, str) else value

    @field_validator("trusted_verdicts", mode="before")
    @classmethod
    def _parse_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip().startswith("["):  # the JSON list the configuration reference shows
                names = _json_setting(value)
                if not isinstance(names, list) or not all(isinstance(v, str) for v in names):
                    raise ValueError("must be a JSON list of names")
                return tuple(names)
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @cached_property
    def prices(self) -> PriceTable:
        """The model price table (``price_table``).

        Raises:
            ConfigError: the file is unreadable or the JSON is not a price table.
        """
        return PriceTable.load(self.price_table)

    @cached_property
    def home_dir(self) -> Path:
        """Absolute TRAJLAKE_HOME, created owner-only on first use.

        Raises:
            ConfigError: the path exists and is not a directory, or cannot be created.
        """
        path = self.home.expanduser().resolve()
        if path.exists() and not path.is_dir():
            raise ConfigError(f"TRAJLAKE_HOME={path} is not a directory")
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"TRAJLAKE_HOME={path}: cannot create it ({exc.strerror or exc})") from exc
        return path

    @property
    def home_path(self) -> Path:
        """Absolute TRAJLAKE_HOME as configured, without creating it (``home_dir`` creates it)."""
        return self.home.expanduser().resolve()

    @property
    def catalog_file(self) -> Path:
        """The SQLite catalog of the default set-up (used when no other catalog is configured)."""
        return self.home_dir / CATALOG_FILE

    @property
    def catalog_is_external(self) -> bool:
        """Whether the Iceberg catalog lives outside TRAJLAKE_HOME (a catalog URI or pyiceberg properties)."""
        return bool(self.catalog_uri) or "type" in self.catalog_properties

    def lakehouse_problem(self) -> str | None:
        """Why TRAJLAKE_HOME holds no lakehouse to read, or ``None`` when it holds one.

        With an external catalog the lakehouse is wherever that catalog says, so only the default
        set-up (SQLite under TRAJLAKE_HOME) can be found missing. Nothing is created.
        """
        path = self.home_path
        if path.exists() and not path.is_dir():
            return f"TRAJLAKE_HOME={path} is not a directory"
        if self.catalog_is_external:
            return None
        if not path.exists():
            return f"TRAJLAKE_HOME={path} does not exist"
        if not (path / CATALOG_FILE).is_file():
            return f"TRAJLAKE_HOME={path} holds no lakehouse (no {CATALOG_FILE})"
        return None

    def require_lakehouse(self) -> Settings:
        """These settings, when TRAJLAKE_HOME holds a lakehouse; read-only commands call it first.

        Raises:
            ConfigError: TRAJLAKE_HOME does not exist, is not a directory, or has no catalog (named).
        """
        problem = self.lakehouse_problem()
        if problem is not None:
            raise ConfigError(
                f"{problem}; set TRAJLAKE_HOME to an existing lakehouse, or create one with "
                "`trajlake demo` or `trajlake ingest`"
            )
        return self

    @property
    def hot_location(self) -> str:
        """Warehouse URI of the hot tier."""
        return self.hot_warehouse or (self.home_dir / "hot").as_uri()

    @property
    def cold_location(self) -> str:
        """Warehouse URI of the cold tier."""
        return self.cold_warehouse or (self.home_dir / "cold").as_uri()

    @property
    def spool_path(self) -> Path:
        """Directory of the producer outage spool."""
        return self.spool_dir.expanduser() if self.spool_dir else self.home_dir / "spool"

    @property
    def footer_cache_path(self) -> Path:
        """Directory of the object-store footer cache."""
        return self.footer_cache_dir.expanduser() if self.footer_cache_dir else self.home_dir / "cache" / "footers"

    @property
    def broker_dir(self) -> Path:
        """State directory of the embedded broker (pid file, log, address)."""
        return self.home_dir / "broker"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no number a setting may have")


def _json_setting(text: str) -> Any:
    """A setting's JSON value: a ``ValueError`` (which names the variable) for anything that is not plain JSON.

    NaN and Infinity are refused, and so is nesting deeper than the parser's stack (a ``RecursionError``
    would otherwise escape as a traceback).
    """
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} at character {exc.pos}") from None


def _binary_size(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value % size == 0:
            return f"{value // size} {unit}"
    return f"{value:_}".replace("_", " ")


def settings_reference() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) of every setting, in declaration order: the configuration reference.

    The meaning is the field's description without its leading ``TRAJLAKE_X:`` label; a default that
    depends on ``TRAJLAKE_HOME`` (``None`` here) reads "derived", and the meaning says from what.
    """
    rows = []
    for name, field in Settings.model_fields.items():
        variable = f"TRAJLAKE_{name.upper()}"
        meaning = (field.description or "").strip()
        if meaning.startswith(variable):
            meaning = meaning[len(variable) :].lstrip(" :")
        default = field.get_default(call_default_factory=True)
        if default is None:
            shown = "derived"
        elif isinstance(default, int) and name.endswith("_bytes") and default >= 1 << 10:
            shown = _binary_size(default)
        elif isinstance(default, tuple):
            shown = json.dumps(list(default))
        elif isinstance(default, dict):
            shown = json.dumps(default)
        elif isinstance(default, Path):
            shown = str(default)
        else:
            shown = default if isinstance(default, str) else f"{default:_}".replace("_", " ")
        rows.append((variable, shown, meaning))
    return rows


def settings_markdown() -> str:
    """The configuration reference as a Markdown table (``docs/configuration.md`` holds it verbatim)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for variable, default, meaning in settings_reference():
        cells = [f"`{variable}`", "*derived*" if default == "derived" else f"`{default}`", meaning]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


_SIZE_UNITS = {"b": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_size(text: str) -> int:
    """Bytes in a size as the memory settings take it, read as DuckDB does (``4GB`` = 4·10⁹, ``4GiB`` = 4·2³⁰).

    Raises:
        ValueError: not a number followed by a unit (B, KB…TB, KiB…TiB, bytes).
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B|bytes)\s*", text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment, with explicit overrides taking precedence.

    Raises:
        ConfigError: a ``TRAJLAKE_*`` variable does not parse or is out of range (each one named).
    """
    try:
        return Settings(**overrides)
    except SettingsError as exc:  # a value pydantic-settings itself could not decode (its message names the field)
        raise ConfigError(f"invalid settings: {' '.join(str(exc).split())}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"TRAJLAKE_{'_'.join(str(p) for p in e['loc'][:1]).upper()}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ConfigError(f"invalid settings: {problems}") from None
