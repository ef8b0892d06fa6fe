"""Assembly: raw events → hot ``trajectories`` (one row per session) and ``steps``.

Incremental: each run reads only the raw-event files added since the snapshot it
last assembled (recorded in the ``trajectories`` table properties), recomputes
the sessions those files touch from *all* of their events, and replaces their
rows. Recomputing whole sessions makes the result independent of arrival order
and of duplicates (events are deduplicated by ``event_id`` within one sender) -- except for who
owns a session, which is the sender of its first admitted event (``pipelines.intake``). A session without
a ``session_end`` is ``running`` until its last event is older than the idle
deadline, then ``timeout``; a late event reopens it and the next run amends it.

One bad value never stops assembly for everyone (the choice: keep the original, NULL the
wide column). A number that cannot be a measurement (NaN, ±inf, or a magnitude beyond
:data:`MAX_MAGNITUDE`) stays as it was in ``raw_events`` but is NULL in ``steps`` and
``trajectories``; sums are exact (HUGEINT for counts, DECIMAL for cost) and a sum beyond
int64 is NULL too. Such a session still lands, and the ``quarantine`` table names it with
``action = 'nulled'`` and the field. A session that still cannot be assembled (an error
nobody foresaw) is found by bisecting its chunk, left out with ``action = 'skipped'`` and
its error, and counted; every other session of the chunk lands.

Concurrency: a run holds the catalog's ``assemble`` lock (``warehouse.locks``, a row in
the SQL catalog's database, so it holds across machines), so a second run waits and
then finds nothing new; each replace commit is conditioned on the snapshot it was
planned from and re-planned (existing rows looked up again) when tiering or
maintenance committed in between.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa
from pyiceberg.expressions import In, Reference
from pyiceberg.expressions.literals import literal
from pyiceberg.table import Table

from common.progress import Progress
from common.settings import Settings
from pipelines.intake.admission import admit, set_door_key
from pipelines.intake.ownership import ARRIVAL_SQL, IDENTITY_SQL, verdict_provenance_sql
from pipelines.intake.parts import rebuild_parts
from pipelines.intake.quarantine import Quarantined, record_quarantine
from warehouse.lakehouse import Lakehouse
from warehouse.snapshots import current_files, files_added_since
from warehouse.sql import connect, parquet_source
from warehouse.tables import RAW_EVENTS, STEPS, TRAJECTORIES
from warehouse.tiering import late_event_files
from warehouse.transactions import retry_on_conflict, transaction

log = logging.getLogger("trajlake.assemble")

ASSEMBLED_SNAPSHOT = "trajlake.assembled-raw-snapshot"
#: Verdict provenances that count when no settings say otherwise (``TRAJLAKE_TRUSTED_VERDICTS``).
DEFAULT_TRUSTED: tuple[str, ...] = tuple(Settings.model_fields["trusted_verdicts"].default)

# Duplicates (the same event_id more than once: a producer's re-send, or one Kafka record
# landed twice) are rare, so they are found once per run on two narrow columns and only the
# extra copies are named, by physical row: the first copy to arrive stays (``ARRIVAL_SQL``: ingest time, then
# the log order; by coordinates alone a copy re-sent later to a lower partition replaced a signed original). Ranking
# every wide row by event_id instead (a window over all columns) was most of assembly's time.
# A copy is a duplicate only of its own sender's event (``pipelines.intake.ownership``): another
# identity reusing an owner's event id keeps its row, and admission quarantines it as foreign.
_LOSERS_SQL = """
CREATE OR REPLACE TEMP TABLE losers AS
WITH dup AS (
    SELECT event_id FROM {source}
    WHERE session_id IN (SELECT session_id FROM affected)
    GROUP BY event_id HAVING count(*) > 1
)
SELECT filename, file_row_number FROM {source}
WHERE event_id IN (SELECT event_id FROM dup) AND session_id IN (SELECT session_id FROM affected)
QUALIFY row_number() OVER (
    PARTITION BY event_id, {identity} ORDER BY {arrival}, filename, file_row_number
) > 1
"""

# Everything below reads the temp table ``ev``: the deduplicated events of one chunk of the
# affected sessions. A chunk is a range of session ids, so the range prunes row groups
# (files are sorted by session) before the exact membership test.
_DEDUP_SQL = """
CREATE OR REPLACE TEMP TABLE ev AS
SELECT * EXCLUDE (filename, file_row_number)
FROM {source} ANTI JOIN losers USING (filename, file_row_number)
WHERE session_id BETWEEN $low AND $high
  AND session_id IN (SELECT session_id FROM {members})
