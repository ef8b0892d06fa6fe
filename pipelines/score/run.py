"""The scoring run, top to bottom: scope → level 1 → affected sessions → level 2 by chunk → profiles → summary.

Each step is a stage module of :mod:`pipelines.score`; this module only orders them, holds the
run's connection and counts. Level 2, per chunk of targets: facts and novelty context
(:mod:`~pipelines.score.context`) → baselines (:mod:`~pipelines.score.baselines`) → combine
(:func:`quality.combine.combine`) → clusters (:mod:`~pipelines.score.clusters`) → final scores
(:func:`quality.scoring.finish_scores`) → writes (:mod:`~pipelines.score.write`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import date

import duckdb
import polars as pl

from common.progress import Progress
from pipelines.score.affected import affected_sessions, every_session, moved_sessions, touched_days
from pipelines.score.baselines import baselines, write_profiles
from pipelines.score.clusters import update_clusters
from pipelines.score.context import chunk_facts, novelty_context
from pipelines.score.facts import drop_facts, index_sessions, make_room, refresh_index_views
from pipelines.score.record import ScoreOptions, commit_scores, last_run
from pipelines.score.scope import RunScope, Selection, changed_sessions, plan_run, select_sessions, sessions_on_days
from pipelines.score.stats import ScoreStats
from pipelines.score.store import NO_POSITIONS, index_positions
from pipelines.score.summary import summarize
from pipelines.score.write import clear_level2, write_level2
from quality.combine import combine
from quality.config import QualityConfig
from quality.facts import facts_digest
from quality.scoring import finish_scores
from warehouse.lakehouse import Lakehouse

log = logging.getLogger("trajlake.score")


def score_all(
    lake: Lakehouse,
    force: bool = False,
    progress: Progress | None = None,
    options: ScoreOptions | None = None,
) -> ScoreStats:
    """Score the sessions new or changed since the last run (every session when the configuration changed).

    Args:
        lake: the lakehouse.
        force: rescore every session even when nothing changed.
        progress: told of the sessions indexed (level 1), then of the sessions scored (level 2), per chunk.
        options: the quality knobs and chunk size; read from the lakehouse's settings by default.

    Returns:
        :class:`~pipelines.score.stats.ScoreStats` (``skipped`` when the last run already covered
        this snapshot and configuration; ``sessions == 0`` when there are no trajectories yet:
        nothing is written).

    Raises:
        LockBusy: another scoring run held the catalog's ``score`` lock for as long as we waited.
        ConfigError: the quality configuration is inconsistent.
    """
    # One scoring run at a time across every process and machine sharing the catalog: a
    # second run waits, then finds the scores up to date.
    with lake.lock("score"):
        return _score_all(lake, options or ScoreOptions.from_settings(lake.settings), force, progress)


def _score_all(lake: Lakehouse, options: ScoreOptions, force: bool, progress: Progress | None = None) -> ScoreStats:
    started = time.monotonic()
    config = options.config
    props, snapshot_id = last_run(lake)
    stats = ScoreStats(scorer_version=config.scorer_version, config_digest=config.digest())
    stats.trajectories_snapshot_id = snapshot_id
    # scope: what the last run recorded decides what this one covers
    scope = plan_run(
        props,
        config.scorer_version,
        stats.config_digest,
        stats.trajectories_snapshot_id,
        force,
        options.watermark_lag_s,
    )
    stats.mode = scope.mode
    if scope.mode == "skipped":
        stats.skipped = True
        stats.seconds = time.monotonic() - started
        return stats
    con = lake.views()
    try:
        with stats.phase("changed"):
            changed = changed_sessions(con, scope.since_us)
        if changed.height == 0 and not scope.full:  # a new snapshot without new trajectories (tiering, compaction)
            commit_scores(lake, config, stats.trajectories_snapshot_id, props, scope.watermark)
            summarize(con, lake, stats)
            stats.seconds = time.monotonic() - started
            return stats
        with stats.phase("changed"):
            selection = select_sessions(con, changed, scope, facts_digest(config), force)
        if scope.full:
            clear_level2(lake, con, config)
        # level 1: the changed sessions' own facts
        with stats.phase("level1"):
            old, indexed = _level1(lake, options, con, scope, selection, force, stats, progress)
        # level 2: every session whose answer the changed ones move, chunk by chunk
        with stats.phase("affected"):
            targets = every_session(con) if scope.full else affected_sessions(con, selection.changed, old, config)
        changed_ids = None if scope.full else set(selection.changed["session_id"].to_list())
        stats.affected_days = targets["day"].n_unique()
        moved = moved_sessions(indexed, old)
        with stats.phase("level2"):
            for chunk in _chunks(targets, options.chunk_sessions):
                stats.rescored_sessions += _rescore(lake, con, chunk, changed_ids, config, old, moved, stats)
                if progress is not None:
                    progress(stats.rescored_sessions, targets.height, "sessions scored")
        with stats.phase("profiles"):
            touched = targets["day"].unique().to_list() if scope.full else touched_days(selection.changed, old)
            write_profiles(lake, con, touched, config)
        # summary: the ``scores`` commit, last, records what the run covered
        with stats.phase("summary"):
            commit_scores(lake, config, stats.trajectories_snapshot_id, props, selection.watermark)
            summarize(con, lake, stats)
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


def _level1(
    lake: Lakehouse,
    options: ScoreOptions,
    con: duckdb.DuckDBPyConnection,
    scope: RunScope,
    selection: Selection,
    force: bool,
    stats: ScoreStats,
    progress: Progress | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Level 1 for the selected sessions, chunk by chunk.

    Returns:
        (where the indexed sessions stood in the index before the run, the sessions indexed).
    """
    to_index = selection.to_index
    # where changed sessions stood (rows to delete where their start moved); a full run deletes those rows first
    old = NO_POSITIONS if scope.full else index_positions(con, to_index)
    if scope.full:
        to_index = make_room(con, lake, to_index, selection.changed, force or selection.current.len() == 0)
    for chunk in _chunks(to_index, options.chunk_sessions):
        index_sessions(lake, con, chunk, options.config, old, stats)
        stats.changed_sessions += chunk.height
        if progress is not None:
            progress(stats.changed_sessions, to_index.height, "sessions indexed")
    refresh_index_views(con, lake)
    return old, to_index


