"""Level 2's targets: every session whose z-scores, novelty or quality a run's changed sessions move.

Read from the index alone: the changed sessions where they stand now and where they stood before the
run mark the families (novelty windows) and the (profile, day) groups (z-score baselines) they
touch.
"""

from __future__ import annotations

from datetime import date, timedelta

import duckdb
import polars as pl

from pipelines.score.predicates import instant, moment, on_days
from pipelines.score.store import index_positions
from quality.config import QualityConfig


def every_session(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """``session_id``, ``day`` of every indexed session, by start: a full run's targets."""
    return con.sql("SELECT session_id, day FROM session_index ORDER BY started_at NULLS LAST, session_id").pl()


def affected_sessions(
    con: duckdb.DuckDBPyConnection, changed: pl.DataFrame, old: pl.DataFrame, config: QualityConfig
) -> pl.DataFrame:
    """``session_id``, ``day``, ``started_at`` of every session whose level-2 answer a changed session moves.

    The changed sessions; those whose novelty window one of them entered or left; the whole
    (profile, day) group of a changed session when that group is its own baseline; and the whole
    next day's group of its profile when this group is (or was) that day's baseline. Only the
    days and families these can be on are read.

    Args:
        con: the run's views, with the changed sessions' new index rows.
        changed: session_id, day of the changed sessions.
        old: where they stood before the run (:func:`~pipelines.score.store.index_positions`).
        config: ``novelty_max_history`` is the window.
    """
    now = index_positions(con, changed, anywhere=False)
    columns = ["session_id", "family", "started_at", "day", "profile"]
    markers = pl.concat([now.select(columns), old.select(columns)]).with_columns(
        pl.col("family").fill_null(chr(0)).alias("f"), pl.col("started_at").cast(pl.Datetime("us", "UTC"))
    )
    # a family's rows before its first marker are in no marker's window: the ranking starts there
    firsts = markers.group_by("f").agg(pl.col("started_at").min().alias("first"))
    lowest = moment(firsts["first"], "min")
    timed = "FALSE" if lowest is None else f"started_at >= {instant(lowest)}"
    touched = touched_days(now, old)
    near = touched + [d - timedelta(days=1) for d in touched if d is not None and d > date.min]
    con.register("__now", now.select(columns).to_arrow())
    con.register("__old", old.select(columns).to_arrow())
    con.register("__firsts", firsts.to_arrow())
    try:
        groups = _baseline_groups(con, near, config)
        return _reached(con, timed, groups, config)
    finally:
        for name in ("__now", "__old", "__firsts", "__counts", "__groups"):
            con.unregister(name)  # a name never registered is no error


def _baseline_groups(con: duckdb.DuckDBPyConnection, near: list[date | None], config: QualityConfig) -> pl.DataFrame:
    """(profile, day) groups a changed session moves: a group that is its own baseline, the next day's.

    Registers ``__counts`` and ``__groups`` on ``con`` (the caller unregisters them).
    """
    counts = con.sql(
        "SELECT coalesce(profile, 'unknown') AS profile, day, count(*) AS n FROM session_index "
        f"WHERE {on_days(near)} GROUP BY ALL"
    ).pl()
    con.register("__counts", counts.to_arrow())
    groups = con.sql(
        f"""
        WITH now_in AS (SELECT profile, day, count(*) AS n_new FROM __now GROUP BY ALL),
        was_in AS (SELECT profile, day, count(*) AS n_old FROM __old GROUP BY ALL),
        touched AS (
            SELECT profile, day, coalesce(n_new, 0) AS n_new, coalesce(n_old, 0) AS n_old
            FROM now_in FULL JOIN was_in USING (profile, day)
        )
        -- its own baseline: the previous day has fewer than min_profile_sessions sessions of the profile
        SELECT t.profile, t.day FROM touched t
        LEFT JOIN __counts p ON p.profile = t.profile AND p.day = t.day - 1
        WHERE t.day IS NULL OR coalesce(p.n, 0) < {config.min_profile_sessions}
        UNION
        -- the next day's baseline, before or after this run
        SELECT t.profile, t.day + 1 FROM touched t
        LEFT JOIN __counts c ON c.profile = t.profile AND c.day = t.day
        WHERE greatest(coalesce(c.n, 0), coalesce(c.n, 0) - t.n_new + t.n_old) >= {config.min_profile_sessions}
        """
    ).pl()
    con.register("__groups", groups.to_arrow())
    return groups


def _reached(con: duckdb.DuckDBPyConnection, timed: str, groups: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """The changed sessions, those whose novelty window a marker entered or left, and the moved groups' members."""
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
              ON coalesce(i.profile, 'unknown') = g.profile AND i.day IS NOT DISTINCT FROM g.day
            WHERE {on_days(groups["day"].to_list())}
        )
        SELECT DISTINCT session_id, day, started_at FROM (
            SELECT session_id, day, started_at FROM __now
            UNION ALL SELECT * FROM novelty UNION ALL SELECT * FROM grouped
        )
        ORDER BY started_at NULLS LAST, session_id
        """
    ).pl()


def touched_days(changed: pl.DataFrame, old: pl.DataFrame) -> list[date | None]:
    """The days (``day`` column) where ``changed`` sessions are and were (in ``old``), in order, None last."""
    return sorted(set(changed["day"].to_list()) | set(old["day"].to_list()), key=lambda d: (d is None, d or date.min))


def moved_sessions(indexed: pl.DataFrame, old: pl.DataFrame) -> pl.DataFrame:
    """``session_id``, ``day`` of the ``indexed`` sessions now on another day than their index row was (in ``old``)."""
    moved = indexed.join(old.select("session_id", pl.col("day").alias("was")), on="session_id")
    return moved.filter(pl.col("day").ne_missing(pl.col("was"))).select("session_id", "day")
