"""``trajlake score``: trajectories, steps, events → the scores, flags, duplicates, profiles, session_index tables.

Incremental: a run scores only what changed since the run before it, so its cost follows the new
work, not the history.

1. **Changed sessions**: trajectories assembled after the last run's watermark (the latest
   ``assembled_at`` it covered, kept in the ``scores`` table properties, minus a lag for clocks of
   other machines). Their inputs are read from the views restricted to them, and their own facts
   (:mod:`quality.facts`: detector flags, failure cause, features, MinHash signature, LSH band
   keys) replace their rows of the ``session_index`` table.
2. **Affected days**: the days of the changed sessions, and of the sessions whose novelty window
   (the ``novelty_max_history`` earlier trajectories of the family) a changed session entered or
   left. Level 2 (:mod:`quality.combine`) is recomputed for every session of those days from the
   index alone: z-scores within task type and day, novelty, quality.
3. **Clusters**: the changed sessions' band keys are joined against the ``band_keys`` table (one
   integer row per session and band) in DuckDB; the candidates, the affected days' sessions and
   every old cluster any of them is in form a closed set, whose clusters and representatives are
   recomputed (a new better trajectory becomes the representative, the old one is marked a
   duplicate) and whose exportability is updated.

Every lookup is bounded by what a run can touch: rows of known sessions are read only on their
days (the tables are day-partitioned: DuckDB skips other days' files by their statistics), a
session's steps and events only between its first and last event, a family's earlier sessions by
looking back from the latest one an hour, a day, … (:func:`_novelty_context`).

Every table is updated by session (a delete restricted to the rows' day partitions, and an
append), never rewritten wholesale; the ``scores`` commit, last, records the watermark, the
trajectories snapshot and the configuration digest. A crash before it leaves the watermark where
it was: the next run recomputes the same sessions (every step is idempotent). Days are processed
in chronological chunks of about ``score_chunk_sessions`` sessions, so memory is bounded whatever
the size of a run. A changed scorer version or configuration (or ``force``) rescores everything:
the facts to recompute are deleted first, in one pass per table, then the same steps run over
every day, chunk by chunk (level 1 in any order, or in parallel as Dagster partitions,
:func:`index_days`), with the duplicate clusters rebuilt from empty. The result equals
:func:`quality.scoring.score_sessions` over all sessions at once (tested on a shuffled history).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    Not,
    Or,
    Reference,
    literal,
)
from pyiceberg.table import Table

from common.errors import ConfigError
from common.settings import Settings
from quality.anomalies import FEATURES, MIN_GROUP
from quality.combine import baseline_days, baseline_of, clusters, combine, exportable, profiles
from quality.config import QualityConfig
from quality.dedup import DUPLICATES_SCHEMA, components, flat_band_keys, session_keys
from quality.facts import FACTS_SCHEMA, facts_digest, session_facts, signatures_of
from quality.scoring import finish_scores
from warehouse.catalog import open_catalog
from warehouse.locks import job_lock
from warehouse.snapshots import day_partitions, live_files
from warehouse.sql import open_views, register_table, register_tiered
from warehouse.tables import (
    BAND_KEYS,
    DUPLICATES,
    FLAGS,
    PROFILES,
    RAW_EVENTS,
    SCORES,
    SESSION_INDEX,
    STEPS,
    TRAJECTORIES,
    TableSpec,
    ensure_table,
)
from warehouse.transactions import retry_on_conflict, transaction

log = logging.getLogger("trajlake.score")

SCORED_SNAPSHOT = "trajlake.scored-trajectories-snapshot"
SCORED_VERSION = "trajlake.scorer-version"
SCORED_DIGEST = "trajlake.scoring-config-digest"
SCORED_CONFIG = "trajlake.scoring-config"
#: The latest ``assembled_at`` (µs since the epoch) a run covered.
SCORED_WATERMARK = "trajlake.scored-watermark"

TRAJECTORY_QUERY = """
SELECT session_id, task_id, task_type, task_family, status, exit_reason, started_at, duration_s, n_steps,
       n_file_writes, disk_write_bytes, cpu_seconds, peak_memory_bytes, peak_processes, processes_started,
       n_network_requests, instruction, eval_passed, reward
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


@dataclass
class ScoreStats:
    """What one scoring run did."""

    sessions: int = 0
    flagged_sessions: int = 0
    flags_by_type: dict[str, int] = field(default_factory=dict)
    duplicate_sessions: int = 0
    clusters: int = 0
    exportable: int = 0
    mean_quality: float | None = None
    scorer_version: str = ""
    config_digest: str = ""
    skipped: bool = False
    trajectories_snapshot_id: int | None = None
    seconds: float = 0.0
    mode: str = "incremental"  # "incremental", "full" (a changed configuration or force) or "skipped"
    changed_sessions: int = 0  # whose own facts were recomputed (level 1)
    rescored_sessions: int = 0  # whose scores were recomputed (level 2: every session of the affected days)
    affected_days: int = 0
    #: level-2 chunks whose clusters were recomputed from a closed set of sessions (the others grew from their
    #: fresh sessions' links alone: see ``_grown_clusters``)
    closed_sets: int = 0
    #: wall seconds by phase (changed, level1, affected, level2, profiles, summary): where a run's time went
    phases: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``phases[name]``."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.monotonic() - started, 3)

    def laps(self, prefix: str) -> Callable[[str], None]:
        """A stopwatch: ``lap(name)`` adds the time since the previous lap to ``phases[prefix + name]``."""
        last = time.monotonic()

        def lap(name: str) -> None:
            nonlocal last
            now = time.monotonic()
            key = prefix + name
            self.phases[key] = round(self.phases.get(key, 0.0) + now - last, 3)
            last = now

        return lap

    def as_dict(self) -> dict[str, object]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)


def quality_config(settings: Settings) -> QualityConfig:
    """The quality knobs from settings (governance overrides from ``TRAJLAKE_QUALITY_GOVERNANCE``).

    Raises:
        ConfigError: the weights, thresholds or governance overrides are inconsistent.
    """
    w_c, w_v, w_n = settings.quality_weights
    try:
        return QualityConfig(
            w_completion=w_c,
            w_validity=w_v,
            w_novelty=w_n,
            min_quality=settings.quality_min,
            behavioural_weight=settings.quality_behavioural_weight,
            governance_overrides=dict(settings.quality_governance),
            outlier_z=settings.quality_outlier_z,
            dedup_threshold=settings.dedup_threshold,
            dedup_bands=settings.dedup_bands,
            dedup_rows=settings.dedup_rows,
        )
    except ValueError as exc:
        raise ConfigError(f"quality configuration: {exc}") from exc


def scoring_manifest(settings: Settings, catalog: Catalog | None = None) -> dict[str, object]:
    """The scoring configuration the current ``scores`` were computed with (for export manifests).

    Falls back to the configuration in force now when nothing has been scored yet.
    """

    catalog = catalog or open_catalog(settings)
    props = ensure_table(catalog, settings, SCORES.name).properties
    recorded = props.get(SCORED_CONFIG)
    if recorded:
        try:
            manifest = json.loads(recorded)
            if isinstance(manifest, dict):
                return {**manifest, "digest": props.get(SCORED_DIGEST)}
        except ValueError:
            log.warning("scores table carries an unreadable scoring configuration; reporting the current one")
    config = quality_config(settings)
    return {**config.manifest(), "digest": config.digest()}


def load_inputs(
    settings: Settings, catalog: Catalog | None = None, sessions: list[str] | None = None
) -> dict[str, pl.DataFrame]:
    """The input frames (trajectories, steps, file_ops, network, sessions) from the views.

    Args:
        settings: where the lakehouse is.
        catalog: an open catalog, or None.
        sessions: only these sessions (None: every session).
    """
    con = open_views(settings, catalog)
    try:
        _scope(con, sessions)
        return _inputs(con)
    finally:
        con.close()


def _inputs(con: duckdb.DuckDBPyConnection) -> dict[str, pl.DataFrame]:
    return {
        name: pl.DataFrame(con.sql(query).to_arrow_table())
        for name, query in (
            ("trajectories", TRAJECTORY_QUERY),
            ("steps", STEP_QUERY),
            ("file_ops", FILE_OP_QUERY),
            ("network", NETWORK_QUERY),
            ("sessions", SESSION_QUERY),
        )
    }


def _scope(
    con: duckdb.DuckDBPyConnection,
    sessions: list[str] | None,
    days: list[date | None] | None = None,
    lakehouse: tuple[Settings, Catalog] | None = None,
) -> None:
    """``scoped_*`` views: the views restricted to ``sessions`` (and, for events and steps, to their days).

    ``days``, when given, are the days the sessions started on: trajectories are then read only from
    those days' files (a lookup by session id alone reads every file's ids). With ``lakehouse``
    (where the tables are), the scoped views are over only those days' data files: DuckDB opens
    no file of another day (the footers of every file of history, otherwise).
    """
    if sessions is None:
        for view in ("trajectories", "steps", "events"):
            con.execute(f"CREATE OR REPLACE TEMP VIEW scoped_{view} AS SELECT * FROM {view}")
        return
    con.register("__todo", pa.table({"session_id": pa.array(sessions, pa.string())}))
    con.execute("CREATE OR REPLACE TEMP TABLE todo AS SELECT DISTINCT session_id FROM __todo")
    con.unregister("__todo")
    on_days = "TRUE" if days is None else _on_days(days)
    source = "trajectories"
    if lakehouse is not None and days is not None:
        listed = set(days)
        register_tiered(con, *lakehouse, TRAJECTORIES, view="within_trajectories", on_days=lambda d: d in listed)
        source = "within_trajectories"
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE scoped_traj AS SELECT * FROM {source} "
        f"WHERE {on_days} AND session_id IN (SELECT session_id FROM todo)"
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
        terms.append(f"ts >= {_instant(span[0])}")
    if span is not None and span[1] is not None:
        terms.append(f"ts <= {_instant(span[1])}")
    bound = f"(ts IS NULL OR ({' AND '.join(terms)}))" if terms else "TRUE"
    spanned = None
    if lakehouse is not None and span is not None and span[0] is not None and span[1] is not None:
        first, last = span[0].astimezone(UTC).date(), span[1].astimezone(UTC).date()

        def spanned(day: date | None) -> bool:
            return day is None or first <= day <= last

    for view, spec in (("steps", STEPS), ("events", RAW_EVENTS)):
        source = view
        if lakehouse is not None and spanned is not None:
            register_tiered(con, *lakehouse, spec, view=f"within_{view}", on_days=spanned)
            source = f"within_{view}"
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW scoped_{view} AS SELECT * FROM {source} "
            f"WHERE {bound} AND session_id IN (SELECT session_id FROM todo)"
        )


