"""``trajlake score``: trajectories, steps and events → the scores, flags, duplicates and profiles tables.

Reads the DuckDB views into Arrow/polars, runs :func:`quality.scoring.score_sessions`, and
replaces the four tables in one pass. Scoring is recomputed over every session because novelty
and duplicate clusters depend on the other trajectories of a family; a run is skipped when
neither the trajectories snapshot nor the scoring configuration changed since the last one.
The configuration is compared by digest (scorer version, weights, thresholds and the governance
table: :meth:`quality.config.QualityConfig.digest`), so changing a weight rescores; the
configuration itself is recorded in the ``scores`` table properties for export manifests.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from common.errors import ConfigError
from common.settings import Settings
from quality.config import QualityConfig
from quality.scoring import QualityResult, score_sessions
from warehouse.catalog import open_catalog
from warehouse.locks import job_lock
from warehouse.sql import open_views
from warehouse.tables import DUPLICATES, FLAGS, PROFILES, SCORES, TRAJECTORIES, TableSpec, ensure_table
from warehouse.transactions import retry_on_conflict, transaction

log = logging.getLogger("trajlake.score")

SCORED_SNAPSHOT = "trajlake.scored-trajectories-snapshot"
SCORED_VERSION = "trajlake.scorer-version"
SCORED_DIGEST = "trajlake.scoring-config-digest"
SCORED_CONFIG = "trajlake.scoring-config"

TRAJECTORY_QUERY = """
SELECT session_id, task_id, task_type, task_family, status, exit_reason, started_at, duration_s, n_steps,
       n_file_writes, disk_write_bytes, cpu_seconds, peak_memory_bytes, peak_processes, processes_started,
       n_network_requests, instruction, eval_passed, reward
FROM trajectories
"""
# Outputs only where a detector reads them (a test file's assertions), and only their head.
STEP_QUERY = """
SELECT session_id, step_index, action_event_id, tool_name, command, arguments, exit_code, failure_reason,
       CASE WHEN (contains(output, 'assert') AND regexp_matches(coalesce(command, ''), 'test'))
                 OR contains(coalesce(command, ''), 'git')
            THEN left(output, 20000) END AS output
FROM steps
"""
FILE_OP_QUERY = """
SELECT session_id, seq, event_id, file_op.op AS op, file_op.path AS path, file_op.in_workspace AS in_workspace,
       file_op.sha256 AS sha256
FROM events WHERE event_type = 'file_op'
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
    FROM events WHERE event_type = 'session_start' GROUP BY session_id
),
evaluation AS (
    SELECT session_id, arg_max(event_id, struct_pack(seq, event_id)) AS eval_event_id,
           arg_max(CASE WHEN extra['evaluator_tampered'] IS NOT NULL
                        THEN json_merge_patch(coalesce(evaluation.details, '{}'),
                                              json_object('evaluator_tampered', extra['evaluator_tampered']))
                        ELSE evaluation.details END, struct_pack(seq, event_id)) AS eval_details
    FROM events WHERE event_type = 'evaluation' GROUP BY session_id
),
submitted AS (
    SELECT session_id, arg_max(extra['submission_event_id'], seq) AS submission_event_id
    FROM events WHERE event_type = 'session_end' AND extra['submission_event_id'] IS NOT NULL GROUP BY session_id
)
SELECT t.session_id, start.workspace_root, start.egress_allowlist, start.history_forbidden,
       start.protected_files, start.deliverables, start.history_commit,
       st.output AS submission, evaluation.eval_event_id, evaluation.eval_details
FROM (SELECT session_id FROM trajectories) t
LEFT JOIN start USING (session_id)
LEFT JOIN evaluation USING (session_id)
LEFT JOIN submitted USING (session_id)
LEFT JOIN steps st ON st.session_id = t.session_id AND st.feedback_event_id = submitted.submission_event_id
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
    config_digest: str = ""
    skipped: bool = False
    trajectories_snapshot_id: int | None = None
    seconds: float = 0.0

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


def load_inputs(settings: Settings, catalog: Catalog | None = None) -> dict[str, pl.DataFrame]:
    """The input frames (trajectories, steps, file_ops, network, sessions) from the views."""
    con = open_views(settings, catalog)
    try:
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
    stats = ScoreStats(scorer_version=config.scorer_version, config_digest=config.digest())
    stats.trajectories_snapshot_id = snapshot.snapshot_id if snapshot else None
    props = scores_table.properties
    if (
        not force
        and snapshot is not None
        and props.get(SCORED_SNAPSHOT) == str(snapshot.snapshot_id)
        and props.get(SCORED_VERSION) == config.scorer_version
        and props.get(SCORED_DIGEST) == stats.config_digest
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
    """Overwrite the four quality tables; the scores commit (last) records what it covered and how."""

    now = datetime.now(UTC)
    covered = {
        SCORED_SNAPSHOT: str(snapshot_id),
        SCORED_VERSION: config.scorer_version,
        SCORED_DIGEST: config.digest(),
        SCORED_CONFIG: json.dumps(config.manifest(), sort_keys=True),
    }
    tables = (
        (FLAGS, result.flags),
        (DUPLICATES, result.duplicates),
        (PROFILES, result.profiles),
        (SCORES, result.scores),
    )
    for spec, frame in tables:
        table = ensure_table(catalog, settings, spec.name)
        rows = _arrow(frame, spec, config.scorer_version, now)
        properties = covered if spec is SCORES else {}
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
    mean = scores["quality"].mean()
    stats.mean_quality = round(float(mean), 4) if isinstance(mean, int | float) else None