"""

#: Largest magnitude a measured number may have (seconds, milliseconds, dollars, …); beyond it, or
#: not finite, it is NULL in the wide tables. 1e15 ms is 31,000 years; 1e15 dollars, more than exists.
MAX_MAGNITUDE = 1e15
_INT64 = "BETWEEN -9223372036854775808 AND 9223372036854775807"

#: Where a session came from (``trajectories.origin``), one of :data:`ORIGINS` or ``import:<format>``.
ORIGINS = ("sandbox", "synthetic", "sdk", "otlp")
#: The origin of a session: what its ``session_start`` declared (``extra['origin']``: the local sandbox
#: fleet says ``sandbox``, the synthetic load fleet ``synthetic``, an importer ``import:<format>``, the
#: OTLP receiver ``otlp``), else what its ``backend`` says (events written before origins were
#: declared), else ``sdk`` (any other producer-SDK host). A value outside that vocabulary is ``sdk``.
ORIGIN_SQL = """CASE
        WHEN declared_origin IN ('sandbox', 'synthetic', 'sdk', 'otlp')
             OR regexp_full_match(declared_origin, 'import:[a-z0-9][a-z0-9._-]{0,63}') THEN declared_origin
        WHEN declared_origin IS NULL AND backend = 'synthetic' THEN 'synthetic'
        WHEN declared_origin IS NULL AND backend = 'local' THEN 'sandbox'
        ELSE 'sdk' END"""

_TRAJECTORIES_SQL = """
WITH usage AS (
    -- tokens of the successful model calls without a recorded cost, per model: priced when read
    -- (``warehouse.prices``); the model a request named, else the one that answered, else the agent's
    SELECT session_id, list(struct_pack(model := model, input_tokens := input_tokens,
                                        cached_tokens := cached_tokens, output_tokens := output_tokens)
                            ORDER BY model) AS unpriced_usage
    FROM (SELECT session_id,
                 coalesce(nullif(agent_input.model_call.model, ''), agent_input.model_call.response_model,
                          agent_model, '') AS model,
                 TRY_CAST(sum(agent_input.model_call.prompt_tokens::HUGEINT) AS BIGINT) AS input_tokens,
                 TRY_CAST(sum(agent_input.model_call.cached_tokens::HUGEINT) AS BIGINT) AS cached_tokens,
                 TRY_CAST(sum(agent_input.model_call.completion_tokens::HUGEINT) AS BIGINT) AS output_tokens
          FROM ev WHERE event_type = 'agent_input' AND agent_input.model_call.status = 'ok'
                    AND agent_input.model_call.cost_usd IS NULL
          GROUP BY ALL)
    GROUP BY session_id
),
tools AS (
    SELECT session_id, map_from_entries(list(struct_pack(k := tool_name, v := n) ORDER BY tool_name)) AS tool_counts
    FROM (SELECT session_id, agent_action.tool_name AS tool_name, count(*) AS n
          FROM ev WHERE event_type = 'agent_action' GROUP BY ALL)
    GROUP BY session_id
),
agg AS (
    SELECT
        session_id,
        arg_min(task_id, struct_pack(seq, event_id)) AS task_id,
        arg_min(task_type, struct_pack(seq, event_id)) AS task_type,
        arg_min(sandbox_id, struct_pack(seq, event_id)) AS sandbox_id,
        arg_min(host_id, struct_pack(seq, event_id)) AS host_id,
        arg_min(image_name, struct_pack(seq, event_id)) AS image_name,
        arg_min(image_version, struct_pack(seq, event_id)) AS image_version,
        arg_min(agent_name, struct_pack(seq, event_id)) AS agent_name,
        arg_min(agent_version, struct_pack(seq, event_id)) AS agent_version,
        arg_min(agent_model, struct_pack(seq, event_id)) AS agent_model,
        arg_min(policy_version, struct_pack(seq, event_id)) AS policy_version,
        -- the task family (fleet template, benchmark instance of an import): novelty compares within it
        coalesce(arg_min(extra['task_family'], struct_pack(seq, event_id)) FILTER (extra['task_family'] IS NOT NULL),
                 arg_min(task_id, struct_pack(seq, event_id))) AS task_family,
        TRY_CAST(arg_max(extra['processes_started'], struct_pack(seq, event_id))
                 FILTER (event_type = 'session_end') AS BIGINT) AS processes_started,
        -- the host's count of every exit code of the session (JSON), transient retries included
        arg_max(extra['exit_codes'], struct_pack(seq, event_id)) FILTER (event_type = 'session_end') AS exit_codes,
        -- schema v3: the rollout group, the attempt and the session a retry re-runs (NULL before v3)
        arg_min(group_id, struct_pack(seq, event_id)) AS group_id,
        arg_min(attempt, struct_pack(seq, event_id)) AS attempt,
        arg_min(retry_of, struct_pack(seq, event_id)) AS retry_of,
        -- where the session came from, as its producer's door declared it on session_start
        arg_min(extra['origin'], struct_pack(seq, event_id))
            FILTER (event_type = 'session_start' AND extra['origin'] IS NOT NULL) AS declared_origin,
        arg_min(extra['backend'], struct_pack(seq, event_id)) FILTER (extra['backend'] IS NOT NULL) AS backend,
        arg_max(session_end.status, struct_pack(seq, event_id)) FILTER (event_type = 'session_end') AS end_status,
        arg_max(session_end.exit_reason, struct_pack(seq, event_id))
            FILTER (event_type = 'session_end') AS end_reason,
        min(ts) AS started_at,
        max(ts) FILTER (event_type = 'session_end') AS ended_at,
        max(ts) AS last_event_at,
        count(*) AS n_events,
        max(seq) AS max_seq,
        max(seq)::HUGEINT + 1 - count(DISTINCT seq) AS n_missing_seq,
        count(*) FILTER (event_type = 'agent_action') AS n_steps,
        count(*) FILTER (event_type = 'env_feedback' AND coalesce(env_feedback.exit_code, 0) <> 0) AS n_tool_errors,
        count(DISTINCT agent_action.tool_name) AS n_distinct_tools,
        count(*) FILTER (event_type = 'file_op' AND file_op.op IN ('write', 'create', 'rename', 'chmod'))
            AS n_file_writes,
        count(*) FILTER (event_type = 'file_op' AND file_op.op = 'delete') AS n_file_deletes,
        count(*) FILTER (event_type = 'file_op' AND NOT coalesce(file_op.in_workspace, true))
            AS n_files_outside_workspace,
        count(*) FILTER (event_type = 'network_request') AS n_network_requests,
        count(*) FILTER (event_type = 'network_request' AND NOT network_request.allowed) AS n_network_denied,
        -- HUGEINT: two int64 values can already overflow int64; range-checked below
        coalesce(sum(agent_input.input_tokens::HUGEINT), 0) AS input_tokens,
        coalesce(sum(agent_input.cached_tokens::HUGEINT), 0) AS cached_tokens,
        -- a session that recorded its model calls counts completions and costs from them, the last
        -- call (a reply without a tool call, or the one that called submit) included; otherwise
        -- from its actions, which carry their turn's output tokens and cost
        CASE WHEN bool_or(agent_input.model_call IS NOT NULL)
             THEN coalesce(sum(agent_input.model_call.completion_tokens::HUGEINT), 0)
             ELSE coalesce(sum(agent_action.output_tokens::HUGEINT), 0) END AS output_tokens,
        -- exact decimal sum: float addition depends on arrival order. The recorded cost only:
        -- the view adds the priced cost of ``unpriced_usage``
        CASE WHEN bool_or(agent_input.model_call IS NOT NULL)
             THEN coalesce(sum(agent_input.model_call.cost_usd::DECIMAL(38, 12)), 0)
             ELSE coalesce(sum(agent_action.cost_usd::DECIMAL(38, 12)), 0) END::DOUBLE AS cost_usd,
        greatest(max(session_end.cpu_seconds), max(resource_sample.cpu_seconds)) AS cpu_seconds,
        greatest(max(session_end.peak_memory_bytes), max(resource_sample.memory_bytes)) AS peak_memory_bytes,
        greatest(max(session_end.peak_processes), max(resource_sample.processes)) AS peak_processes,
        greatest(max(session_end.disk_write_bytes), max(resource_sample.disk_write_bytes)) AS disk_write_bytes,
        max(session_start.timeout_s) AS timeout_s,
        arg_min(session_start.instruction, struct_pack(seq, event_id))
            FILTER (event_type = 'session_start') AS instruction,
        arg_max(evaluation.passed, struct_pack(seq, event_id)) FILTER (event_type = 'evaluation') AS eval_passed,
        -- who stands behind the verdict that counted (pipelines.intake.ownership: only trusted ones count)
        arg_max({verdict_provenance}, struct_pack(seq, event_id)) FILTER (event_type = 'evaluation')
            AS verdict_provenance,
        arg_max(evaluation.tests_total, struct_pack(seq, event_id)) FILTER (event_type = 'evaluation') AS tests_total,
        arg_max(evaluation.tests_passed, struct_pack(seq, event_id))
            FILTER (event_type = 'evaluation') AS tests_passed,
        coalesce(
            arg_max(evaluation.reward, struct_pack(seq, event_id)) FILTER (event_type = 'evaluation'),
            arg_max(session_end.reward, struct_pack(seq, event_id)) FILTER (event_type = 'session_end')
        ) AS reward
    FROM ev
    GROUP BY session_id
)
SELECT
    agg.session_id, task_id, task_type, sandbox_id, host_id, image_name, image_version,
    agent_name, agent_version, agent_model, policy_version,
    CASE WHEN end_status IS NOT NULL THEN end_status
         WHEN last_event_at < $as_of - to_microseconds($idle_us) THEN 'timeout'
         ELSE 'running' END AS status,
    CASE WHEN end_status IS NOT NULL THEN end_reason
         WHEN last_event_at < $as_of - to_microseconds($idle_us) THEN 'idle_timeout' END AS exit_reason,
    started_at, ended_at, last_event_at,
    epoch(coalesce(ended_at, last_event_at) - started_at) AS duration_s,
    n_events, max_seq, CASE WHEN n_missing_seq {int64} THEN n_missing_seq::BIGINT END AS n_missing_seq,
    n_steps, n_tool_errors, n_distinct_tools,
    coalesce(tools.tool_counts, MAP {}) AS tool_counts,
    n_file_writes, n_file_deletes, n_files_outside_workspace, n_network_requests, n_network_denied,
    CASE WHEN input_tokens {int64} THEN input_tokens::BIGINT END AS input_tokens,
    CASE WHEN cached_tokens {int64} THEN cached_tokens::BIGINT END AS cached_tokens,
    CASE WHEN output_tokens {int64} THEN output_tokens::BIGINT END AS output_tokens,
    cost_usd, cpu_seconds, peak_memory_bytes, peak_processes,
    disk_write_bytes, timeout_s, instruction, eval_passed, tests_total, tests_passed, reward,
    task_family, processes_started, exit_codes, group_id, attempt, retry_of, usage.unpriced_usage,
    verdict_provenance,
    {origin} AS origin,
    coalesce(eval_passed, false) AS completed,
    $now AS assembled_at,
    list_filter([
        CASE WHEN NOT n_missing_seq {int64} THEN 'n_missing_seq=' || n_missing_seq END,
        CASE WHEN NOT input_tokens {int64} THEN 'input_tokens=' || input_tokens END,
        CASE WHEN NOT cached_tokens {int64} THEN 'cached_tokens=' || cached_tokens END,
        CASE WHEN NOT output_tokens {int64} THEN 'output_tokens=' || output_tokens END
    ], lambda x: x IS NOT NULL) AS _overflows
