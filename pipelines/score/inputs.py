"""Level 1's inputs: the views restricted to some sessions, and the frames the detectors read from them.

A changed session's trajectory is read only from its start day's files, its steps and events only
between its first and last event (the days they span), so the cost of reading follows the changed
sessions, not the history.
"""

from __future__ import annotations

from datetime import UTC, date

import duckdb
import polars as pl
import pyarrow as pa

from pipelines.score.predicates import instant, on_days
from warehouse.lakehouse import Lakehouse
from warehouse.sql import register_tiered
from warehouse.tables import RAW_EVENTS, STEPS, TRAJECTORIES

TRAJECTORY_QUERY = """
SELECT session_id, task_id, task_type, task_family, status, exit_reason, started_at, duration_s, n_steps,
       n_file_writes, disk_write_bytes, cpu_seconds, peak_memory_bytes, peak_processes, processes_started,
       n_network_requests, instruction, eval_passed, reward, {origin} AS origin
FROM scoped_trajectories
"""
# Outputs only where a detector reads them (a test file's assertions), and only their head.
STEP_QUERY = """
SELECT session_id, step_index, action_event_id, tool_name, command, arguments, exit_code, failure_reason,
       CASE WHEN (contains(output, 'assert') AND regexp_matches(coalesce(command, ''), 'test'))
                 OR contains(coalesce(command, ''), 'git')
            THEN left(output, 20000) END AS output
FROM scoped_steps
"""
FILE_OP_QUERY = """
SELECT session_id, seq, event_id, file_op.op AS op, file_op.path AS path, file_op.in_workspace AS in_workspace,
       file_op.sha256 AS sha256
FROM scoped_events WHERE event_type = 'file_op'
"""
# Per-session context of the detectors: workspace root, egress allowlist and history policy from
# session_start; the evaluation's details (deliverable, changes, tamper signal); an imported
# run's submission (the output of the feedback its session_end names).
SESSION_QUERY = """
WITH start AS (
    SELECT session_id,
           arg_min(extra['workspace_root'], seq) AS workspace_root,
           arg_min(session_start.egress_allowlist, seq) AS egress_allowlist,
           arg_min(coalesce(extra['history_forbidden'], extra['repo_history']), seq) AS history_forbidden,
           arg_min(extra['protected_files'], seq) AS protected_files,
           arg_min(extra['deliverables'], seq) AS deliverables,
           arg_min(extra['git_history_commit'], seq) AS history_commit
    FROM scoped_events WHERE event_type = 'session_start' GROUP BY session_id
),
evaluation AS (
    SELECT session_id, arg_max(event_id, struct_pack(seq, event_id)) AS eval_event_id,
           arg_max(CASE WHEN extra['evaluator_tampered'] IS NOT NULL
                        THEN json_merge_patch(coalesce(evaluation.details, '{}'),
                                              json_object('evaluator_tampered', extra['evaluator_tampered']))
                        ELSE evaluation.details END, struct_pack(seq, event_id)) AS eval_details
    FROM scoped_events WHERE event_type = 'evaluation' GROUP BY session_id
),
submitted AS (
    SELECT session_id, arg_max(extra['submission_event_id'], seq) AS submission_event_id
    FROM scoped_events WHERE event_type = 'session_end' AND extra['submission_event_id'] IS NOT NULL
    GROUP BY session_id
)
SELECT t.session_id, start.workspace_root, start.egress_allowlist, start.history_forbidden,
       start.protected_files, start.deliverables, start.history_commit,
       st.output AS submission, evaluation.eval_event_id, evaluation.eval_details
FROM (SELECT session_id FROM scoped_trajectories) t
LEFT JOIN start USING (session_id)
LEFT JOIN evaluation USING (session_id)
LEFT JOIN submitted USING (session_id)
LEFT JOIN scoped_steps st ON st.session_id = t.session_id AND st.feedback_event_id = submitted.submission_event_id
"""
NETWORK_QUERY = """
SELECT session_id, event_id, network_request.host AS host, network_request.port AS port,
       network_request.allowed AS allowed
FROM scoped_events WHERE event_type = 'network_request'
"""


def load_inputs(lake: Lakehouse, sessions: list[str] | None = None) -> dict[str, pl.DataFrame]:
    """The input frames (trajectories, steps, file_ops, network, sessions) from the views.

    Args:
        lake: the lakehouse.
        sessions: only these sessions (None: every session).
    """
    con = lake.views()
    try:
        scope_views(con, sessions)
        return read_inputs(con)
    finally:
        con.close()


