"""Duplicate clusters around a chunk of targets: grown from the fresh sessions' links, or recomputed.

Growing (:mod:`pipelines.score.growth`) reads only what the fresh sessions touch; where it is not
exact, or in a full run, the clusters of a closed set of sessions are recomputed
(:func:`cluster_set`): the set no duplicate link leaves, so its clusters come out as a computation
over every session would give them.
"""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa

from pipelines.score.growth import grown_clusters
from pipelines.score.predicates import exportable_base
from pipelines.score.stats import ScoreStats
from pipelines.score.store import band_rows, lookup
from quality.combine import clusters as recompute_clusters
from quality.config import QualityConfig


def update_clusters(
    con: duckdb.DuckDBPyConnection,
    facts: pl.DataFrame,
    scores: pl.DataFrame,
    changed: set[str] | None,
    config: QualityConfig,
    old: pl.DataFrame,
    moved: pl.DataFrame,
    run: ScoreStats,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The duplicate clusters every session of ``facts`` is in, after this run.

    Args:
        con: the run's views.
        facts: the chunk's targets' index rows.
        scores: their level-2 scores of this run.
        changed: the ids of the run's changed sessions; None: every session is new (a full run).
        config: the LSH parameters and the similarity threshold.
        old: where the run's changed sessions stood in the index before it.
        moved: session_id, day (now) of the sessions whose start moved to another day in this run.
        run: the run whose counters (``closed_sets``) and phase timings to add to.

    Returns:
        (members: session_id, started_at, exact_key, signature of every member of a touched cluster;
        duplicates: their :data:`quality.dedup.DUPLICATES_SCHEMA` rows; outside: current ``scores``
        rows of members outside ``facts`` whose exportability can change, with ``_old`` and
        ``exportable_base``).
    """
    grown = None if changed is None else grown_clusters(con, facts, scores, changed, config, old, run)
    if grown is not None:
        return grown
    members, ranking, outside = cluster_set(con, facts, scores, changed, config, moved)
    run.closed_sets += 1
    return members, recompute_clusters(members, ranking, config), outside


def cluster_set(
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
    probe = band_rows(fresh).select("band_key").unique()
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
    # with its task: near-duplicates are found within a task (quality.dedup)
    columns = "session_id, exact_key, signature, started_at::TIMESTAMPTZ AS started_at, task_id"
    members = lookup(con, columns, "session_index", closed["session_id"], closed["day"].unique().to_list())
    # a member's scores row is on its day; only what ranking and exportability read
    others = members.filter(~pl.col("session_id").is_in(here.implode()))
    base = exportable_base(config)
    outside = lookup(
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