FROM agg LEFT JOIN tools USING (session_id) LEFT JOIN usage USING (session_id)
ORDER BY agg.session_id
""".replace("{int64}", _INT64).replace("{origin}", ORIGIN_SQL)

_STEPS_SQL = """
WITH actions AS (
    SELECT * FROM ev WHERE event_type = 'agent_action'
),
-- an action's first feedback by (seq, event_id), chosen on narrow columns, then fetched whole
first_feedback AS (
    SELECT parent_event_id, arg_min(event_id, struct_pack(seq, event_id)) AS event_id
    FROM ev WHERE event_type = 'env_feedback' AND parent_event_id IS NOT NULL
    GROUP BY parent_event_id
),
feedback AS (
    SELECT first.parent_event_id, struct_pack(e.event_id, e.ts, f := e.env_feedback) AS fb
    FROM first_feedback first JOIN ev e USING (event_id)
),
-- schema v3: the successful model call whose response made the action (same agent_message_id)
calls AS (
    SELECT session_id, agent_message_id, arg_max(event_id, struct_pack(seq, event_id)) AS model_call_event_id
    FROM ev
    WHERE event_type = 'agent_input' AND agent_message_id IS NOT NULL AND agent_input.model_call.status = 'ok'
    GROUP BY ALL
)
SELECT
    a.session_id,
    row_number() OVER (PARTITION BY a.session_id ORDER BY a.seq, a.event_id) - 1 AS step_index,
    a.task_id, a.task_type,
    a.event_id AS action_event_id, a.seq, a.ts,
    a.agent_action.tool_name, a.agent_action.tool_call_id, a.agent_action.arguments, a.agent_action.command,
    a.agent_action.thought, a.agent_action.output_tokens, a.agent_action.reasoning_tokens,
    a.agent_action.cost_usd, a.agent_action.model_latency_ms,
    fb.event_id AS feedback_event_id, fb.ts AS feedback_ts,
    fb.f.output, fb.f.exit_code, fb.f.duration_ms, fb.f.truncated, fb.f.output_bytes, fb.f.failure_reason,
    calls.model_call_event_id
