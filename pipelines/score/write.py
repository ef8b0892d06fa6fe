"""Level 2's writes: a chunk's scores, anomaly flags and changed duplicate rows, replaced by session.

Only rows that change are rewritten. A member of a touched cluster outside the chunk that loses its
exportability (shadowed by a better duplicate) needs no write: the ``scores`` view applies
``duplicates`` (see ``SCORES.derived``), so a cluster spanning history rewrites no history files;
one that gains it (a representative again) is rewritten. A duplicate row is rewritten only where it
is new, changed or gone.
"""

from __future__ import annotations

from datetime import UTC, datetime

import duckdb
import polars as pl
from pyiceberg.expressions import EqualTo, Not, Or, Reference, literal

from pipelines.score.predicates import ANOMALY_FLAGS
from pipelines.score.stats import ScoreStats
from pipelines.score.store import (
    arrow_rows,
    clear_table,
    delete_and_append,
    delete_keys,
    existing_keys,
    lookup,
    refresh_view,
    replace_sessions,
)
from quality.combine import exportable
from quality.config import QualityConfig
from warehouse.lakehouse import Lakehouse
from warehouse.tables import DUPLICATES, FLAGS, PROFILES, SCORES


def clear_level2(lake: Lakehouse, con: duckdb.DuckDBPyConnection, config: QualityConfig) -> None:
    """Before a full run: empty ``scores``, ``duplicates`` and ``profiles``, and drop flags it recomputes.

    Clusters must be rebuilt from empty (see :func:`pipelines.score.clusters.cluster_set`), and rows
    of an older scorer would otherwise linger. The anomaly flags go, and detector flags of another
    scorer version. Readers see partial quality tables until the run ends.
    """
    for spec in (SCORES, DUPLICATES, PROFILES):
        clear_table(lake.table(spec.name))
    stale_flags = Or(
        ANOMALY_FLAGS,
        Not(EqualTo(term=Reference("scorer_version"), value=literal(config.scorer_version))),
    )
    delete_and_append(lake.table(FLAGS.name), None, stale_flags)
    for spec in (SCORES, FLAGS, DUPLICATES, PROFILES):
        refresh_view(con, lake, spec)


def write_level2(
    lake: Lakehouse,
    con: duckdb.DuckDBPyConnection,
    facts: pl.DataFrame,
    scores: pl.DataFrame,
    anomaly_flags: pl.DataFrame,
    clusters: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame],
    old: pl.DataFrame,
    config: QualityConfig,
    run: ScoreStats,
) -> None:
    """Replace the chunk's ``scores`` and anomaly ``flags``, and the ``duplicates`` rows its clusters changed.

    Args:
        lake: the lakehouse.
        con: the run's views (pointed at the new snapshots afterwards).
        facts: the chunk's targets' index rows.
        scores: their final scores (:func:`quality.scoring.finish_scores`).
        anomaly_flags: their anomaly flags.
        clusters: members, duplicates, outside (:func:`pipelines.score.clusters.update_clusters`).
        old: where the run's changed sessions stood in the index before it.
        config: the scorer version the rows carry.
        run: the run whose phase timings to add to.

    Raises:
        CommitConflict: a commit kept losing to concurrent ones.
    """
    members, duplicates, outside = clusters
    now = datetime.now(UTC)
    kept = outside.clear()
    if outside.height:
        # members outside the targets: only their exportability can change; those that gain it are rewritten
        # (``_old`` is the view's)
        kept = outside.with_columns(exportable(outside, duplicates).alias("_new")).filter(
            pl.col("_new") & ~pl.col("_old").fill_null(False)
        )
        rows = score_rows(con, kept).join(kept.select("session_id", "_new"), on="session_id")
        kept = rows.with_columns(pl.col("_new").alias("exportable"))
        scores = pl.concat([scores, kept.select(scores.columns).cast(scores.schema)])
    started = members.select("session_id", "started_at")
    # each row carries its member's exact key and signature: a later run grows the cluster without the index
    own = members.select("session_id", "started_at", "exact_key", "signature")
    dup_rows, dup_ids = changed_duplicates(con, duplicates.join(own, on="session_id", how="left"), started)
    anomalies = anomaly_flags.join(facts.select("session_id", "started_at"), on="session_id", how="left")
    with run.phase("level2.write"), run.phase("level2.write.flags"):
        anomaly_rows = arrow_rows(anomalies, FLAGS, config.scorer_version, now)
        # the targets' rows are on their days, or where a moved session was before this run
        near = facts["day"].unique().to_list() + old["day"].unique().to_list()
        flags_table = lake.table(FLAGS.name)
        replace_sessions(
            flags_table,
            anomaly_rows,
            existing_keys(con, "flags", facts["session_id"], near, "flag_class = 'anomaly'"),
            extra=ANOMALY_FLAGS,
        )
    with run.phase("level2.write"), run.phase("level2.write.duplicates"):
        dup_table = lake.table(DUPLICATES.name)
        dup_keys = existing_keys(con, "duplicates", dup_ids)
        replace_sessions(dup_table, arrow_rows(dup_rows, DUPLICATES, config.scorer_version, now), dup_keys)
    with run.phase("level2.write"), run.phase("level2.write.scores"):
        # kept: rows read just now
        score_keys = delete_keys(existing_keys(con, "scores", facts["session_id"], near), kept)
        replace_sessions(
            lake.table(SCORES.name),
            arrow_rows(scores, SCORES, config.scorer_version, now),
            score_keys,
        )
    with run.phase("level2.write"):
        for spec in (FLAGS, DUPLICATES, SCORES):
            refresh_view(con, lake, spec)


def score_rows(con: duckdb.DuckDBPyConnection, sessions: pl.DataFrame) -> pl.DataFrame:
    """The current ``scores`` rows of ``sessions`` (session_id, started_at), read from their days only."""
    days = sessions.select(pl.col("started_at").cast(pl.Datetime("us", "UTC")).dt.date())["started_at"]
    return lookup(con, "* EXCLUDE (scored_at)", "scores", sessions["session_id"], days.unique().to_list())


def changed_duplicates(
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
