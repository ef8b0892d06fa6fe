"""Every Iceberg table trajlake writes: schema, partitioning, sort order, view name.

Tables are created on first use and evolved (new optional columns only) when a
definition gains columns, so an upgraded trajlake opens an older warehouse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import DayTransform, IdentityTransform, Transform

from common.settings import Settings
from schemas.iceberg import raw_events_schema
from warehouse.errors import UnknownTable, WarehouseError

_TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class TableSpec:
    """Definition of one table.

    Attributes:
        name: table name inside the trajlake namespace.
        view: the stable SQL view name over it.
        schema: an Iceberg schema, or an Arrow schema (ids assigned on creation).
        partition_by: (source column, transform) pairs.
        sort_by: columns of the sort order, ascending.
        properties: extra table properties.
        derived: a query over ``{stored}`` (the table's rows, view ``<view>_stored``) and the views
            of tables without one, defining the view; None: the view is the rows.
    """

    name: str
    view: str
    schema: Schema | pa.Schema
    partition_by: list[tuple[str, Transform[Any, Any]]] = field(default_factory=list)
    sort_by: list[str] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    derived: str | None = None

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the table's rows."""
        if isinstance(self.schema, pa.Schema):
            return self.schema
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        return schema_to_pyarrow(self.schema, include_field_ids=False)


_PARQUET = {
    "write.parquet.compression-codec": "zstd",
    "write.target-file-size-bytes": str(128 << 20),
    "format-version": "2",
}
# Tables read by session: files are sorted by session_id, so small row groups have narrow
# session_id ranges and a lookup reads one row group per file instead of every row.
_PARQUET_BY_SESSION = {**_PARQUET, "write.parquet.row-group-limit": "16384"}

RAW_EVENTS = TableSpec(
    name="raw_events",
    view="events",
    schema=raw_events_schema(),
    partition_by=[("ts", DayTransform())],
    sort_by=["session_id", "seq"],
    properties=_PARQUET_BY_SESSION,
)

DEAD_LETTERS = TableSpec(
    name="dead_letters",
    view="dead_letters",
    schema=pa.schema(
        [
            ("kafka_topic", pa.string()),
            ("kafka_partition", pa.int32()),
            ("kafka_offset", pa.int64()),
            ("kafka_timestamp", _TS),
            ("raw_key", pa.binary()),
            ("raw_value", pa.binary()),
            ("value_bytes", pa.int64()),
            ("reason", pa.string()),
            ("error", pa.string()),
            ("schema_fingerprint", pa.string()),
            ("ingested_at", _TS),
        ]
    ),
    partition_by=[("ingested_at", DayTransform())],
    sort_by=["kafka_topic", "kafka_partition", "kafka_offset"],
    properties=_PARQUET,
)

TRAJECTORIES = TableSpec(
    name="trajectories",
    view="trajectories",
    schema=pa.schema(
        [
            ("session_id", pa.string()),
            ("task_id", pa.string()),
            ("task_type", pa.string()),
            ("sandbox_id", pa.string()),
            ("host_id", pa.string()),
            ("image_name", pa.string()),
            ("image_version", pa.string()),
            ("agent_name", pa.string()),
            ("agent_version", pa.string()),
            ("agent_model", pa.string()),
            ("policy_version", pa.string()),
            ("status", pa.string()),
            ("exit_reason", pa.string()),
            ("started_at", _TS),
            ("ended_at", _TS),
            ("last_event_at", _TS),
            ("duration_s", pa.float64()),
            ("n_events", pa.int64()),
            ("max_seq", pa.int64()),
            ("n_missing_seq", pa.int64()),
            ("n_steps", pa.int64()),
            ("n_tool_errors", pa.int64()),
            ("n_distinct_tools", pa.int64()),
            ("tool_counts", pa.map_(pa.string(), pa.int64())),
            ("n_file_writes", pa.int64()),
            ("n_file_deletes", pa.int64()),
            ("n_files_outside_workspace", pa.int64()),
            ("n_network_requests", pa.int64()),
            ("n_network_denied", pa.int64()),
            ("input_tokens", pa.int64()),
            ("cached_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("cost_usd", pa.float64()),
            ("cpu_seconds", pa.float64()),
            ("peak_memory_bytes", pa.int64()),
            ("peak_processes", pa.int64()),
            ("disk_write_bytes", pa.int64()),
            ("timeout_s", pa.float64()),
            ("instruction", pa.string()),
            ("eval_passed", pa.bool_()),
            ("tests_total", pa.int64()),
            ("tests_passed", pa.int64()),
            ("reward", pa.float64()),
            ("completed", pa.bool_()),
            ("assembled_at", _TS),
            ("task_family", pa.string()),
            ("processes_started", pa.int64()),
            ("group_id", pa.string()),  # schema v3: rollout group (K attempts of one task instance)
            ("attempt", pa.int32()),
            ("retry_of", pa.string()),  # the session a `trajlake fleet retry` re-ran
            ("exit_codes", pa.string()),  # JSON exit code -> count, from the host (session_end.extra)
            # tokens of model calls without a recorded cost, per model: the ``trajectories`` view prices
            # them with TRAJLAKE_PRICE_TABLE (stored ``cost_usd`` is what producers or servers recorded)
            (
                "unpriced_usage",
                pa.list_(
                    pa.struct(
                        [
                            ("model", pa.string()),
                            ("input_tokens", pa.int64()),
                            ("cached_tokens", pa.int64()),
                            ("output_tokens", pa.int64()),
                        ]
                    )
                ),
            ),
            # who stands behind the verdict that counted: fleet_evaluator, harness_report, harbor_verifier, …
            ("verdict_provenance", pa.string()),
            # where the session came from (pipelines.assemble ORIGIN_SQL): sandbox, synthetic, sdk,
            # import:<format>, otlp
            ("origin", pa.string()),
        ]
    ),
    partition_by=[("started_at", DayTransform())],
    sort_by=["session_id"],
    properties=_PARQUET,
)

STEPS = TableSpec(
    name="steps",
    view="steps",
    schema=pa.schema(
        [
            ("session_id", pa.string()),
            ("step_index", pa.int64()),
            ("task_id", pa.string()),
            ("task_type", pa.string()),
            ("action_event_id", pa.string()),
            ("seq", pa.int64()),
            ("ts", _TS),
            ("tool_name", pa.string()),
            ("tool_call_id", pa.string()),
            ("arguments", pa.string()),
            ("command", pa.string()),
            ("thought", pa.string()),
            ("output_tokens", pa.int64()),
            ("reasoning_tokens", pa.int64()),
            ("cost_usd", pa.float64()),
            ("model_latency_ms", pa.float64()),
            ("feedback_event_id", pa.string()),
            ("feedback_ts", _TS),
            ("output", pa.string()),
            ("exit_code", pa.int32()),
            ("duration_ms", pa.float64()),
            ("truncated", pa.bool_()),
            ("output_bytes", pa.int64()),
            ("failure_reason", pa.string()),
            ("model_call_event_id", pa.string()),  # schema v3: the agent_input event of the model call
        ]
    ),
    partition_by=[("ts", DayTransform())],
    sort_by=["session_id", "step_index"],
    properties=_PARQUET_BY_SESSION,
)

#: Every table by name; other modules register theirs with :func:`register`.
TABLES: dict[str, TableSpec] = {}


def register(spec: TableSpec) -> TableSpec:
    """Add a table definition to :data:`TABLES`."""
    TABLES[spec.name] = spec
    return spec


for _spec in (RAW_EVENTS, DEAD_LETTERS, TRAJECTORIES, STEPS):
    register(_spec)

# Quality layer (quality/, pipelines/score/, pipelines/export/): rewritten per scoring run.
SCORES = register(
    TableSpec(
        name="scores",
        view="scores",
        schema=pa.schema(
            [
                ("session_id", pa.string()),
                ("task_id", pa.string()),
                ("task_type", pa.string()),
                ("completion", pa.float64()),
                ("validity", pa.float64()),
                ("novelty", pa.float64()),
                ("quality", pa.float64()),
                ("has_loop", pa.bool_()),
                ("steps_z", pa.float64()),
                ("n_cheat_flags", pa.int64()),
                ("security_flagged", pa.bool_()),
                ("failure_cause", pa.string()),
                ("retry_advice", pa.string()),
                ("exportable", pa.bool_()),
                ("scorer_version", pa.string()),
                ("scored_at", _TS),
                ("flags", pa.string()),
                ("task_family", pa.string()),
                ("config_digest", pa.string()),
                ("started_at", _TS),  # the partition: a run rewrites only the days of the sessions it rescored
                ("outcome", pa.string()),  # success | failure | unevaluated | infrastructure | agent_crash | running
                # the arithmetic: w_completion·completion + w_validity·validity + w_novelty·novelty = raw_quality;
                # × governance_weight (set by weight_flag) = quality; exportable needs quality ≥ min_quality
                ("raw_quality", pa.float64()),
                ("governance_weight", pa.float64()),
                ("weight_flag", pa.string()),
                ("w_completion", pa.float64()),
                ("w_validity", pa.float64()),
                ("w_novelty", pa.float64()),
                ("min_quality", pa.float64()),
            ]
        ),
        partition_by=[("started_at", DayTransform())],
        sort_by=["session_id"],
        properties=_PARQUET,
        # A session another one later shadows as the better duplicate is marked in ``duplicates`` only:
        # rewriting its scores row would rewrite its day's files (copy-on-write), whichever day it is on.
        # The stored ``exportable`` is the session's as of its own last scoring; the view applies the
        # duplicates of today (a later representative is always written, so this is all it can lack).
        # ``export_decision`` says what decided ``exportable``, in the order the rules apply.
        derived=(
            "SELECT s.* REPLACE (s.exportable AND d.session_id IS NULL AS exportable), "
            "CASE WHEN s.outcome IS DISTINCT FROM 'success' "
            "THEN 'not exportable: outcome ' || coalesce(s.outcome, '?') "
            "WHEN s.security_flagged THEN 'not exportable: security flag ' || coalesce(s.weight_flag, s.flags) "
            "WHEN s.quality < s.min_quality "
            "THEN 'not exportable: quality ' || round(s.quality, 4) || ' < min_quality ' || s.min_quality "
            "WHEN d.session_id IS NOT NULL THEN 'not exportable: a duplicate (cluster ' || d.cluster_id || ')' "
            "WHEN s.exportable THEN 'exportable: outcome success' || coalesce(', quality ' || round(s.quality, 4) || "
            "' ≥ min_quality ' || s.min_quality, '') "
            "ELSE 'not exportable' END AS export_decision "
            "FROM {stored} s LEFT JOIN (SELECT session_id, any_value(cluster_id) AS cluster_id FROM duplicates "
            "WHERE NOT is_representative GROUP BY session_id) d USING (session_id)"
        ),
    )
)
FLAGS = register(
    TableSpec(
        name="flags",
        view="flags",
        schema=pa.schema(
            [
                ("session_id", pa.string()),
                ("flag", pa.string()),
                ("flag_class", pa.string()),
                ("severity", pa.string()),
                ("evidence", pa.string()),
                ("score", pa.float64()),
                ("scorer_version", pa.string()),
                ("scored_at", _TS),
                ("confirmed", pa.bool_()),
                ("started_at", _TS),  # the session's; the partition
            ]
        ),
        partition_by=[("started_at", DayTransform())],
        sort_by=["session_id", "flag"],
        properties=_PARQUET,
    )
)
_FEATURES = (  # quality.anomalies.FEATURES (the warehouse layer does not import quality; a test compares them)
    "n_steps",
    "duration_s",
    "n_file_writes",
    "disk_write_bytes",
    "cpu_seconds",
    "peak_memory_bytes",
    "peak_processes",
    "processes_started",
    "n_network_requests",
    "error_rate",
    "run_tests_share",
)
# Behaviour profiles per profile (origin/task family: quality.anomalies.profile_key) and day
# (quality/combine.py): medians and p90 of the session
# features, the z-score baseline, tool mix and step exit codes as JSON; a scoring run rewrites the
# days whose index files changed.
PROFILES = register(
    TableSpec(
        name="profiles",
        view="profiles",
        schema=pa.schema(
            [("profile", pa.string()), ("sessions", pa.int64())]
            + [(f"{feature}_{stat}", pa.float64()) for feature in _FEATURES for stat in ("p50", "p90")]
            + [
                ("tool_mix", pa.string()),
                ("exit_codes", pa.string()),
                ("scorer_version", pa.string()),
                ("scored_at", _TS),
                ("day", pa.date32()),  # the sessions' started_at day (UTC)
            ]
            # the next day's baseline: median and robust σ on the log1p scale (quality.combine.baseline_of)
            + [(f"{feature}_log_{stat}", pa.float64()) for feature in _FEATURES for stat in ("median", "sigma")]
            # the session_index files of the day the row was computed from (while they are the day's
            # files, the row holds; a run recomputes a day's rows only when they are not)
            + [("index_files", pa.string())]
        ),
        sort_by=["day", "profile"],
        properties=_PARQUET,
    )
)
DUPLICATES = register(
    TableSpec(
        name="duplicates",
        view="duplicates",
        schema=pa.schema(
            [
                ("session_id", pa.string()),
                ("cluster_id", pa.string()),
                ("is_representative", pa.bool_()),
                ("similarity", pa.float64()),
                ("method", pa.string()),
                ("scorer_version", pa.string()),
                ("scored_at", _TS),
                ("started_at", _TS),  # the session's; the partition
                # the member's, as in session_index: a new session joins a cluster without its members
                # being read from the index across history (pipelines.score.growth.grown_clusters)
                ("exact_key", pa.int64()),
                ("signature", pa.binary()),
            ]
        ),
        partition_by=[("started_at", DayTransform())],
        sort_by=["cluster_id", "session_id"],
        properties=_PARQUET,
    )
)
# The MinHash index and the rest of each scored session's own facts (quality/facts.py): a scoring
# run computes them only for sessions new or changed since the last run; novelty, z-scores and
# duplicate clusters are then computed from these rows alone. Sorted by family then start so a
# family's history is a narrow range of row groups.
SESSION_INDEX = register(
    TableSpec(
        name="session_index",
        view="session_index",
        schema=pa.schema(
            [
                ("session_id", pa.string()),
                ("session_key", pa.int64()),  # quality.dedup.session_keys: what band_keys rows point at
                ("task_id", pa.string()),
                ("task_type", pa.string()),
                ("task_family", pa.string()),
                ("family", pa.string()),
                ("started_at", _TS),
                ("day", pa.date32()),
                ("status", pa.string()),
                ("exit_reason", pa.string()),
                ("eval_passed", pa.bool_()),
                ("reward", pa.float64()),
                ("n_cheat_flags", pa.int64()),
                ("security_flagged", pa.bool_()),
                ("cheat_weight", pa.float64()),
                ("cheat_confirmed", pa.bool_()),
                ("flag_names", pa.string()),
                ("failure_cause", pa.string()),
                ("retry_advice", pa.string()),
                ("has_loop", pa.bool_()),
                *[(feature, pa.float64()) for feature in _FEATURES],
                ("exact_key", pa.int64()),
                ("signature", pa.binary()),
                ("bands", pa.list_(pa.int64())),
                ("tool_counts", pa.string()),
                ("exit_code_counts", pa.string()),
                ("assembled_at", _TS),  # of the trajectory these facts were computed from
                ("config_digest", pa.string()),
                ("scored_at", _TS),
                ("origin", pa.string()),  # where the session came from (sandbox, synthetic, sdk, import:…)
                ("profile", pa.string()),  # origin/task family: the behaviour profile it is compared within
            ]
        ),
        partition_by=[("started_at", DayTransform())],
        sort_by=["family", "started_at"],
        properties=_PARQUET_BY_SESSION,
    )
)
# The LSH band keys of session_index, one row per (session, band) with the band number mixed into
# the key (quality.dedup.flat_band_keys): finding the sessions that share a band with new ones is an
# equality join over two integer columns, not an unnest of every session's list of keys.
BAND_KEYS = register(
    TableSpec(
        name="band_keys",
        view="band_keys",
        schema=pa.schema(
            [
                ("band_key", pa.int64()),
                ("session_key", pa.int64()),
                ("started_at", _TS),  # of the session: the rows live in its day partition
            ]
        ),
        partition_by=[("started_at", DayTransform())],
        properties=_PARQUET,
    )
)
EXPORTS = register(
    TableSpec(
        name="exports",
        view="exports",
        schema=pa.schema(
            [
                ("export_id", pa.string()),
                ("created_at", _TS),
                ("format", pa.string()),
                ("out_dir", pa.string()),
                ("partition", pa.string()),
                ("min_quality", pa.float64()),
                ("sessions", pa.int64()),
                ("records", pa.int64()),
                ("scorer_version", pa.string()),
                ("files", pa.string()),
                ("manifest_sha256", pa.string()),
                ("source_snapshots", pa.string()),
            ]
        ),
        sort_by=["created_at"],
        properties=_PARQUET,
    )
)
# Sessions a stage could not take as they are (pipelines/intake/quarantine.py): ``action`` says whether the
# session still landed with the offending values NULLed (``nulled``) or was left out (``skipped``).
QUARANTINE = register(
    TableSpec(
        name="quarantine",
        view="quarantine",
        schema=pa.schema(
            [
                ("session_id", pa.string()),
                ("stage", pa.string()),
                ("reason", pa.string()),
                ("action", pa.string()),
                ("detail", pa.string()),
                ("event_id", pa.string()),
                ("run_id", pa.string()),
                ("quarantined_at", _TS),
            ]
        ),
        sort_by=["session_id"],
        properties=_PARQUET,
    )
)


def table_identifier(settings: Settings, name: str) -> tuple[str, str]:
    """``(namespace, name)`` of a trajlake table."""
    return (settings.namespace, name)


def _partition_name(column: str, transform: Transform[Any, Any]) -> str:
    if isinstance(transform, IdentityTransform):
        return column
    return f"{column}_{'day' if isinstance(transform, DayTransform) else str(transform).lower()}"


def ensure_table(catalog: Catalog, settings: Settings, name: str) -> Table:
    """Load a trajlake table, creating it or adding new columns as its definition requires.

    Raises:
        UnknownTable: ``name`` is not a trajlake table.
    """
    spec = TABLES.get(name)
    if spec is None:
        raise UnknownTable(f"unknown table {name!r}; trajlake defines {sorted(TABLES)}")
    identifier = table_identifier(settings, name)
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        schema, partition_spec, sort_order = _creation_layout(spec)
        try:
            # One commit: schema, partitioning and sort order appear together, so a concurrent
            # creator or writer never sees (or races with) a half-defined table.
            return catalog.create_table(
                identifier,
                schema=schema,
                partition_spec=partition_spec,
                sort_order=sort_order,
                properties=spec.properties,
            )
        except TableAlreadyExistsError:  # lost a creation race with another process
            table = catalog.load_table(identifier)
    for _ in range(10):
        new_columns = set(spec.arrow_schema().names) - {f.name for f in table.schema().fields}
        if not new_columns:
            return table
        try:
            with table.update_schema() as update:
                update.union_by_name(spec.schema)
        except CommitFailedException:  # another process evolved it first: look again
            pass
        table = catalog.load_table(identifier)
    raise WarehouseError(f"could not add columns {sorted(new_columns)} to {'.'.join(identifier)}")


def _creation_layout(spec: TableSpec) -> tuple[Schema, PartitionSpec, SortOrder]:
    """Schema with field ids, and the partition spec and sort order bound to those ids."""
    schema = spec.schema
    if not isinstance(schema, Schema):
        schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema))
    partition_spec = PartitionSpec(
        *[
            PartitionField(schema.find_field(column).field_id, 1000 + i, transform, _partition_name(column, transform))
            for i, (column, transform) in enumerate(spec.partition_by)
        ]
    )
    sort_order = SortOrder(*[SortField(schema.find_field(c).field_id, IdentityTransform()) for c in spec.sort_by])
    return schema, partition_spec, sort_order