FROM actions a LEFT JOIN feedback ON feedback.parent_event_id = a.event_id
LEFT JOIN calls ON calls.session_id = a.session_id AND calls.agent_message_id = a.agent_message_id
ORDER BY a.session_id, step_index
"""


@dataclass
class AssembleStats:
    """What one assembly run did."""

    new_files: int = 0
    sessions: int = 0
    trajectories_written: int = 0
    steps_written: int = 0
    full_rebuild: bool = False
    raw_snapshot_id: int | None = None
    chunks: int = 0  # passes over the affected sessions (bounded events each)
    nulled_sessions: int = 0  # landed with out-of-range values NULLed (quarantine action 'nulled')
    skipped_sessions: int = 0  # could not be assembled at all (quarantine action 'skipped')
    foreign_events: int = 0  # left out of a session another identity owns ('foreign_producer', 'ownership_conflict')
    uncounted_verdicts: int = 0  # verdicts untrusted or below a higher one ('untrusted_verdict', 'lower_verdict')
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)


def _float_fields(schema: pa.Schema) -> list[tuple[str, str]]:
    """``(struct column, field)`` of every floating-point payload field of ``raw_events``."""
    return [
        (column.name, child.name)
        for column in schema
        if pa.types.is_struct(column.type)
        for child in column.type
        if pa.types.is_floating(child.type)
    ]


_FLOATS = _float_fields(RAW_EVENTS.arrow_schema())


def _bad(expr: str) -> str:
    return f"({expr} IS NOT NULL AND NOT (isfinite({expr}) AND abs({expr}) <= {MAX_MAGNITUDE}))"


def _sanitize_values(con: duckdb.DuckDBPyConnection) -> list[Quarantined]:
    """NULL every non-finite or out-of-range float of ``ev`` in place; one record per offending event.

    The common case (nothing wrong) costs one scan of ``ev``; the rewrite runs only when needed.
    """
    checks = [f"CASE WHEN {_bad(f'{c}.{f}')} THEN '{c}.{f}=' || CAST({c}.{f} AS VARCHAR) END" for c, f in _FLOATS]
    found = con.execute(
        f"SELECT session_id, event_id, list_filter([{', '.join(checks)}], lambda x: x IS NOT NULL) FROM ev "
        f"WHERE {' OR '.join(_bad(f'{c}.{f}') for c, f in _FLOATS)}"
    ).fetchall()
    if not found:
        return []
    replaced = []
    schema = RAW_EVENTS.arrow_schema()
    for column in sorted({c for c, _ in _FLOATS}):
        fields = [
            f"{child.name} := "
            + (
                f"CASE WHEN {_bad(f'{column}.{child.name}')} THEN NULL ELSE {column}.{child.name} END"
                if pa.types.is_floating(child.type)
                else f"{column}.{child.name}"
            )
            for child in schema.field(column).type
        ]
        replaced.append(f"CASE WHEN {column} IS NULL THEN NULL ELSE struct_pack({', '.join(fields)}) END AS {column}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE ev AS SELECT * REPLACE ({', '.join(replaced)}) FROM ev")
    return [
        Quarantined(session_id, "assemble", "out_of_range_value", "nulled", "; ".join(values), event_id)
        for session_id, event_id, values in found
    ]


def _as_table_rows(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with the table's columns in the table's order and types (helper columns dropped)."""
    return rows.select(schema.names).cast(schema)


