"""``trajlake score``: trajectories, steps and events → the ``scores``, ``flags`` and ``duplicates`` tables.

Reads the DuckDB views into Arrow/polars, runs :func:`quality.scoring.score_sessions`, and
replaces the three tables in one pass. Scoring is recomputed over every session because novelty
and duplicate clusters depend on the other trajectories of a task; a run is skipped when
neither the trajectories snapshot nor the scorer version changed since the last one (both are
recorded in the ``scores`` table properties).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from common.settings import Settings
from quality.config import QualityConfig
from quality.scoring import QualityResult, score_sessions
from warehouse.catalog import open_catalog
from warehouse.locks import job_lock
from warehouse.sql import open_views
from warehouse.tables import DUPLICATES, FLAGS, SCORES, TRAJECTORIES, TableSpec, ensure_table
from warehouse.transactions import retry_on_conflict, transaction

log = logging.getLogger("trajlake.score")

SCORED_SNAPSHOT = "trajlake.scored-trajectories-snapshot"
SCORED_VERSION = "trajlake.scorer-version"

TRAJECTORY_QUERY = """
SELECT session_id, task_id, task_type, status, exit_reason, started_at, duration_s, n_steps, n_file_writes,
       cpu_seconds, peak_memory_bytes, peak_processes, n_network_requests, instruction, eval_passed, reward
FROM trajectories
"""
STEP_QUERY = """
SELECT session_id, step_index, action_event_id, tool_name, command, exit_code, failure_reason FROM steps
"""
FILE_OP_QUERY = """
SELECT session_id, event_id, file_op.op AS op, file_op.path AS path, file_op.in_workspace AS in_workspace
FROM events WHERE event_type = 'file_op'
"""
NETWORK_QUERY = """
SELECT session_id, event_id, network_request.host AS host, network_request.port AS port,
       network_request.allowed AS allowed
FROM events WHERE event_type = 'network_request'
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
    skipped: bool = False
    trajectories_snapshot_id: int | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        """Plain dict for printing and asset metadata."""
        return dict(self.__dict__)


def quality_config(settings: Settings) -> QualityConfig:
    """The quality knobs from settings."""
    w_c, w_v, w_n = settings.quality_weights
    return QualityConfig(
        w_completion=w_c,
        w_validity=w_v,
        w_novelty=w_n,
        min_quality=settings.quality_min,
        behavioural_weight=settings.quality_behavioural_weight,
        outlier_z=settings.quality_outlier_z,
        dedup_threshold=settings.dedup_threshold,
        dedup_bands=settings.dedup_bands,
        dedup_rows=settings.dedup_rows,
    )


def load_inputs(settings: Settings, catalog: Catalog | None = None) -> dict[str, pl.DataFrame]:
    """The four input frames (trajectories, steps, file_ops, network) from the views."""
    con = open_views(settings, catalog)
    try:
        return {
            name: pl.from_arrow(con.sql(query).to_arrow_table())  # type: ignore[misc]
            for name, query in (
                ("trajectories", TRAJECTORY_QUERY),
                ("steps", STEP_QUERY),
                ("file_ops", FILE_OP_QUERY),
                ("network", NETWORK_QUERY),
            )
        }
    finally:
        con.close()