def _rescore(
    lake: Lakehouse,
    con: duckdb.DuckDBPyConnection,
    targets: pl.DataFrame,
    changed: set[str] | None,
    config: QualityConfig,
    old: pl.DataFrame,
    moved: pl.DataFrame,
    run: ScoreStats,
) -> int:
    """Level 2 for ``targets`` (session_id, day), and the clusters around them.

    Returns:
        The sessions rescored.
    """
    with run.phase("level2.read"):
        facts = chunk_facts(con, targets)
    if facts.height == 0:
        return 0
    with run.phase("level2.context"):
        context = novelty_context(con, facts, config)
        groups, group_stats = baselines(lake, con, facts, config)
    with run.phase("level2.combine"):
        level2 = combine(facts, context, config, groups, group_stats)
    with run.phase("level2.clusters"):
        clusters = update_clusters(con, facts, level2.scores, changed, config, old, moved, run)
    scores = finish_scores(level2.scores, clusters[1], config)
    write_level2(lake, con, facts, scores, level2.anomaly_flags, clusters, old, config, run)
    return facts.height


def index_days(lake: Lakehouse, days: list[date | None], options: ScoreOptions | None = None) -> int:
    """Level 1 for every session started on ``days``: their ``session_index`` rows and detector flags.

    The expensive half of a full rescore, independent per day: Dagster runs it as daily partitions
    in parallel; the next ``score_all`` then finds the index current and only combines.

    Returns:
        The sessions indexed.
    """
    options = options or ScoreOptions.from_settings(lake.settings)
    con = lake.views()
    try:
        sessions = sessions_on_days(con, days)
        drop_facts(con, lake, index_positions(con, sessions))
        for chunk in _chunks(sessions, options.chunk_sessions):
            index_sessions(lake, con, chunk, options.config, NO_POSITIONS)
        return sessions.height
    finally:
        con.close()


def _chunks(frame: pl.DataFrame, size: int) -> Iterator[pl.DataFrame]:
    for offset in range(0, frame.height, size):
        yield frame.slice(offset, size)