def _arrow(frame: pl.DataFrame, spec: TableSpec, version: str, now: datetime) -> pa.Table:
    schema = spec.arrow_schema()
    extra: dict[str, object] = {"scorer_version": version, "scored_at": now}
    columns = []
    for f in schema:
        if f.name in frame.columns:
            columns.append(frame[f.name].to_arrow().cast(f.type))
        else:
            columns.append(pa.array([extra.get(f.name)] * frame.height, type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def score_all(settings: Settings, catalog: Catalog | None = None, force: bool = False) -> ScoreStats:
    """Score the sessions new or changed since the last run (every session when the configuration changed).

    Args:
        settings: trajlake settings (quality knobs, ``score_chunk_sessions``).
        catalog: Iceberg catalog; opened from settings by default.
        force: rescore every session even when nothing changed.

    Returns:
        :class:`ScoreStats` (``skipped`` when the last run already covered this snapshot and
        configuration; ``sessions == 0`` when there are no trajectories yet: nothing is written).

    Raises:
        LockBusy: another scoring run held the catalog's ``score`` lock for as long as we waited.
    """
    catalog = catalog or open_catalog(settings)
    # One scoring run at a time across every process and machine sharing the catalog: a
    # second run waits, then finds the scores up to date.
    with job_lock(settings, catalog, "score"):
        return _score_all(settings, catalog, force)


def _score_all(settings: Settings, catalog: Catalog, force: bool) -> ScoreStats:
    started = time.monotonic()
    config = quality_config(settings)
    trajectories = ensure_table(catalog, settings, TRAJECTORIES.name)
    scores_table = ensure_table(catalog, settings, SCORES.name)
    snapshot = trajectories.current_snapshot()
    stats = ScoreStats(scorer_version=config.scorer_version, config_digest=config.digest())
    stats.trajectories_snapshot_id = snapshot.snapshot_id if snapshot else None
    props = scores_table.properties
    same_config = props.get(SCORED_VERSION) == config.scorer_version and props.get(SCORED_DIGEST) == stats.config_digest
    if not force and snapshot is not None and props.get(SCORED_SNAPSHOT) == str(snapshot.snapshot_id) and same_config:
        stats.skipped, stats.mode = True, "skipped"
        stats.seconds = time.monotonic() - started
        return stats
    watermark = props.get(SCORED_WATERMARK)
    full = force or not same_config or watermark is None
    stats.mode = "full" if full else "incremental"
    con = open_views(settings, catalog)
    try:
        # trajectories assembled up to the lag before the watermark are looked at again: other machines'
        # clocks may lag (on one machine assembly stamps ``assembled_at`` under its lock: exact at lag 0)
        since = None if full else int(watermark or 0) - int(settings.score_watermark_lag_s * 1_000_000)
        with stats.phase("changed"):
            changed = _changed(con, since)
        if changed.height == 0 and not full:  # a new snapshot without new trajectories (tiering, compaction)
            _commit_scores(settings, catalog, config, stats, props, watermark)
            _summarize(con, settings, catalog, stats)
            stats.seconds = time.monotonic() - started
            return stats
        to_index = changed
        current = pl.Series("session_id", [], pl.Utf8)
        if full:
            # Rebuilt from empty (the index keeps its rows until each is replaced): clusters must be (see
            # ``_cluster_set``), and rows of an older scorer would otherwise linger. Readers see partial
            # quality tables until the run ends.
            for spec in (SCORES, DUPLICATES, PROFILES):
                _clear(ensure_table(catalog, settings, spec.name))
            stale_flags = Or(
                _ANOMALY_FLAGS,
                Not(EqualTo(term=Reference("scorer_version"), value=literal(config.scorer_version))),
            )
            _commit(ensure_table(catalog, settings, FLAGS.name), None, stale_flags)
            for spec in (SCORES, FLAGS, DUPLICATES, PROFILES):
                _refresh(con, settings, catalog, spec)
            if not force:  # facts already computed for this configuration and trajectory (``index_days``) are kept
                with stats.phase("changed"):
                    current = _current_facts(con, facts_digest(config))
                to_index = changed.filter(~pl.col("session_id").is_in(current.implode()))
        new_watermark = _max_watermark(changed, watermark)
        if not full:
            # the lag window comes back every run: a session whose facts match its trajectory has not changed
            with stats.phase("changed"):
                current = _current_facts(con, facts_digest(config), changed)
            changed = changed.filter(~pl.col("session_id").is_in(current.implode()))
            to_index = changed
        with stats.phase("level1"):
            # where changed sessions stood (rows to delete where their start moved); a full run cleared those tables
            old_positions = _NO_POSITIONS if full else _index_positions(con, to_index)
            if full:
                # the facts to recompute go first, in one pass per table (deleting them chunk by chunk would
                # rewrite the same day files once per chunk); with none kept, the tables are simply emptied
                if force or current.len() == 0:
                    for spec in (SESSION_INDEX, BAND_KEYS, FLAGS):
                        _clear(ensure_table(catalog, settings, spec.name))
                else:
                    again = _drop_facts(con, settings, catalog, _index_positions(con, to_index))
                    to_index = pl.concat([to_index, changed.join(again, on="session_id", how="semi")]).sort(
                        "started_at", "session_id", nulls_last=True
                    )
            for chunk in _chunks(to_index, settings.score_chunk_sessions):
                _index_sessions(settings, catalog, con, chunk, config, old_positions, stats)
                stats.changed_sessions += chunk.height
            _refresh(con, settings, catalog, SESSION_INDEX)
            _refresh(con, settings, catalog, BAND_KEYS)
        with stats.phase("affected"):
            if full:  # every session; every session's links are new (the clusters were cleared)
                targets = con.sql(
                    "SELECT session_id, day FROM session_index ORDER BY started_at NULLS LAST, session_id"
                ).pl()
                changed_ids: set[str] | None = None
            else:
                targets = _affected_sessions(con, changed, old_positions, config)
                changed_ids = set(changed["session_id"].to_list())
        stats.affected_days = targets["day"].n_unique()
        # changed sessions now on another day than their index row was (before this run)
        moved = to_index.join(old_positions.select("session_id", pl.col("day").alias("was")), on="session_id")
        moved = moved.filter(pl.col("day").ne_missing(pl.col("was"))).select("session_id", "day")
        with stats.phase("level2"):
            for chunk in _chunks(targets, settings.score_chunk_sessions):
                stats.rescored_sessions += _rescore(
                    settings, catalog, con, chunk, changed_ids, config, old_positions, moved, stats
                )
        with stats.phase("profiles"):
            touched = targets["day"].unique().to_list() if full else _touched_days(changed, old_positions)
            _write_profiles(settings, catalog, con, touched, config)
        with stats.phase("summary"):
            _commit_scores(settings, catalog, config, stats, props, new_watermark)
            _summarize(con, settings, catalog, stats)
    finally:
        con.close()
    stats.seconds = time.monotonic() - started
    log.info(
        "scored %d changed sessions (%s), rescored %d over %d days in %.1f s",
        stats.changed_sessions,
        stats.mode,
        stats.rescored_sessions,
        stats.affected_days,
        stats.seconds,
    )
    return stats


def index_days(settings: Settings, days: list[date | None], catalog: Catalog | None = None) -> int:
    """Level 1 for every session started on ``days``: their ``session_index`` rows and detector flags.

    The expensive half of a full rescore, independent per day: Dagster runs it as daily partitions
    in parallel; the next ``score_all`` then finds the index current and only combines.

    Returns:
        The sessions indexed.
    """
    catalog = catalog or open_catalog(settings)
    config = quality_config(settings)
    con = open_views(settings, catalog)
    try:
        con.register("__days", pa.table({"day": pa.array([d for d in days if d is not None], pa.date32())}))
        nulls = "OR started_at IS NULL" if None in days else ""
        sessions = con.sql(
            "SELECT session_id, CAST(started_at AS DATE) AS day FROM trajectories "
            f"WHERE CAST(started_at AS DATE) IN (SELECT day FROM __days) {nulls} ORDER BY session_id"
        ).pl()
        _drop_facts(con, settings, catalog, _index_positions(con, sessions))
        for chunk in _chunks(sessions, settings.score_chunk_sessions):
            _index_sessions(settings, catalog, con, chunk, config, _NO_POSITIONS)
        return sessions.height
    finally:
        con.close()


#: Iceberg predicates: the anomaly flags (level 2) and the detector flags (level 1) of the ``flags`` table.
_ANOMALY_FLAGS = EqualTo(term=Reference("flag_class"), value=literal("anomaly"))
_DETECTOR_FLAGS = Not(_ANOMALY_FLAGS)
#: ``session_index`` positions of no session (:func:`_index_positions`' schema).
_NO_POSITIONS = pl.DataFrame(
    schema={
        "session_id": pl.Utf8,
        "family": pl.Utf8,
        "started_at": pl.Datetime("us", "UTC"),
        "day": pl.Date,
        "task_type": pl.Utf8,
    }
)
_NO_OUTSIDE = pl.DataFrame(
    schema={
        "session_id": pl.Utf8,
        "quality": pl.Float64,
        "started_at": pl.Datetime("us", "UTC"),
        "_old": pl.Boolean,
        "exportable_base": pl.Boolean,
    }
)


def _lookup(
    con: duckdb.DuckDBPyConnection,
    columns: str,
    view: str,
    ids: pl.Series,
    days: list[date | None] | None,
    where: str = "TRUE",
    starts: pl.Series | None = None,
) -> pl.DataFrame:
    """``columns`` of the rows of ``view`` for the session ids ``ids``.

    ``days``: the rows can only be on these days, so only their files are read (a lookup by id
    alone reads every file's ids); None: anywhere. ``starts``: the rows' exact ``started_at``
    values, when known: only the files and row groups around them are read (:func:`_on_times`).
    A ``started_at`` column comes back as UTC.
    """
    con.register("__lookup", pa.table({"session_id": ids.cast(pl.Utf8).to_arrow()}))
    on_days = "TRUE" if days is None else _on_days(days)
    if starts is not None:
        on_days += f" AND {_on_times(starts)}"
    try:
        rows = con.sql(
            f"SELECT {columns} FROM {view} "
            f"WHERE {on_days} AND session_id IN (SELECT session_id FROM __lookup) AND {where}"
        ).pl()
    finally:
        con.unregister("__lookup")
    if "started_at" in rows.columns:
        rows = rows.with_columns(pl.col("started_at").cast(pl.Datetime("us", "UTC")))
    return rows


# ---------------------------------------------------------------------------------------- level 1


def _current_facts(con: duckdb.DuckDBPyConnection, digest: str, among: pl.DataFrame | None = None) -> pl.Series:
    """Sessions (of ``among``: session_id, day; None: all) whose index row matches their trajectory and configuration.

    Only ``among``'s days are read: an index row on another day has another ``started_at``, so it is
    not current anyway.
    """
    where = ""
    if among is not None:
        con.register("__among", among.select("session_id").to_arrow())
        days = among["day"].unique().to_list()
        where = (
            f"AND t.session_id IN (SELECT session_id FROM __among) AND {_on_days(days, 't.started_at')} "
            f"AND {_on_days(days, 'i.started_at')}"
        )
    rows = con.sql(
        "SELECT t.session_id FROM trajectories t JOIN session_index i USING (session_id) "
        f"WHERE i.config_digest = $digest AND i.assembled_at IS NOT DISTINCT FROM t.assembled_at {where}",
        params={"digest": digest},
    ).pl()
    if among is not None:
        con.unregister("__among")
    return rows["session_id"].cast(pl.Utf8)


def _changed(con: duckdb.DuckDBPyConnection, since_us: int | None) -> pl.DataFrame:
    """``session_id``, ``day``, ``started_at``, ``assembled_us`` of the trajectories assembled after ``since_us``.

    ``since_us`` None: every trajectory. Ordered by start.
    """
    where = "" if since_us is None else f"WHERE epoch_us(assembled_at) > {int(since_us)}"
    return (
        con.sql(
            "SELECT session_id, CAST(started_at AS DATE) AS day, started_at, epoch_us(assembled_at) AS assembled_us "
            f"FROM trajectories {where} ORDER BY started_at NULLS LAST, session_id"
        )
        .pl()
        .with_columns(pl.col("started_at").cast(pl.Datetime("us", "UTC")))
    )


def _max_watermark(changed: pl.DataFrame, previous: str | None) -> str | None:
    latest = changed["assembled_us"].max() if changed.height else None
    if latest is None:
        return previous
    return str(max(int(latest), int(previous or 0)))  # type: ignore[arg-type]


def _chunks(frame: pl.DataFrame, size: int) -> Iterator[pl.DataFrame]:
    for offset in range(0, frame.height, size):
        yield frame.slice(offset, size)


def _index_positions(con: duckdb.DuckDBPyConnection, sessions: pl.DataFrame, anywhere: bool = True) -> pl.DataFrame:
    """Where ``sessions`` (session_id, day) stood in the index before this run (family, started_at, day).

    ``anywhere``: also find the rows of sessions whose start moved to another day (a lookup over
    every day's session ids); else only ``sessions``' own days are read.
    """
    days = None if anywhere else sessions["day"].unique().to_list()
    columns = "session_id, family, started_at, day, coalesce(task_type, 'unknown') AS task_type"
    return _lookup(con, columns, "session_index", sessions["session_id"], days)


def _index_sessions(
    settings: Settings,
    catalog: Catalog,
    con: duckdb.DuckDBPyConnection,
    chunk: pl.DataFrame,
    config: QualityConfig,
    old: pl.DataFrame,
    run: ScoreStats | None = None,
) -> None:
    """Level 1 for ``chunk``'s sessions (session_id, day): their index rows and detector flags are replaced.

    ``old``: where the run found them before (:func:`_index_positions`; :data:`_NO_POSITIONS` when
    their old rows are already gone). ``run``: the run whose phase timings to add to.
    """
    if chunk.height == 0:
        return
    run = run or ScoreStats()
    sessions = chunk["session_id"].to_list()
    with run.phase("level1.read"):
        _scope(con, sessions, chunk["day"].unique().to_list(), (settings, catalog))
        inputs = _inputs(con)
        assembled = con.sql("SELECT session_id, assembled_at FROM scoped_traj").pl()
    with run.phase("level1.facts"):
        level1 = session_facts(**inputs, config=config)
    with run.phase("level1.write"):
        now = datetime.now(UTC)
        facts = level1.facts.join(assembled, on="session_id", how="left").with_columns(
            pl.lit(facts_digest(config)).alias("config_digest"), session_keys(level1.facts["session_id"])
        )
        index = ensure_table(catalog, settings, SESSION_INDEX.name)
        mine = old.filter(pl.col("session_id").is_in(chunk["session_id"].implode()))
        keys = _keys(mine)  # flags exist only where an index row does
        _replace(index, _arrow(facts, SESSION_INDEX, config.scorer_version, now), keys)
        # their band keys (the old rows found by the keys of the same session ids)
        band_rows = _band_rows(facts)
        old_bands = keys.with_columns(session_keys(keys["session_id"]))
        band_table = ensure_table(catalog, settings, BAND_KEYS.name)
        _replace(band_table, _arrow(band_rows, BAND_KEYS, config.scorer_version, now), old_bands, "session_key")
        # detector flags: replaced for these sessions (anomaly flags belong to level 2)
        flags = level1.cheat_flags.join(facts.select("session_id", "started_at"), on="session_id", how="left")
        flags_table = ensure_table(catalog, settings, FLAGS.name)
        flag_rows = _arrow(flags, FLAGS, config.scorer_version, now)
        _replace(flags_table, flag_rows, keys, extra=_DETECTOR_FLAGS)


#: Stale sessions of one day deleted by id at most; a day with more goes whole (its current facts recomputed too).
_BY_ID_PER_DAY = 10_000


def _drop_facts(
    con: duckdb.DuckDBPyConnection, settings: Settings, catalog: Catalog, positions: pl.DataFrame
) -> pl.DataFrame:
    """Delete the level-1 rows (index, band keys, detector flags) of the sessions at ``positions``.

    A day all of whose index rows go — or more than :data:`_BY_ID_PER_DAY` of them — is deleted
    by its partition (files dropped, nothing read); the few stale sessions of other days by id
    (a predicate naming millions of ids costs pyiceberg more to bind than the delete itself).

    Returns:
        session_id of the sessions whose facts were current but went with their day: index them again.
    """
    empty = pl.DataFrame(schema={"session_id": pl.Utf8})
    if positions.height == 0:
        return empty
    days = positions["day"].unique().to_list()
    counts = con.sql(f"SELECT day, count(*) AS n FROM session_index WHERE {_on_days(days)} GROUP BY day").pl()
    per_day = positions.group_by("day").len().join(counts, on="day", how="left", nulls_equal=True)
    whole = per_day.filter((pl.col("len") == pl.col("n")) | (pl.col("len") > _BY_ID_PER_DAY))["day"].to_list()
    partial = positions.filter(~pl.col("day").is_in(whole, nulls_equal=True))
    kept = empty
    if whole:
        con.register("__stale", positions.select("session_id").to_arrow())
        try:
            kept = con.sql(
                f"SELECT session_id FROM session_index WHERE {_on_days(whole)} "
                "AND session_id NOT IN (SELECT session_id FROM __stale)"
            ).pl()
        finally:
            con.unregister("__stale")
    for spec, by, extra in (
        (SESSION_INDEX, "session_id", None),
        (BAND_KEYS, "session_key", None),
        (FLAGS, "session_id", _DETECTOR_FLAGS),
    ):
        table = ensure_table(catalog, settings, spec.name)
        if whole:
            on_days = _whole_days("started_at", whole)
            _commit(table, None, on_days if extra is None else And(on_days, extra))
        if partial.height:
            keys = _keys(partial).with_columns(session_keys(partial["session_id"]))
            _replace(table, spec.arrow_schema().empty_table(), keys, by, extra)
    return kept


def _band_rows(facts: pl.DataFrame) -> pl.DataFrame:
    """``band_keys`` rows of ``facts`` (session_key, started_at, bands): one per session and band."""
    rows = facts.select(
        "session_key", "started_at", "bands", pl.int_ranges(1, pl.col("bands").list.len() + 1).alias("band")
    ).explode("bands", "band")
    rows = rows.filter(pl.col("bands").is_not_null())
    mixed = flat_band_keys(rows["bands"].to_numpy(), rows["band"].to_numpy())
    return rows.select(pl.Series("band_key", mixed, pl.Int64), "session_key", "started_at")


# ---------------------------------------------------------------------------------------- level 2


def _affected_sessions(
    con: duckdb.DuckDBPyConnection, changed: pl.DataFrame, old: pl.DataFrame, config: QualityConfig
) -> pl.DataFrame:
    """``session_id``, ``day``, ``started_at`` of every session whose level-2 answer a changed session moves.

    The changed sessions; those whose novelty window one of them entered or left; the whole
    (task type, day) group of a changed session when that group is its own baseline; and the whole
    next day's group of its task type when this group is (or was) that day's baseline. Only the
    days and families these can be on are read.
    """
    now = _index_positions(con, changed, anywhere=False)
    columns = ["session_id", "family", "started_at", "day", "task_type"]
    markers = pl.concat([now.select(columns), old.select(columns)]).with_columns(
        pl.col("family").fill_null(chr(0)).alias("f"), pl.col("started_at").cast(pl.Datetime("us", "UTC"))
    )
    # a family's rows before its first marker are in no marker's window: the ranking starts there
    firsts = markers.group_by("f").agg(pl.col("started_at").min().alias("first"))
    lowest = _moment(firsts["first"], "min")
    timed = "FALSE" if lowest is None else f"started_at >= {_instant(lowest)}"
    touched_days = sorted(
        {d for d in now["day"].to_list() + old["day"].to_list()}, key=lambda d: (d is None, d or date.min)
    )
    near = touched_days + [d - timedelta(days=1) for d in touched_days if d is not None and d > date.min]
    con.register("__now", now.select(columns).to_arrow())
    con.register("__old", old.select(columns).to_arrow())
    con.register("__firsts", firsts.to_arrow())
    try:
        counts = con.sql(
            "SELECT coalesce(task_type, 'unknown') AS task_type, day, count(*) AS n FROM session_index "
            f"WHERE {_on_days(near)} GROUP BY ALL"
        ).pl()
        con.register("__counts", counts.to_arrow())
        groups = con.sql(
            f"""
            WITH now_in AS (SELECT task_type, day, count(*) AS n_new FROM __now GROUP BY ALL),
            was_in AS (SELECT task_type, day, count(*) AS n_old FROM __old GROUP BY ALL),
            touched AS (
                SELECT task_type, day, coalesce(n_new, 0) AS n_new, coalesce(n_old, 0) AS n_old
                FROM now_in FULL JOIN was_in USING (task_type, day)
            )
            -- its own baseline: the previous day has fewer than MIN_GROUP sessions of the task type
            SELECT t.task_type, t.day FROM touched t
            LEFT JOIN __counts p ON p.task_type = t.task_type AND p.day = t.day - 1
            WHERE t.day IS NULL OR coalesce(p.n, 0) < {MIN_GROUP}
            UNION
            -- the next day's baseline, before or after this run
            SELECT t.task_type, t.day + 1 FROM touched t
            LEFT JOIN __counts c ON c.task_type = t.task_type AND c.day = t.day
            WHERE greatest(coalesce(c.n, 0), coalesce(c.n, 0) - t.n_new + t.n_old) >= {MIN_GROUP}
            """
        ).pl()
        con.register("__groups", groups.to_arrow())
        return con.sql(
            f"""
            WITH members AS (
                -- markers: the changed sessions where they stand now, and where they stood before this run
                SELECT session_id, i.family, i.started_at, i.day,
                       session_id IN (SELECT session_id FROM __now) AS marker
                FROM session_index i JOIN __firsts a ON coalesce(i.family, chr(0)) = a.f
                WHERE (({timed} AND i.started_at >= a.first) OR i.started_at IS NULL)
                UNION ALL
                SELECT session_id, family, started_at, NULL, TRUE FROM __old
            ),
            ranked AS (
                SELECT *, row_number() OVER (PARTITION BY family ORDER BY started_at NULLS LAST, session_id, marker)
                          AS rank,
                       count(*) FILTER (WHERE marker) OVER (PARTITION BY family) AS markers
                FROM members
            ),
            reach AS (
                SELECT *, max(CASE WHEN marker THEN rank END)
                          OVER (PARTITION BY family ORDER BY rank ROWS UNBOUNDED PRECEDING) AS last_marker
                FROM ranked
            ),
            novelty AS (
                SELECT session_id, day, started_at FROM reach
                WHERE NOT marker AND last_marker IS NOT NULL
                  AND rank - last_marker <= {config.novelty_max_history} + markers
            ),
            grouped AS (
                SELECT i.session_id, i.day, i.started_at FROM session_index i JOIN __groups g
                  ON coalesce(i.task_type, 'unknown') = g.task_type AND i.day IS NOT DISTINCT FROM g.day
                WHERE {_on_days(groups["day"].to_list())}
            )
            SELECT DISTINCT session_id, day, started_at FROM (
                SELECT session_id, day, started_at FROM __now
                UNION ALL SELECT * FROM novelty UNION ALL SELECT * FROM grouped
            )
            ORDER BY started_at NULLS LAST, session_id
            """
        ).pl()
    finally:
        for name in ("__now", "__old", "__firsts", "__counts", "__groups"):
            con.unregister(name)  # a name never registered is no error


def _touched_days(changed: pl.DataFrame, old: pl.DataFrame) -> list[date | None]:
    """The days whose profiles a run recomputes: where changed sessions are and were."""
    return sorted(set(changed["day"].to_list()) | set(old["day"].to_list()), key=lambda d: (d is None, d or date.min))


def _moment(values: pl.Series, how: str) -> datetime | None:
    """The least (``how="min"``) or greatest aware timestamp of ``values`` (None: none)."""
    value = values.min() if how == "min" else values.max()
    return value if isinstance(value, datetime) else None


def _instant(value: datetime) -> str:
    """SQL literal of an aware timestamp."""
    return f"TIMESTAMPTZ '{value.astimezone(UTC).isoformat(sep=' ')}'"


def _on_days(days: list[date | None], column: str = "started_at") -> str:
    """SQL: the UTC timestamp ``column`` falls on one of ``days`` (None: is NULL).

    As ranges of consecutive days, which DuckDB checks against each file's and row group's
    statistics: the day-partitioned tables are then read only on those days (a
    ``CAST(… AS DATE) IN …`` reads every file).
    """
    ordered = sorted({d for d in days if d is not None})
    terms: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and (ordered[end + 1] - ordered[end]).days == 1:
            end += 1
        term = f"{column} >= {_instant(datetime.combine(ordered[start], dt_time.min, UTC))}"
        if ordered[end] < date.max:
            term += f" AND {column} < {_instant(datetime.combine(ordered[end] + timedelta(days=1), dt_time.min, UTC))}"
        terms.append(f"({term})")
        start = end + 1
    if None in days:
        terms.append(f"{column} IS NULL")
    return "(" + " OR ".join(terms or ["FALSE"]) + ")"


def _on_dates(days: list[date | None], column: str = "day") -> str:
    """SQL: the DATE ``column`` is one of ``days`` (None: is NULL)."""
    listed = ", ".join(f"DATE '{d.isoformat()}'" for d in sorted({d for d in days if d is not None}))
    terms = [f"{column} IN ({listed})"] if listed else []
    if None in days:
        terms.append(f"{column} IS NULL")
    return "(" + " OR ".join(terms or ["FALSE"]) + ")"


#: Start times closer than this go into one range of :func:`_on_times`; at most this many ranges.
_TIME_GAP = timedelta(minutes=10)
_TIME_RANGES = 64


def _on_times(values: pl.Series, column: str = "started_at") -> str:
    """A SQL predicate true for rows whose ``column`` is one of ``values`` (and some around them).

    The values, sorted, go into ranges where they are closer than :data:`_TIME_GAP` (at most
    :data:`_TIME_RANGES`: the smallest gaps are closed first): files and row groups written at
    other times are skipped by their statistics (a day's files are written a run's chunk at a time,
    so rows of a few moments are in a few of them). Null values: ``column IS NULL`` too.
    """
    times = values.cast(pl.Datetime("us", "UTC"))
    present = times.drop_nulls().unique().sort()
    terms = [f"{column} IS NULL"] if times.null_count() else []
    if present.len():
        micros = present.dt.epoch("us").to_numpy()
        gaps = np.diff(micros)
        breaks = np.flatnonzero(gaps > _TIME_GAP / timedelta(microseconds=1))
        if len(breaks) >= _TIME_RANGES:  # keep the widest gaps only
            breaks = np.sort(breaks[np.argsort(gaps[breaks])[-(_TIME_RANGES - 1) :]])
        starts = np.r_[0, breaks + 1]
        ends = np.r_[breaks, len(micros) - 1]
        for lo, hi in zip(micros[starts].tolist(), micros[ends].tolist(), strict=True):
            terms.append(f"{column} BETWEEN make_timestamptz({lo}::BIGINT) AND make_timestamptz({hi}::BIGINT)")
    return "(" + " OR ".join(terms or ["FALSE"]) + ")"


def _baselines(
    settings: Settings, catalog: Catalog, con: duckdb.DuckDBPyConnection, facts: pl.DataFrame, config: QualityConfig
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`quality.combine.baseline_days` of ``facts``' groups and the stats of those baselines.

    The stats are the baseline days' ``profiles`` rows (:func:`quality.combine.baseline_of`): a day's
    rows are recomputed only when its index files changed since (:func:`_write_profiles`), so a new
    day's sessions read their complete baseline day's stats instead of every session of it.
    """
    days = [d for d in facts["day"].unique().to_list()]
    near = days + [d - timedelta(days=1) for d in days if d is not None and d > date.min]
    counts = con.sql(
        f"SELECT coalesce(task_type, 'unknown') AS task_type, day, count(*) AS n FROM session_index "
        f"WHERE {_on_days(near)} GROUP BY ALL"
    ).pl()
    wanted = facts.select(pl.col("task_type").fill_null("unknown"), "day").unique()
    baselines = baseline_days(counts).join(wanted, on=["task_type", "day"], how="inner", nulls_equal=True)
    baseline_days_ = baselines["baseline_day"].unique().to_list()
    _write_profiles(settings, catalog, con, baseline_days_, config)
    rows = con.sql(f"SELECT * FROM profiles WHERE {_on_dates(baseline_days_)}").pl()
    return baselines, baseline_of(rows.cast({"day": pl.Date}))


def _rescore(
    settings: Settings,
    catalog: Catalog,
    con: duckdb.DuckDBPyConnection,
    targets: pl.DataFrame,
    changed: set[str] | None,
    config: QualityConfig,
    old: pl.DataFrame,
    moved: pl.DataFrame,
    run: ScoreStats,
) -> int:
    """Level 2 for ``targets`` (session_id, day), and the clusters of the closed set around them.

    Returns:
        The sessions rescored.
    """
    with run.phase("level2.read"):
        columns = "* EXCLUDE (assembled_at, config_digest, scored_at)"
        facts = _lookup(con, columns, "session_index", targets["session_id"], targets["day"].unique().to_list())
    if facts.height == 0:
        return 0
    facts = facts.cast({k: v for k, v in FACTS_SCHEMA.items() if k in facts.columns})
    with run.phase("level2.context"):
        context = _novelty_context(con, facts, config)
        baselines, stats = _baselines(settings, catalog, con, facts, config)
    with run.phase("level2.combine"):
        level2 = combine(facts, context, config, baselines, stats)
    with run.phase("level2.clusters"):
        grown = None if changed is None else _grown_clusters(con, facts, level2.scores, changed, config, old, run)
        if grown is None:
            members, ranking, outside = _cluster_set(con, facts, level2.scores, changed, config, moved)
            duplicates = clusters(members, ranking, config)
            run.closed_sets += 1
        else:
            members, duplicates, outside = grown
    now = datetime.now(UTC)
    scores = finish_scores(level2.scores, duplicates, config)
    kept = outside.clear()
    if outside.height:
        # members of the touched clusters outside the targets: only their exportability can change. One
        # that loses it (shadowed by a better duplicate) needs no write: the ``scores`` view applies
        # ``duplicates`` (see ``SCORES.derived``), so a cluster spanning history rewrites no history
        # files; one that gains it (a representative again) is rewritten (``_old`` is the view's)
        kept = outside.with_columns(exportable(outside, duplicates).alias("_new")).filter(
            pl.col("_new") & ~pl.col("_old").fill_null(False)
        )
        rows = _score_rows(con, kept).join(kept.select("session_id", "_new"), on="session_id")
        kept = rows.with_columns(pl.col("_new").alias("exportable"))
        scores = pl.concat([scores, kept.select(scores.columns).cast(scores.schema)])
    started = members.select("session_id", "started_at")
    # each row carries its member's exact key and signature: a later run grows the cluster without the index
    own = members.select("session_id", "started_at", "exact_key", "signature")
    dup_rows, dup_ids = _changed_duplicates(con, duplicates.join(own, on="session_id", how="left"), started)
    anomalies = level2.anomaly_flags.join(facts.select("session_id", "started_at"), on="session_id", how="left")
    with run.phase("level2.write"), run.phase("level2.write.flags"):
        anomaly_rows = _arrow(anomalies, FLAGS, config.scorer_version, now)
        # the targets' rows are on their days, or where a moved session was before this run
        near = facts["day"].unique().to_list() + old["day"].unique().to_list()
        flags_table = ensure_table(catalog, settings, FLAGS.name)
        _replace(
            flags_table,
            anomaly_rows,
            _existing(con, "flags", facts["session_id"], near, "flag_class = 'anomaly'"),
            extra=_ANOMALY_FLAGS,
        )
    with run.phase("level2.write"), run.phase("level2.write.duplicates"):
        dup_table = ensure_table(catalog, settings, DUPLICATES.name)
        dup_keys = _existing(con, "duplicates", dup_ids)
        _replace(dup_table, _arrow(dup_rows, DUPLICATES, config.scorer_version, now), dup_keys)
    with run.phase("level2.write"), run.phase("level2.write.scores"):
        score_keys = _keys(_existing(con, "scores", facts["session_id"], near), kept)  # kept: rows read just now
        _replace(
            ensure_table(catalog, settings, SCORES.name), _arrow(scores, SCORES, config.scorer_version, now), score_keys
        )
    with run.phase("level2.write"):
        for spec in (FLAGS, DUPLICATES, SCORES):
            _refresh(con, settings, catalog, spec)
    return facts.height


def _score_rows(con: duckdb.DuckDBPyConnection, sessions: pl.DataFrame) -> pl.DataFrame:
    """The current ``scores`` rows of ``sessions`` (session_id, started_at), read from their days only."""
    days = sessions.select(pl.col("started_at").cast(pl.Datetime("us", "UTC")).dt.date())["started_at"]
    return _lookup(con, "* EXCLUDE (scored_at)", "scores", sessions["session_id"], days.unique().to_list())


def _changed_duplicates(
    con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, members: pl.DataFrame
) -> tuple[pl.DataFrame, pl.Series]:
    """The new rows to write and the members whose row is new, changed or gone (whose old rows go).

    Only those are rewritten: a new duplicate of an old cluster leaves its other members' rows as they were.
    A row whose session's start moved is rewritten too (lookups find a member's rows by its start).
    """
    columns = ["session_id", "cluster_id", "is_representative", "similarity", "method", "started_at"]
    con.register("__members", members.select("session_id").to_arrow())
    try:
        old = con.sql(
            "SELECT session_id, cluster_id, is_representative, similarity, method, "
            "started_at::TIMESTAMPTZ AS started_at "
            "FROM duplicates WHERE session_id IN (SELECT session_id FROM __members)"
        ).pl()
    finally:
        con.unregister("__members")
    new = rows.select(columns)
    old = old.cast(dict(new.schema))
    changed = pl.concat([new.join(old, on=columns, how="anti"), old.join(new, on=columns, how="anti")])
    ids = changed["session_id"].unique()
    return rows.filter(pl.col("session_id").is_in(ids.implode())), ids


def _write_profiles(
    settings: Settings, catalog: Catalog, con: duckdb.DuckDBPyConnection, days: list[date | None], config: QualityConfig
) -> None:
    """Recompute the profiles of those of ``days`` (every task type of each) whose index files changed.

    A row records the ``session_index`` files of its day it was computed from (``index_files``): while
    they are still the day's files — no session of the day was indexed, re-indexed or moved since, and
    the scorer is the same — the row holds and the day is not read again.
    """
    table = ensure_table(catalog, settings, PROFILES.name)
    prints = _index_files(ensure_table(catalog, settings, SESSION_INDEX.name))
    wanted = sorted(set(days), key=lambda d: (d is None, d or date.min))
    held: dict[date | None, set[tuple[str | None, str | None]]] = {}
    for day, index_files, version in con.sql(
        f"SELECT DISTINCT day, index_files, scorer_version FROM profiles WHERE {_on_dates(wanted)}"
    ).fetchall():
        held.setdefault(day, set()).add((index_files, version))
    # a day without index files has no profile: stale only if it still has rows
    stale = [
        d
        for d in wanted
        if (d in prints or d in held) and (d not in prints or held.get(d) != {(prints[d], config.scorer_version)})
    ]
    for day in stale:  # a day at a time (3M sessions at the design scale: a week would not fit)
        chunk = [day]
        members = con.sql(
            f"SELECT task_type, day, {', '.join(FEATURES)}, tool_counts, exit_code_counts "
            f"FROM session_index WHERE {_on_days(chunk)}"
        ).pl()
        rows = profiles(members).with_columns(
            pl.lit(config.scorer_version).alias("scorer_version"), pl.lit(prints.get(day)).alias("index_files")
        )
        _replace_days(table, _arrow(rows, PROFILES, config.scorer_version, datetime.now(UTC)), chunk)
    if stale:
        _refresh(con, settings, catalog, PROFILES)


def _index_files(table: Table) -> dict[date | None, str]:
    """Per ``started_at`` day of ``session_index``: a digest of the day's live data files (None: no start).

    Files are immutable: the digest changes exactly when a commit adds or removes one of the day's
    files (new or re-indexed sessions, a moved session, a compaction).
    """
    days = day_partitions(table, "started_at")
    if len(days) != len(live_files(table)):
        return {}  # files not laid out by day: no digest holds (every day is recomputed)
    paths: dict[date | None, list[str]] = {}
    for path, day in days.items():
        paths.setdefault(day, []).append(path)
    return {day: hashlib.sha256("\n".join(sorted(p)).encode()).hexdigest()[:32] for day, p in paths.items()}


#: How far back a run looks for a family's earlier sessions first, then further (None: all history).
_LOOKBACK: tuple[timedelta | None, ...] = (
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=7),
    timedelta(days=49),
    None,
)


def _novelty_context(con: duckdb.DuckDBPyConnection, facts: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """Index rows among the ``novelty_max_history`` before each session of ``facts`` in its family.

    Per family: every row from its first target to its last (and the NULL-started rows when a
    target has no start), and the ``novelty_max_history`` latest rows before the first, found by
    looking back an hour from the latest earlier row, then a day, a week, … until enough are found
    or the whole history was read. Each look reads only the files of its time range, and only
    session ids: signatures are read last, of the rows kept.
    """
    depth = config.novelty_max_history
    targets = facts.select(
        pl.col("family").fill_null(chr(0)).alias("f"), pl.col("started_at").cast(pl.Datetime("us", "UTC"))
    )
    firsts = targets.group_by("f").agg(
        pl.col("started_at").min().alias("first"),
        pl.col("started_at").max().alias("last"),
        pl.col("started_at").is_null().any().alias("nulls"),
    )
    found: list[pl.DataFrame] = []
    con.register("__firsts", firsts.to_arrow())
    try:
        # rows from each family's first target to its last (NULL-started rows come last, after every other)
        lowest, highest = _moment(firsts["first"], "min"), _moment(firsts["last"], "max")
        timed = "FALSE"
        if lowest is not None and highest is not None:
            timed = f"started_at BETWEEN {_instant(lowest)} AND {_instant(highest)}"
        found.append(
            con.sql(
                f"""
                SELECT session_id, day, i.started_at::TIMESTAMPTZ AS started_at
                FROM session_index i JOIN __firsts a ON coalesce(i.family, chr(0)) = a.f
                WHERE i.started_at BETWEEN a.first AND a.last AND {timed}
                UNION ALL
                SELECT session_id, day, i.started_at::TIMESTAMPTZ AS started_at
                FROM session_index i JOIN __firsts a ON coalesce(i.family, chr(0)) = a.f
                WHERE a.nulls AND i.started_at IS NULL
                """
            ).pl()
        )
        # the ``depth`` rows before it, looking further back until each family has them or history ends; the
        # looks start from the latest earlier row (a gap in the history before the targets costs nothing)
        pending = firsts.select("f", pl.col("first").fill_null(datetime.max.replace(tzinfo=UTC)).alias("anchor"))
        ceiling = _moment(pending["anchor"], "max") or datetime.max.replace(tzinfo=UTC)
        earlier = f"SELECT max(started_at) FROM session_index WHERE started_at < {_instant(ceiling)}"
        latest = con.sql(earlier).fetchall()[0]
        if latest[0] is None:
            pending = pending.clear()  # nothing started before any target
        else:
            reference = latest[0] + timedelta(microseconds=1)
            pending = pending.with_columns(pl.min_horizontal("anchor", pl.lit(reference)).alias("reference"))
        for lookback in _LOOKBACK:
            if pending.height == 0:
                break
            con.register("__anchors", pending.to_arrow())
            prune = f"started_at < {_instant(ceiling)}"
            since = "TRUE"
            if lookback is not None:
                since = f"i.started_at >= a.reference - INTERVAL {int(lookback.total_seconds())} SECOND"
                low = _moment(pending["reference"], "min")
                if low is not None and low - datetime.min.replace(tzinfo=UTC) > lookback:
                    prune += f" AND started_at >= {_instant(low - lookback)}"
            before = con.sql(
                f"""
                SELECT session_id, day, i.started_at::TIMESTAMPTZ AS started_at, a.f
                FROM session_index i JOIN __anchors a ON coalesce(i.family, chr(0)) = a.f
                WHERE {prune} AND i.started_at < a.anchor AND {since}
                QUALIFY row_number() OVER (PARTITION BY a.f ORDER BY i.started_at DESC, session_id DESC) <= {depth}
                """
            ).pl()
            con.unregister("__anchors")
            found.append(before.select("session_id", "day", "started_at"))
            complete = before.group_by("f").len().filter(pl.col("len") >= depth)["f"]
            pending = pending.filter(~pl.col("f").is_in(complete.implode()))
    finally:
        con.unregister("__firsts")
    rows = pl.concat([f.with_columns(pl.col("started_at").cast(pl.Datetime("us", "UTC"))) for f in found])
    rows = rows.unique("session_id")
    columns = "session_id, family, started_at::TIMESTAMPTZ AS started_at, signature"
    days = rows["day"].unique().to_list()
    return _lookup(con, columns, "session_index", rows["session_id"], days, starts=rows["started_at"])


def _exportable_base(config: QualityConfig) -> str:
    """SQL over ``scores`` columns: exportable on the session's own merits (before duplicate clusters)."""
    return (
        f"quality >= {float(config.min_quality)!r} AND NOT coalesce(security_flagged, FALSE) "
        "AND coalesce(failure_cause, '') <> 'still_running'"
    )


def _cluster_set(
    con: duckdb.DuckDBPyConnection,
    facts: pl.DataFrame,
    scores: pl.DataFrame,
    changed: set[str] | None,
    config: QualityConfig,
    moved: pl.DataFrame,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The closed set whose clusters a run recomputes, its ranking, and its members' rows outside ``facts``.

    The set: the sessions of ``facts``, the index sessions sharing an LSH band key with a changed one
    (the ``band_keys`` table joined with the changed sessions' keys),
    and every member of an old cluster any of those is in. No duplicate link leaves it: an unchanged
    session's links are those it had, and every one of them is inside its old cluster.

    ``moved``: session_id, day (now) of the sessions whose start moved to another day in this run.

    Returns:
        (members: session_id, exact_key, signature, started_at; ranking: session_id, quality,
        started_at; outside: current ``scores`` rows of members not in ``facts``, with ``exportable_base``)
    """
    here = facts["session_id"]
    fresh = facts if changed is None else facts.filter(pl.col("session_id").is_in(list(changed)))
    # the fresh sessions' band keys, from their facts
    probe = _band_rows(fresh).select("band_key").unique()
    con.register("__here", pa.table({"session_id": here.to_arrow()}))
    con.register("__keys", probe.to_arrow())
    try:
        closed = con.sql(
            """
            WITH hits AS (
                SELECT DISTINCT session_key FROM band_keys JOIN __keys USING (band_key)
            ),
            candidates AS (
                -- every session with a key that was hit (two ids may share a key: both are candidates)
                SELECT session_id, day FROM session_index WHERE session_key IN (SELECT session_key FROM hits)
            ),
            seed AS (
                SELECT session_id FROM __here UNION SELECT session_id FROM candidates
            ),
            touched AS (
                SELECT DISTINCT cluster_id FROM duplicates WHERE session_id IN (SELECT session_id FROM seed)
            )
            SELECT session_id, day FROM candidates
            UNION SELECT session_id, CAST(started_at AS DATE) FROM duplicates
            WHERE cluster_id IN (SELECT cluster_id FROM touched)
            """
        ).pl()
        # a changed session's row is on its new day (its ``duplicates`` row may still be on the old one)
        now = moved.join(closed.select("session_id"), on="session_id", how="semi")
        closed = pl.concat([closed, facts.select("session_id", "day"), now.select("session_id", "day")])
    finally:
        con.unregister("__here")
        con.unregister("__keys")
    columns = "session_id, exact_key, signature, started_at::TIMESTAMPTZ AS started_at"
    members = _lookup(con, columns, "session_index", closed["session_id"], closed["day"].unique().to_list())
    # a member's scores row is on its day; only what ranking and exportability read
    others = members.filter(~pl.col("session_id").is_in(here.implode()))
    base = _exportable_base(config)
    outside = _lookup(
        con,
        f"session_id, quality, started_at, exportable AS _old, {base} AS exportable_base",
        "scores",
        others["session_id"],
        others["started_at"].dt.date().unique().to_list(),
    )
    ranking = pl.concat(
        [
            scores.select("session_id", "quality", "started_at"),
            outside.select("session_id", "quality", "started_at").cast(
                {"quality": pl.Float64, "started_at": pl.Datetime("us", "UTC")}
            ),
        ]
    )
    return members, ranking, outside


def _ranked_first(frame: pl.DataFrame, by: str) -> pl.DataFrame:
    """The best-ranked row per ``by``: highest quality, then earliest start, then smallest id (nulls last)."""
    return frame.sort(
        [by, "quality", "started_at", "session_id"], descending=[False, True, False, False], nulls_last=True
    ).unique(by, keep="first", maintain_order=True)


def _grown_clusters(
    con: duckdb.DuckDBPyConnection,
    facts: pl.DataFrame,
    scores: pl.DataFrame,
    changed: set[str],
    config: QualityConfig,
    old: pl.DataFrame,
    run: ScoreStats,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """The clusters around ``facts`` updated from the fresh sessions' links alone; None where that is not exact.

    Documents are linked to the earliest session of each LSH bucket they are in (:func:`quality.combine.clusters`),
    so a session that is new to the index and later than the first of each of its buckets adds links and changes
    none: clusters only grow and merge, and the members of an old cluster keep their rows unless its
    representative changes. That holds unless a fresh session was indexed before (re-assembled: its old links
    may be gone, so a cluster can split) or heads a bucket that holds older sessions (every one of them links to
    it now): then None, and the caller recomputes the closed set (:func:`_cluster_set`).

    What is read: the band keys that a fresh session's keys hit and their sessions' ids and starts; the rows of
    the old clusters the fresh sessions, their links and ``facts`` are in (``duplicates`` holds cluster members
    only); the ``scores`` rows of sessions that can take or lose a representative's place; signatures only of the
    links' heads and of the members whose row changes. Not every member's signature across history.

    Returns:
        As :func:`_cluster_set` followed by :func:`quality.combine.clusters`: (members: session_id,
        started_at, exact_key, signature (where known) of every member of a touched cluster;
        duplicates: their rows; outside: current ``scores`` rows, with ``_old`` and
        ``exportable_base``, of members outside ``facts`` whose role can change).
    """
    fresh = facts.filter(pl.col("session_id").is_in(list(changed)))
    if old.height and fresh["session_id"].is_in(old["session_id"].implode()).any():
        return None
    utc = pl.Datetime("us", "UTC")
    lap = run.laps("level2.clusters.")
    fresh_bands = _band_rows(fresh).join(fresh.select("session_key", "session_id"), on="session_key")
    con.register("__keys", fresh_bands.select("band_key").unique().to_arrow())
    try:
        # Buckets of one (most keys of most sessions: only their own row) link nothing; of the others only
        # the head -- the earliest session -- is wanted (two integer columns of every band_keys row are what
        # a run reads in proportion to history). With two earliest at one moment, or no start at all, the
        # head is the smallest id of them: those buckets are read whole.
        buckets = con.sql(
            "SELECT band_key, count(*) AS n, arg_min(session_key, started_at) AS head_key, "
            "min_by(started_at, started_at, 2) AS earliest "
            "FROM band_keys WHERE band_key IN (SELECT band_key FROM __keys) GROUP BY band_key HAVING count(*) > 1"
        ).pl()
        unsure = buckets.filter(
            pl.col("head_key").is_null()
            | (pl.col("earliest").list.get(0) == pl.col("earliest").list.get(1, null_on_oob=True))
        )
        if unsure.height:
            con.register("__unsure", unsure.select("band_key").to_arrow())
            members = con.sql(
                "SELECT b.band_key, b.session_key, i.session_id, b.started_at FROM band_keys b "
                "JOIN session_index i USING (session_key) WHERE b.band_key IN (SELECT band_key FROM __unsure)"
            ).pl()
            con.unregister("__unsure")
            firsts = (
                members.sort("started_at", "session_id", nulls_last=True)
                .group_by("band_key", maintain_order=True)
                .agg(pl.col("session_key").first().alias("first_key"))
            )
            buckets = (
                buckets.join(firsts, on="band_key", how="left")
                .with_columns(pl.coalesce("first_key", "head_key").alias("head_key"))
                .drop("first_key")
            )
        # the heads, and the older exact twins of the fresh sessions (twins share every band: found by their
        # key, whichever session heads their buckets)
        con.register("__heads", buckets.select(pl.col("head_key").alias("session_key")).unique().to_arrow())
        con.register("__exact", fresh.select("exact_key").unique().to_arrow())
        con.register("__fresh", fresh.select("session_key").to_arrow())
        columns = "session_id, session_key, exact_key, started_at::TIMESTAMPTZ AS started_at, day"
        candidates = pl.concat(
            [
                con.sql(
                    f"SELECT {columns} FROM session_index WHERE session_key IN (SELECT session_key FROM __heads)"
                ).pl(),
                con.sql(
                    f"SELECT {columns} FROM session_index WHERE exact_key IN (SELECT exact_key FROM __exact) "
                    "AND session_key NOT IN (SELECT session_key FROM __fresh)"
                ).pl(),
                fresh.select(
                    "session_id",
                    "session_key",
                    "exact_key",
                    pl.col("started_at").cast(utc),
                    pl.col("day").cast(pl.Date),
                ),
            ],
            how="vertical_relaxed",
        )
    finally:
        for name in ("__keys", "__heads", "__exact", "__fresh"):
            con.unregister(name)
    candidates = candidates.with_columns(pl.col("started_at").cast(utc)).unique("session_id")
    fresh_keys = fresh["session_key"].implode()
    per_key = fresh_bands.group_by("band_key").len("mine")
    heads = (
        buckets.join(per_key, on="band_key")
        .join(
            candidates.select(pl.col("session_key").alias("head_key"), pl.col("session_id").alias("head")),
            on="head_key",
        )
        .with_columns(pl.col("head_key").is_in(fresh_keys).alias("head_fresh"))
    )
    if heads.filter(pl.col("head_fresh") & (pl.col("n") > pl.col("mine"))).height:
        return None  # a fresh session now heads a bucket of older ones: each of them links to it
    here = facts["session_id"].implode()
    links = (
        fresh_bands.join(heads.select("band_key", "head"), on="band_key")
        .filter(pl.col("session_id") != pl.col("head"))
        .select(pl.col("session_id").alias("a"), pl.col("head").alias("b"))
        .unique()
    )
    twins = (
        fresh.select(pl.col("session_id").alias("a"), "exact_key")
        .join(candidates.select(pl.col("session_id").alias("b"), "exact_key"), on="exact_key")
        .filter(pl.col("a") != pl.col("b"))
        .select("a", "b")
    )
    lap("probe")
    # the old clusters the heads, twins and targets are in, whole (``duplicates`` holds only members of
    # clusters, with their signatures: a member's is not read from the index, wherever in history it is)
    involved = pl.concat([links["b"], twins["b"], facts["session_id"]]).unique()
    con.register("__involved", pa.table({"session_id": involved.to_arrow()}))
    try:
        rows = con.sql(
            """
            SELECT session_id, cluster_id, is_representative, similarity, method,
                   started_at::TIMESTAMPTZ AS started_at, exact_key, signature
            FROM duplicates WHERE cluster_id IN (
                SELECT DISTINCT cluster_id FROM duplicates WHERE session_id IN (SELECT session_id FROM __involved)
            )
            """
        ).pl()
    finally:
        con.unregister("__involved")
    rows = rows.with_columns(pl.col("started_at").cast(utc))
    lap("old_clusters")
    # signatures: the fresh sessions' from their facts, members' from their rows, the rest from the index
    known = pl.concat(
        [
            facts.select("session_id", "exact_key", "signature"),
            rows.filter(pl.col("signature").is_not_null()).select("session_id", "exact_key", "signature"),
        ]
    ).unique("session_id", keep="first")
    positions = candidates.select("session_id", "started_at")

    def signatures(ids: pl.Series, where: pl.DataFrame) -> pl.DataFrame:
        nonlocal known
        wanted = ids.unique()
        missing = wanted.filter(~wanted.is_in(known["session_id"].implode()))
        if missing.len():
            times = where.filter(pl.col("session_id").is_in(missing.implode()))["started_at"]
            days = times.dt.date().unique().to_list()
            found = _lookup(con, "session_id, exact_key, signature", "session_index", missing, days, starts=times)
            known = pl.concat([known, found.select(known.columns).cast(known.schema)])
        return known

    sigs = signatures(links["b"], positions)
    left = links.join(sigs, left_on="a", right_on="session_id", how="left", maintain_order="left")
    right = links.join(sigs, left_on="b", right_on="session_id", how="left", maintain_order="left")
    similar = (
        (signatures_of(left["signature"], config.num_perm) == signatures_of(right["signature"], config.num_perm)).mean(
            axis=1
        )
        if links.height
        else np.empty(0)
    )
    edges = pl.concat([links.filter(pl.Series(similar >= config.dedup_threshold, dtype=pl.Boolean)), twins])
    # only the clusters a confirmed link or a target is in are touched
    touched = rows.filter(
        pl.col("session_id").is_in(pl.concat([edges["a"], edges["b"], facts["session_id"]]).implode())
    )["cluster_id"].unique()
    rows = rows.filter(pl.col("cluster_id").is_in(touched.implode())).drop("exact_key", "signature")
    if rows.height == 0 and edges.height == 0:
        empty = pl.DataFrame(
            schema={"session_id": pl.Utf8, "started_at": utc, "exact_key": pl.Int64, "signature": pl.Binary}
        )
        return empty, pl.DataFrame(schema=DUPLICATES_SCHEMA), _NO_OUTSIDE
    lap("links")
    # components over labels: a member of an old cluster is its cluster, any other session itself
    label = rows.select("session_id", pl.col("cluster_id").alias("label"))
    ends = pl.concat([edges["a"], edges["b"]]).unique()
    loose = ends.filter(~ends.is_in(label["session_id"].implode()))
    label = pl.concat([label, pl.DataFrame({"session_id": loose, "label": loose})])
    names = label["label"].unique().sort()
    index = {name: i for i, name in enumerate(names.to_list())}
    to_label = dict(zip(label["session_id"].to_list(), label["label"].to_list(), strict=True))
    a = np.array([index[to_label[v]] for v in edges["a"].to_list()], dtype=np.int64)
    b = np.array([index[to_label[v]] for v in edges["b"].to_list()], dtype=np.int64)
    component = components(len(names), a, b)
    groups = pl.DataFrame({"label": names, "component": component})
    members = label.join(groups, on="label").join(rows.drop("cluster_id"), on="session_id", how="left")
    starts = pl.concat([positions, facts.select("session_id", pl.col("started_at").cast(utc))]).unique("session_id")
    members = (
        members.join(starts, on="session_id", how="left", suffix="_c")
        .with_columns(pl.coalesce("started_at", "started_at_c").alias("started_at"))
        .drop("started_at_c")
    )
    lap("components")
    # who can represent a component: its old representatives, sessions new to a cluster, and rescored ones
    # (``scores``: this run's quality); an old representative rescored worse lets any member take over
    base = _exportable_base(config)
    table_columns = f"session_id, quality, started_at, exportable AS _old, {base} AS exportable_base"
    contenders = members.filter(pl.col("is_representative").fill_null(True) | pl.col("session_id").is_in(here))

    def stored(ids: pl.Series, where: pl.DataFrame) -> pl.DataFrame:
        times = where.filter(pl.col("session_id").is_in(ids.implode()))["started_at"]
        found = _lookup(con, table_columns, "scores", ids, times.dt.date().unique().to_list(), starts=times)
        return found.cast({"quality": pl.Float64, "started_at": utc})

    table = stored(contenders["session_id"], members)
    now = scores.select("session_id", pl.col("quality").cast(pl.Float64), pl.col("started_at").cast(utc))
    worse = (
        contenders.filter(pl.col("is_representative").fill_null(False))
        .join(table.select("session_id", pl.col("quality").alias("was")), on="session_id")
        .join(now.select("session_id", "quality"), on="session_id")
        .filter(pl.col("quality").is_null() & pl.col("was").is_not_null() | (pl.col("quality") < pl.col("was")))
    )
    if worse.height:
        rest = members.filter(
            pl.col("component").is_in(worse["component"].implode())
            & ~pl.col("session_id").is_in(contenders["session_id"].implode())
            & ~pl.col("session_id").is_in(here)
        )
        table = pl.concat([table, stored(rest["session_id"], members)])
        contenders = pl.concat([contenders, rest])
    outside = table.filter(~pl.col("session_id").is_in(here))
    ranking = pl.concat([now, outside.select("session_id", "quality", "started_at")])
    candidates_ranked = contenders.select("session_id", "component").join(ranking, on="session_id", how="left")
    reps = _ranked_first(candidates_ranked, "component").select("component", pl.col("session_id").alias("rep"))
    members = members.join(reps, on="component")
    lap("representatives")
    # rows that stay: same representative as before (same similarity and method, no signature changed)
    keep = pl.col("is_representative").is_not_null() & (pl.col("rep") == pl.col("label"))
    stay = members.filter(keep)
    redo = members.filter(~keep)
    sigs = signatures(pl.concat([redo["session_id"], redo["rep"]]), members)
    redo_left = redo.join(sigs, on="session_id", how="left", maintain_order="left")
    redo_right = redo.select("rep").join(sigs, left_on="rep", right_on="session_id", how="left", maintain_order="left")
    similarity = (
        (
            signatures_of(redo_left["signature"], config.num_perm)
            == signatures_of(redo_right["signature"], config.num_perm)
        ).mean(axis=1)
        if redo.height
        else np.empty(0)
    )
    redone = redo_left.select(
        "session_id",
        pl.col("rep").alias("cluster_id"),
        (pl.col("session_id") == pl.col("rep")).alias("is_representative"),
        pl.Series("similarity", similarity, dtype=pl.Float64).round(4),
        pl.when(redo_left["exact_key"] == redo_right["exact_key"])
        .then(pl.lit("exact"))
        .otherwise(pl.lit("minhash"))
        .alias("method"),
    )
    kept = stay.select(
        "session_id",
        pl.col("rep").alias("cluster_id"),
        (pl.col("session_id") == pl.col("rep")).alias("is_representative"),
        "similarity",
        "method",
    )
    duplicates = pl.concat([kept, redone]).cast(DUPLICATES_SCHEMA).sort("cluster_id", "session_id")
    # members outside ``facts`` whose exportability can change: those that were or now are a representative
    roles = outside.filter(pl.col("session_id").is_in(contenders["session_id"].implode()))
    lap("rows")
    members = members.select("session_id", "started_at").join(known, on="session_id", how="left")
    return members, duplicates, roles


# ---------------------------------------------------------------------------------------- writes


def _existing(
    con: duckdb.DuckDBPyConnection,
    view: str,
    ids: pl.Series,
    days: list[date | None] | None = None,
    where: str = "TRUE",
) -> pl.DataFrame:
    """``session_id``, ``started_at`` of the rows of ``view`` for ``ids``: what a replace deletes (often nothing).

    ``days``: the rows can only be on these days (only their files are read); None: anywhere.
    """
    return _keys(_lookup(con, "DISTINCT session_id, started_at::TIMESTAMPTZ AS started_at", view, ids, days, where))


def _keys(*frames: pl.DataFrame) -> pl.DataFrame:
    """``session_id``, ``started_at`` rows to delete: where the sessions are now and where they were."""
    parts = [f.select("session_id", pl.col("started_at").cast(pl.Datetime("us", "UTC"))) for f in frames if f.height]
    if not parts:
        return pl.DataFrame(schema={"session_id": pl.Utf8, "started_at": pl.Datetime("us", "UTC")})
    return pl.concat(parts).unique()


def _whole_days(column: str, days: list[date | None]) -> BooleanExpression:
    """Iceberg predicate: ``column`` on one of ``days`` (None: NULL), exactly."""
    terms: list[BooleanExpression] = []
    for d in sorted(d for d in days if d is not None):
        start = GreaterThanOrEqual(
            term=Reference(column), value=literal(datetime.combine(d, dt_time.min, UTC).isoformat())
        )
        if d == date.max:
            terms.append(start)
            continue
        end = datetime.combine(d + timedelta(days=1), dt_time.min, UTC).isoformat()
        terms.append(And(start, LessThan(term=Reference(column), value=literal(end))))
    if None in days:
        terms.append(IsNull(term=Reference(column)))
    return terms[0] if len(terms) == 1 else Or(*terms)


def _day_terms(column: str, values: list[datetime | None]) -> BooleanExpression:
    """Iceberg predicate: ``column`` on one of the days of ``values`` (partition pruning for day-partitioned tables).

    Rows without a start (and rows of an older scorer, from before the column existed) sit in the
    null partition: it is always included.
    """
    return _whole_days(column, [*{v.date() for v in values if v is not None}, None])


def _replace(
    table: Table,
    rows: pa.Table,
    keys: pl.DataFrame,
    by: str = "session_id",
    extra: BooleanExpression | None = None,
) -> None:
    """Delete the rows of the sessions in ``keys`` (``by``, started_at; and ``extra``), append ``rows``: one commit."""
    if keys.height == 0:
        _commit(table, rows, None)
        return
    ids = keys[by].unique().to_list()
    predicate: BooleanExpression = And(
        In(term=Reference(by), literals={literal(v) for v in ids}),
        _day_terms("started_at", keys["started_at"].to_list()),
    )
    if extra is not None:
        predicate = And(predicate, extra)
    _commit(table, rows, predicate, (by, ids))


def _replace_days(table: Table, rows: pa.Table, days: list[date | None]) -> None:
    """Replace every row of ``table`` (keyed by ``day``) on ``days``."""
    listed = [d.isoformat() for d in days if d is not None]
    terms: list[BooleanExpression] = (
        [In(term=Reference("day"), literals={literal(v) for v in listed})] if listed else []
    )
    if None in days:
        terms.append(IsNull(term=Reference("day")))
    predicate = None if not terms else (terms[0] if len(terms) == 1 else Or(*terms))
    _commit(table, rows, predicate)


def _clear(table: Table) -> None:
    _commit(table, None, AlwaysTrue())


def _commit(
    table: Table,
    rows: pa.Table | None,
    predicate: BooleanExpression | None,
    keyed: tuple[str, list[object]] | None = None,
) -> None:
    """Delete the rows matching ``predicate`` (None: none) and append ``rows``, retried on conflicts.

    ``keyed``: (column, values) that ``predicate`` restricts the rows to: only the files holding one
    of the values are rewritten (:meth:`warehouse.transactions.Transaction.replace_rows`).
    """
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        if attempts:
            table.refresh()  # compaction (``trajlake maintain``) may have rewritten the files meanwhile
        attempts += 1
        has_rows = rows is not None and rows.num_rows > 0
        if not has_rows and (predicate is None or table.current_snapshot() is None):
            return
        with transaction(table) as tx, warnings.catch_warnings():
            # pyiceberg warns when a delete matches nothing (a new session, a day without duplicates)
            warnings.filterwarnings("ignore", "Delete operation did not match any records")
            if keyed is not None and predicate is not None:
                tx.replace_rows(predicate, keyed[0], keyed[1], rows)
                return
            if predicate is not None and table.current_snapshot() is not None:
                tx.delete(predicate)
            if has_rows:
                tx.append(rows)

    retry_on_conflict(f"update {table.name()[-1]}", attempt)


def _refresh(con: duckdb.DuckDBPyConnection, settings: Settings, catalog: Catalog, spec: TableSpec) -> None:
    """Point ``spec``'s view on ``con`` at the table's current snapshot (after this run wrote it)."""
    register_table(con, spec.view, ensure_table(catalog, settings, spec.name), spec)


def _commit_scores(
    settings: Settings,
    catalog: Catalog,
    config: QualityConfig,
    stats: ScoreStats,
    props: dict[str, str],
    watermark: str | None,
) -> None:
    """Record what the run covered: trajectories snapshot, scorer, configuration, watermark."""
    covered = {
        SCORED_SNAPSHOT: str(stats.trajectories_snapshot_id),
        SCORED_VERSION: config.scorer_version,
        SCORED_DIGEST: config.digest(),
        SCORED_CONFIG: json.dumps(config.manifest(), sort_keys=True),
    }
    if watermark is not None:
        covered[SCORED_WATERMARK] = watermark
    if all(props.get(k) == v for k, v in covered.items()):
        return
    table = ensure_table(catalog, settings, SCORES.name)

    def attempt() -> None:
        table.refresh()
        with transaction(table) as tx:
            tx.set_properties(covered)

    retry_on_conflict("record the scored snapshot", attempt)


def _summarize(con: duckdb.DuckDBPyConnection, settings: Settings, catalog: Catalog, stats: ScoreStats) -> None:
    """Fill the counters of ``stats`` from the quality tables as they now stand."""
    for spec in (SCORES, FLAGS, DUPLICATES):
        _refresh(con, settings, catalog, spec)
    row = con.execute("SELECT count(*), count(*) FILTER (WHERE exportable), avg(quality) FROM scores").fetchone()
    if row is not None:
        stats.sessions, stats.exportable = int(row[0]), int(row[1])
        stats.mean_quality = round(float(row[2]), 4) if row[2] is not None else None
    flagged = con.execute("SELECT count(DISTINCT session_id) FROM flags WHERE flag_class <> 'anomaly'").fetchone()
    stats.flagged_sessions = int(flagged[0]) if flagged else 0
    stats.flags_by_type = dict(con.execute("SELECT flag, count(*) FROM flags GROUP BY flag ORDER BY flag").fetchall())
    dups = con.execute(
        "SELECT count(*) FILTER (WHERE NOT is_representative), count(DISTINCT cluster_id) FROM duplicates"
    ).fetchone()
    if dups is not None:
        stats.duplicate_sessions, stats.clusters = int(dups[0]), int(dups[1])