def _session_rules(con: duckdb.DuckDBPyConnection, trusted: tuple[str, ...]) -> list[Quarantined]:
    """The admission gate (``pipelines.intake.admission``), then whole texts from parts (``pipelines.intake.parts``)."""
    return admit(con, trusted) + rebuild_parts(con)


def _compute(
    con: duckdb.DuckDBPyConnection,
    source: str,
    members: str,
    bounds: dict[str, Any],
    params: dict[str, Any],
    trusted: tuple[str, ...] = DEFAULT_TRUSTED,
) -> tuple[pa.Table, pa.Table, list[Quarantined]]:
    """Trajectory and step rows of the sessions in ``members`` (a SQL relation of ``session_id``)."""
    con.execute(_DEDUP_SQL.format(source=source, members=members), bounds)
    try:
        records = _session_rules(con, trusted)
        records += _sanitize_values(con)
        sql = _TRAJECTORIES_SQL.replace("{verdict_provenance}", verdict_provenance_sql(con))
        trajectory_rows = con.sql(sql, params=params).to_arrow_table()
        overflows = trajectory_rows.column("_overflows").to_pylist()
        for session_id, values in zip(trajectory_rows.column("session_id").to_pylist(), overflows, strict=True):
            if values:
                records.append(Quarantined(session_id, "assemble", "sum_overflow", "nulled", "; ".join(values)))
        trajectory_rows = _as_table_rows(trajectory_rows, TRAJECTORIES.arrow_schema())
        step_rows = _as_table_rows(con.sql(_STEPS_SQL).to_arrow_table(), STEPS.arrow_schema())
    finally:
        con.execute("DROP TABLE IF EXISTS ev")
    return trajectory_rows, step_rows, records


#: Errors that one session's data can cause; anything else (I/O, interrupts) stops the run as before.
_DATA_ERRORS: tuple[type[BaseException], ...] = (duckdb.Error, pa.ArrowException, ValueError, OverflowError)