def _arrow(frame: pl.DataFrame, spec: TableSpec, version: str, now: datetime) -> pa.Table:
    schema = spec.arrow_schema()
    extra = {"scorer_version": version, "scored_at": now}
    columns = []
    for f in schema:
        if f.name in frame.columns:
            columns.append(frame[f.name].to_arrow().cast(f.type))
        else:
            columns.append(pa.array([extra[f.name]] * frame.height, type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def score_all(settings: Settings, catalog: Catalog | None = None, force: bool = False) -> ScoreStats:
    """Score every session and replace the ``scores``, ``flags`` and ``duplicates`` tables.

    Args:
        settings: trajlake settings (quality knobs).
        catalog: Iceberg catalog; opened from settings by default.
        force: rescore even when nothing changed since the last run.

    Returns:
        :class:`ScoreStats` (``skipped`` when the last run already covered this snapshot and version;
        ``sessions == 0`` when there are no trajectories yet: nothing is written).

    Raises:
        LockBusy: another scoring run held the catalog's ``score`` lock for as long as we waited.
    """
    catalog = catalog or open_catalog(settings)
    # One scoring run at a time across every process and machine sharing the catalog: a
    # second run waits, then finds the scores up to date (or, with force, replaces them).
    with job_lock(settings, catalog, "score"):
        return _score_all(settings, catalog, force)


def _score_all(settings: Settings, catalog: Catalog, force: bool) -> ScoreStats:
    started = time.monotonic()
    catalog = catalog or open_catalog(settings)
    config = quality_config(settings)
    trajectories = ensure_table(catalog, settings, TRAJECTORIES.name)
    scores_table = ensure_table(catalog, settings, SCORES.name)
    snapshot = trajectories.current_snapshot()
    stats = ScoreStats(scorer_version=config.scorer_version)
    stats.trajectories_snapshot_id = snapshot.snapshot_id if snapshot else None
    props = scores_table.properties
    if (
        not force
        and snapshot is not None
        and props.get(SCORED_SNAPSHOT) == str(snapshot.snapshot_id)
        and props.get(SCORED_VERSION) == config.scorer_version
    ):
        stats.skipped = True
        stats.seconds = time.monotonic() - started
        return stats
    inputs = load_inputs(settings, catalog)
    if inputs["trajectories"].height == 0:  # an empty lakehouse: nothing to score (and no error)
        stats.seconds = time.monotonic() - started
        return stats
    result = score_sessions(**inputs, config=config)
    write_results(settings, catalog, result, config, stats.trajectories_snapshot_id)
    summarize(result, stats)
    stats.seconds = time.monotonic() - started
    log.info("scored %d sessions in %.1f s", stats.sessions, stats.seconds)
    return stats


def write_results(
    settings: Settings, catalog: Catalog, result: QualityResult, config: QualityConfig, snapshot_id: int | None
) -> None:
    """Overwrite the three quality tables; the scores commit (last) records what it covered."""
    now = datetime.now(UTC)
    for spec, frame in ((FLAGS, result.flags), (DUPLICATES, result.duplicates), (SCORES, result.scores)):
        table = ensure_table(catalog, settings, spec.name)
        rows = _arrow(frame, spec, config.scorer_version, now)
        properties = (
            {SCORED_SNAPSHOT: str(snapshot_id), SCORED_VERSION: config.scorer_version} if spec is SCORES else {}
        )
        _overwrite(table, rows, properties)


def _overwrite(table: Table, rows: pa.Table, properties: dict[str, str]) -> None:
    """Replace every row of ``table`` with ``rows`` in one commit, planned again if another writer committed first.

    Raises:
        CommitConflict: the table kept changing under every attempt.
    """
    attempts = 0

    def attempt() -> None:
        nonlocal attempts
        if attempts:
            table.refresh()  # compaction (``trajlake maintain``) may have rewritten the files meanwhile
        attempts += 1
        with transaction(table) as tx:
            if table.current_snapshot() is None:  # nothing to replace (overwrite would warn)
                tx.append(rows, snapshot_properties=properties)
            else:
                with warnings.catch_warnings():
                    # pyiceberg warns when the replaced snapshot is empty (a run that found no duplicates)
                    warnings.filterwarnings("ignore", "Delete operation did not match any records")
                    tx.overwrite(rows, snapshot_properties=properties)
            if properties:
                tx.set_properties(properties)

    retry_on_conflict(f"replace {table.name()[-1]}", attempt)


def summarize(result: QualityResult, stats: ScoreStats) -> None:
    """Fill the counters of ``stats`` from a result."""
    scores, flags, dups = result.scores, result.flags, result.duplicates
    cheats = flags.filter(pl.col("flag_class") != "anomaly")
    stats.sessions = scores.height
    stats.flagged_sessions = cheats["session_id"].n_unique()
    stats.flags_by_type = dict(sorted(flags.group_by("flag").len().iter_rows()))
    stats.duplicate_sessions = dups.filter(~pl.col("is_representative")).height
    stats.clusters = dups["cluster_id"].n_unique()
    stats.exportable = int(scores["exportable"].sum())
    stats.mean_quality = round(float(scores["quality"].mean()), 4) if scores.height else None  # type: ignore[arg-type]