#: Where a session came from, derived from its envelope while ``trajectories`` has no ``origin``
#: column of its own (:func:`origin_expression`): an importer's host and image name its format; the
#: synthetic fleet's hosts are ``synthetic-host-NN``; a fleet sandbox's id is ``sb-`` and the first
#: 16 characters of its session id; anything else came through the producer SDK. OTLP sessions are
#: imports of the ``otel`` format here.
DERIVED_ORIGIN = """CASE
    WHEN host_id = 'importer' THEN 'import:' || coalesce(nullif(regexp_extract(image_name, '^imported/(.+)$', 1), ''),
                                                        'unknown')
    WHEN host_id LIKE 'synthetic-host-%' THEN 'synthetic'
    WHEN sandbox_id = 'sb-' || left(session_id, 16) THEN 'sandbox'
    ELSE 'sdk'
END"""


def origin_expression(con: duckdb.DuckDBPyConnection) -> str:
    """SQL for a session's origin in ``trajectories``: its ``origin`` column, or :data:`DERIVED_ORIGIN`.

    The one place scoring learns where a session came from (``sandbox``, ``synthetic``, ``sdk``,
    ``import:<format>``, ``otlp``); behaviour profiles never mix origins.
    """
    columns = {row[0] for row in con.sql("DESCRIBE scoped_trajectories").fetchall()}
    return f"coalesce(origin, {DERIVED_ORIGIN})" if "origin" in columns else DERIVED_ORIGIN


def read_inputs(con: duckdb.DuckDBPyConnection) -> dict[str, pl.DataFrame]:
    """The detectors' input frames from the ``scoped_*`` views (:func:`scope_views`)."""
    return {
        name: pl.DataFrame(con.sql(query).to_arrow_table())
        for name, query in (
            ("trajectories", TRAJECTORY_QUERY.format(origin=origin_expression(con))),
            ("steps", STEP_QUERY),
            ("file_ops", FILE_OP_QUERY),
            ("network", NETWORK_QUERY),
            ("sessions", SESSION_QUERY),
        )
    }


def scope_views(
    con: duckdb.DuckDBPyConnection,
    sessions: list[str] | None,
    days: list[date | None] | None = None,
    lakehouse: Lakehouse | None = None,
) -> None:
    """``scoped_*`` views: the views restricted to ``sessions`` (and, for events and steps, to their days).

    ``days``, when given, are the days the sessions started on: trajectories are then read only from
    those days' files (a lookup by session id alone reads every file's ids). With ``lakehouse``
    (where the tables are), the scoped views are over only those days' data files: DuckDB opens
    no file of another day (the footers of every file of history, otherwise). The ``scoped_traj``
    temporary table holds the sessions' trajectories.
    """
    if sessions is None:
        for view in ("trajectories", "steps", "events"):
            con.execute(f"CREATE OR REPLACE TEMP VIEW scoped_{view} AS SELECT * FROM {view}")
        return
    con.register("__todo", pa.table({"session_id": pa.array(sessions, pa.string())}))
    con.execute("CREATE OR REPLACE TEMP TABLE todo AS SELECT DISTINCT session_id FROM __todo")
    con.unregister("__todo")
    within = "TRUE" if days is None else on_days(days)
    source = "trajectories"
    if lakehouse is not None and days is not None:
        listed = set(days)
        register_tiered(con, lakehouse, TRAJECTORIES, view="within_trajectories", on_days=lambda d: d in listed)
        source = "within_trajectories"
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE scoped_traj AS SELECT * FROM {source} "
        f"WHERE {within} AND session_id IN (SELECT session_id FROM todo)"
    )
    con.execute("CREATE OR REPLACE TEMP VIEW scoped_trajectories AS SELECT * FROM scoped_traj")
    # A trajectory's ``started_at`` and ``last_event_at`` are its events' least and greatest ``ts``
    # (assembly): its steps, and the events scoring reads, lie between them (later events are not
    # assembled yet; they change the trajectory, and the session is scored again). The bounds let
    # DuckDB read only those days' files.
    span = con.sql(
        "SELECT CASE WHEN count(*) = count(started_at) THEN min(started_at) END, "
        "CASE WHEN count(*) = count(last_event_at) THEN max(last_event_at) END FROM scoped_traj"
    ).fetchall()[0]
    terms = []
    if span is not None and span[0] is not None:
        terms.append(f"ts >= {instant(span[0])}")
    if span is not None and span[1] is not None:
        terms.append(f"ts <= {instant(span[1])}")
    bound = f"(ts IS NULL OR ({' AND '.join(terms)}))" if terms else "TRUE"
    spanned = None
    if lakehouse is not None and span is not None and span[0] is not None and span[1] is not None:
        first, last = span[0].astimezone(UTC).date(), span[1].astimezone(UTC).date()

        def spanned(day: date | None) -> bool:
            return day is None or first <= day <= last

    for view, spec in (("steps", STEPS), ("events", RAW_EVENTS)):
        source = view
        if lakehouse is not None and spanned is not None:
            register_tiered(con, lakehouse, spec, view=f"within_{view}", on_days=spanned)
            source = f"within_{view}"
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW scoped_{view} AS SELECT * FROM {source} "
            f"WHERE {bound} AND session_id IN (SELECT session_id FROM todo)"
        )