def _is_data_error(exc: BaseException) -> bool:
    # binder/parser/catalog errors are bugs in our SQL, not in a session: they must stop the run
    bugs = (
        duckdb.IOException,
        duckdb.InterruptException,
        duckdb.BinderException,
        duckdb.ParserException,
        duckdb.CatalogException,
    )
    return isinstance(exc, _DATA_ERRORS) and not isinstance(exc, bugs)


def _compute_bisecting(
    con: duckdb.DuckDBPyConnection,
    source: str,
    session_ids: list[str],
    params: dict[str, Any],
    error: BaseException,
    trusted: tuple[str, ...] = DEFAULT_TRUSTED,
) -> tuple[list[pa.Table], list[pa.Table], list[Quarantined]]:
    """Rows of ``session_ids`` (whose chunk failed with ``error``), splitting until each bad session is alone."""
    if len(session_ids) == 1:
        detail = f"{type(error).__name__}: {' '.join(str(error).split())}"
        log.warning("session %s cannot be assembled, quarantined: %s", session_ids[0], detail)
        return [], [], [Quarantined(session_ids[0], "assemble", "assembly_failed", "skipped", detail)]
    trajectories: list[pa.Table] = []
    steps: list[pa.Table] = []
    records: list[Quarantined] = []
    half = len(session_ids) // 2
    for part in (session_ids[:half], session_ids[half:]):
        con.execute("CREATE OR REPLACE TEMP TABLE part AS SELECT unnest($ids::VARCHAR[]) AS session_id", {"ids": part})
        try:
            t, st, q = _compute(con, source, "part", {"low": part[0], "high": part[-1]}, params, trusted)
            trajectories.append(t)
            steps.append(st)
            records += q
        except Exception as exc:
            if not _is_data_error(exc):
                raise
            t_parts, s_parts, q = _compute_bisecting(con, source, part, params, exc, trusted)
            trajectories += t_parts
            steps += s_parts
            records += q
    return trajectories, steps, records


def _replace_sessions(
    con: duckdb.DuckDBPyConnection, table: Table, rows: pa.Table, properties: dict[str, str], chunk: int
) -> None:
    """Replace the rows of chunk ``chunk``'s sessions with ``rows`` (delete + append, one commit).

    The rows to delete are looked up from the table's state the commit is planned on; when
    another writer (tiering, compaction) committed in between, the commit fails and is planned
    again from the new state, never re-applied blindly.
    """
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        if attempts:
            table.refresh()
        attempts += 1
        existing = _existing_ids(con, table, chunk)
        with transaction(table) as tx:
            if table.current_snapshot() is not None and existing:
                # by field: a type checker sees only the pydantic fields of pyiceberg's predicates
                tx.delete(In(term=Reference("session_id"), literals={literal(v) for v in existing}))
            tx.append(rows, snapshot_properties=properties)
            if properties:
                tx.set_properties(properties)

    retry_on_conflict(f"replace assembled sessions in {table.name()[-1]}", attempt)


def _existing_ids(con: duckdb.DuckDBPyConnection, table: Table, chunk: int) -> list[str]:
    """Session ids of chunk ``chunk`` of ``affected`` that ``table`` already holds (rows to replace)."""
    files = current_files(table).paths
    if not files:
        return []
    rows = con.execute(
        f"SELECT DISTINCT session_id FROM {parquet_source(files)} "
        "WHERE session_id IN (SELECT session_id FROM affected WHERE chunk = $chunk)",
        {"chunk": chunk},
    ).fetchall()
    return [session_id for (session_id,) in rows]


@dataclass(frozen=True)
class AssembleOptions:
    """What assembly reads from the configuration.

    Attributes:
        idle_timeout_s: a session idle this long closes as timed out (``TRAJLAKE_SESSION_IDLE_TIMEOUT_S``).
        chunk_events: events per chunk of sessions, the memory bound (``TRAJLAKE_ASSEMBLE_CHUNK_EVENTS``).
        trusted_verdicts: verdict provenances that set ``eval_passed`` and the reward (``TRAJLAKE_TRUSTED_VERDICTS``).
        memory_limit: DuckDB's; past it the work spills to the lakehouse's scratch (``TRAJLAKE_ASSEMBLE_MEMORY_LIMIT``).
    """

    idle_timeout_s: float = 900.0
    chunk_events: int = 1_000_000
    trusted_verdicts: tuple[str, ...] = ("fleet_evaluator", "harness_report", "harbor_verifier")
    memory_limit: str = "2GB"

    @classmethod
    def from_settings(cls, settings: Settings) -> AssembleOptions:
        """The options the settings give."""
        return cls(
            settings.session_idle_timeout_s,
            settings.assemble_chunk_events,
            settings.trusted_verdicts,
            settings.assemble_memory_limit,
        )


def assemble(
    lake: Lakehouse,
    as_of: datetime | None = None,
    full: bool = False,
    progress: Progress | None = None,
    options: AssembleOptions | None = None,
) -> AssembleStats:
    """Bring ``trajectories`` and ``steps`` up to date with ``raw_events``.

    Args:
        lake: the lakehouse.
        as_of: the "now" for idle-timeout decisions; wall clock by default.
        full: recompute every session instead of the new ones.
        progress: told of the sessions assembled after each chunk.
        options: idle deadline, chunk size, trusted verdicts, memory; read from the lakehouse's settings by default.

    Returns:
        :class:`AssembleStats`, with the sessions quarantined (``nulled_sessions``, ``skipped_sessions``).

    Raises:
        LockBusy: another assembly held the lock for as long as we waited.
        CommitConflict: a commit kept conflicting with concurrent writers.
    """
    with lake.lock("assemble"):
        return _assemble(lake, options or AssembleOptions.from_settings(lake.settings), as_of, full, progress)


def _assemble(
    lake: Lakehouse,
    options: AssembleOptions,
    as_of: datetime | None,
    full: bool,
    progress: Progress | None = None,
) -> AssembleStats:
    started = time.monotonic()
    raw = lake.table(RAW_EVENTS.name)
    trajectories = lake.table(TRAJECTORIES.name)
    steps = lake.table(STEPS.name)
    stats = AssembleStats()
    all_raw = current_files(raw)
    stats.raw_snapshot_id = all_raw.snapshot_id
    if all_raw.snapshot_id is None:
        return stats
    last = trajectories.properties.get(ASSEMBLED_SNAPSHOT)
    new_files = None if full else files_added_since(raw, int(last) if last else None)
    if new_files is None:
        stats.full_rebuild = True
        new_files = all_raw.paths
    stats.new_files = len(new_files)
    as_of = as_of or datetime.now(UTC)
    con = _connect(lake, options)
    stats.sessions = _mark_affected(con, new_files, trajectories, as_of, options)
    properties = {ASSEMBLED_SNAPSHOT: str(all_raw.snapshot_id)}
    if stats.sessions == 0:
        if last != str(all_raw.snapshot_id):
            with transaction(trajectories) as tx:
                tx.set_properties(properties)
        stats.seconds = time.monotonic() - started
        return stats
    # Sessions are assembled in chunks (session-id ranges) of about ``assemble_chunk_events`` events each,
    # so memory is bounded by a chunk, not by the backlog. The watermark moves with the last
    # chunk: after a crash the next run recomputes (and replaces) every affected session.
    # A session already tiered (a late event) is recomputed from its cold events too.
    source = parquet_source(all_raw.paths + late_event_files(con, lake, "affected"), row_ids=True)
    bounds = _chunk_bounds(con, source, options)
    stats.chunks = len(bounds)
    con.execute(_LOSERS_SQL.format(source=source, identity=IDENTITY_SQL, arrival=ARRIVAL_SQL))
    params = {"as_of": as_of, "idle_us": int(options.idle_timeout_s * 1_000_000), "now": datetime.now(UTC)}
    run = _ChunkRun(con, lake, steps, trajectories, source, params, options, run_id=str(all_raw.snapshot_id))
    for chunk, low, high in bounds:
        _assemble_chunk(run, (chunk, low, high), properties if chunk == stats.chunks - 1 else {}, stats)
        if progress is not None:
            progress(stats.trajectories_written + stats.skipped_sessions, stats.sessions, "sessions")
    stats.seconds = time.monotonic() - started
    log.info("assembled %d sessions (%d steps) from %d new files", stats.sessions, stats.steps_written, len(new_files))
    return stats


def _connect(lake: Lakehouse, options: AssembleOptions) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection bounded by the assemble memory limit, spilling into the lake's scratch space."""
    con = connect()
    spill = lake.scratch("assemble")
    con.execute(f"SET memory_limit = '{options.memory_limit}'")
    con.execute(f"SET temp_directory = '{spill}'")
    con.execute("SET preserve_insertion_order = false")
    set_door_key(con, lake.settings.home_dir)  # the admission gate verifies the verdicts door's signature
    return con


def _mark_affected(
    con: duckdb.DuckDBPyConnection,
    new_files: list[str],
    trajectories: Table,
    as_of: datetime,
    options: AssembleOptions,
) -> int:
    """Fill the temp table ``affected``; returns how many sessions it holds.

    Sessions touched by new files, plus open sessions whose idle deadline may have passed.
    """
    con.execute("CREATE TEMP TABLE affected (session_id VARCHAR)")
    if new_files:
        con.execute(f"INSERT INTO affected SELECT DISTINCT session_id FROM {parquet_source(new_files)}")
    open_files = current_files(trajectories).paths
    if open_files:
        con.execute(
            f"INSERT INTO affected SELECT session_id FROM {parquet_source(open_files)} "
            "WHERE status = 'running' AND epoch(last_event_at) < $cutoff",
            {"cutoff": as_of.timestamp() - options.idle_timeout_s},
        )
    con.execute("CREATE OR REPLACE TEMP TABLE affected AS SELECT DISTINCT session_id FROM affected")
    affected = con.execute("SELECT count(*) FROM affected").fetchone()
    return affected[0] if affected else 0


def _chunk_bounds(con: duckdb.DuckDBPyConnection, source: str, options: AssembleOptions) -> list[Any]:
    """Number each affected session's chunk (``affected.chunk``); returns (chunk, first id, last id) per chunk."""
    counted = con.execute(f"SELECT count(*) FROM {source} WHERE session_id IN (SELECT session_id FROM affected)")
    events = counted.fetchone()
    chunks = max(1, math.ceil((events[0] if events else 0) / options.chunk_events))
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE affected AS SELECT session_id, ntile({chunks}) OVER "
        "(ORDER BY session_id) - 1 AS chunk FROM affected"
    )
    ranges = con.execute("SELECT chunk, min(session_id), max(session_id) FROM affected GROUP BY chunk ORDER BY chunk")
    return ranges.fetchall()


@dataclass(frozen=True)
class _ChunkRun:
    """What every chunk of one assemble run shares."""

    con: duckdb.DuckDBPyConnection
    lake: Lakehouse
    steps: Table
    trajectories: Table
    source: str  # the raw (and late cold) event files, as a DuckDB source
    params: dict[str, Any]
    options: AssembleOptions
    run_id: str  # the raw snapshot assembled (the quarantine records' run)


def _assemble_chunk(
    run: _ChunkRun, bounds: tuple[int, str, str], watermark: dict[str, str], stats: AssembleStats
) -> None:
    """Compute one chunk's sessions, replace them in ``steps`` then ``trajectories``; count them into ``stats``.

    ``watermark`` is the properties the trajectories commit sets (the last chunk's moves the watermark).
    """
    con, chunk = run.con, bounds[0]
    trajectory_rows, step_rows, records = _compute_chunk(con, run.source, bounds, run.params, run.options)
    # Steps first: if we die between the commits, the trajectories watermark has not moved and
    # the next run recomputes (and replaces) the same sessions in both tables.
    _replace_sessions(con, run.steps, step_rows, {}, chunk)
    recomputed = [
        sid
        for (sid,) in con.execute("SELECT session_id FROM affected WHERE chunk = $chunk", {"chunk": chunk}).fetchall()
    ]
    record_quarantine(run.lake, records, run.run_id, replace_stage="assemble", recomputed=recomputed)
    _replace_sessions(con, run.trajectories, trajectory_rows, watermark, chunk)
    stats.trajectories_written += trajectory_rows.num_rows
    stats.steps_written += step_rows.num_rows
    stats.nulled_sessions += len({r.session_id for r in records if r.action == "nulled"})
    stats.skipped_sessions += len({r.session_id for r in records if r.action == "skipped"})
    stats.foreign_events += sum(1 for r in records if r.reason in ("foreign_producer", "ownership_conflict"))
    stats.uncounted_verdicts += sum(1 for r in records if r.reason in ("untrusted_verdict", "lower_verdict"))


def _compute_chunk(
    con: duckdb.DuckDBPyConnection,
    source: str,
    bounds: tuple[int, str, str],
    params: dict[str, Any],
    options: AssembleOptions,
) -> tuple[pa.Table, pa.Table, list[Quarantined]]:
    """One chunk's trajectory and step rows; a session whose data breaks the chunk is found by halving."""
    chunk, low, high = bounds
    try:
        return _compute(
            con,
            source,
            "affected WHERE chunk = $chunk",
            {"low": low, "high": high, "chunk": chunk},
            params,
            options.trusted_verdicts,
        )
    except Exception as exc:
        if not _is_data_error(exc):
            raise
        # One session's data broke the chunk: find it (them) by halving, keep every other session.
        ids = [
            sid
            for (sid,) in con.execute(
                "SELECT session_id FROM affected WHERE chunk = $chunk ORDER BY session_id", {"chunk": chunk}
            ).fetchall()
        ]
        t_parts, s_parts, records = _compute_bisecting(con, source, ids, params, exc, options.trusted_verdicts)
        trajectory_rows = pa.concat_tables([TRAJECTORIES.arrow_schema().empty_table(), *t_parts])
        step_rows = pa.concat_tables([STEPS.arrow_schema().empty_table(), *s_parts])
        return trajectory_rows, step_rows, records
