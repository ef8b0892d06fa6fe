"""What level 2 reads for a chunk of targets: their facts from the index, and their novelty context.

A session's novelty is measured against the ``novelty_max_history`` earlier sessions of its task
family. The context is found by looking back from each family's first target an hour, a day, a
week, … so a run reads the history near its targets, not all of it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import duckdb
import polars as pl

from pipelines.score.predicates import instant, moment
from pipelines.score.store import lookup
from quality.config import QualityConfig
from quality.facts import FACTS_SCHEMA

#: How far back a run looks for a family's earlier sessions first, then further (None: all history).
LOOKBACK: tuple[timedelta | None, ...] = (
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=7),
    timedelta(days=49),
    None,
)


def chunk_facts(con: duckdb.DuckDBPyConnection, targets: pl.DataFrame) -> pl.DataFrame:
    """The ``session_index`` rows of ``targets`` (session_id, day), as :data:`quality.facts.FACTS_SCHEMA` types.

    Read from the targets' days only. Empty when none of them is indexed.
    """
    columns = "* EXCLUDE (assembled_at, config_digest, scored_at)"
    facts = lookup(con, columns, "session_index", targets["session_id"], targets["day"].unique().to_list())
    if facts.height == 0:
        return facts
    return facts.cast({k: v for k, v in FACTS_SCHEMA.items() if k in facts.columns})


def novelty_context(con: duckdb.DuckDBPyConnection, facts: pl.DataFrame, config: QualityConfig) -> pl.DataFrame:
    """Index rows among the ``novelty_max_history`` before each session of ``facts`` in its family.

    Per family: every row from its first target to its last (and the NULL-started rows when a
    target has no start), and the ``novelty_max_history`` latest rows before the first, found by
    looking back an hour from the latest earlier row, then a day, a week, … until enough are found
    or the whole history was read. Each look reads only the files of its time range, and only
    session ids: signatures are read last, of the rows kept.

    Returns:
        session_id, family, started_at, signature of the context rows.
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
        found.append(_target_span(con, firsts))
        # the ``depth`` rows before it, looking further back until each family has them or history ends; the
        # looks start from the latest earlier row (a gap in the history before the targets costs nothing)
        pending, ceiling = _anchors(con, firsts)
        for lookback in LOOKBACK:
            if pending.height == 0:
                break
            before, pending = _look_back(con, pending, ceiling, lookback, depth)
            found.append(before)
    finally:
        con.unregister("__firsts")
    rows = pl.concat([f.with_columns(pl.col("started_at").cast(pl.Datetime("us", "UTC"))) for f in found])
    rows = rows.unique("session_id")
    columns = "session_id, family, started_at::TIMESTAMPTZ AS started_at, signature"
    days = rows["day"].unique().to_list()
    return lookup(con, columns, "session_index", rows["session_id"], days, starts=rows["started_at"])


def _target_span(con: duckdb.DuckDBPyConnection, firsts: pl.DataFrame) -> pl.DataFrame:
    """Rows from each family's first target to its last (NULL-started rows come last, after every other)."""
    lowest, highest = moment(firsts["first"], "min"), moment(firsts["last"], "max")
    timed = "FALSE"
    if lowest is not None and highest is not None:
        timed = f"started_at BETWEEN {instant(lowest)} AND {instant(highest)}"
    return con.sql(
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


def _anchors(con: duckdb.DuckDBPyConnection, firsts: pl.DataFrame) -> tuple[pl.DataFrame, datetime]:
    """Per family its first target (``anchor``) and where the looks back start (``reference``); the ceiling.

    The reference is the latest row before the anchor's ceiling (plus a microsecond); no family is
    pending when nothing started before any target.
    """
    pending = firsts.select("f", pl.col("first").fill_null(datetime.max.replace(tzinfo=UTC)).alias("anchor"))
    ceiling = moment(pending["anchor"], "max") or datetime.max.replace(tzinfo=UTC)
    earlier = f"SELECT max(started_at) FROM session_index WHERE started_at < {instant(ceiling)}"
    latest = con.sql(earlier).fetchall()[0]
    if latest[0] is None:
        pending = pending.clear()  # nothing started before any target
    else:
        reference = latest[0] + timedelta(microseconds=1)
        pending = pending.with_columns(pl.min_horizontal("anchor", pl.lit(reference)).alias("reference"))
    return pending, ceiling


def _look_back(
    con: duckdb.DuckDBPyConnection, pending: pl.DataFrame, ceiling: datetime, lookback: timedelta | None, depth: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One look back (``lookback`` before each reference; None: all history): the rows found, the families short."""
    con.register("__anchors", pending.to_arrow())
    prune = f"started_at < {instant(ceiling)}"
    since = "TRUE"
    if lookback is not None:
        since = f"i.started_at >= a.reference - INTERVAL {int(lookback.total_seconds())} SECOND"
        low = moment(pending["reference"], "min")
        if low is not None and low - datetime.min.replace(tzinfo=UTC) > lookback:
            prune += f" AND started_at >= {instant(low - lookback)}"
    before = con.sql(
        f"""
        SELECT session_id, day, i.started_at::TIMESTAMPTZ AS started_at, a.f
        FROM session_index i JOIN __anchors a ON coalesce(i.family, chr(0)) = a.f
        WHERE {prune} AND i.started_at < a.anchor AND {since}
        QUALIFY row_number() OVER (PARTITION BY a.f ORDER BY i.started_at DESC, session_id DESC) <= {depth}
        """
    ).pl()
    con.unregister("__anchors")
    complete = before.group_by("f").len().filter(pl.col("len") >= depth)["f"]
    return before.select("session_id", "day", "started_at"), pending.filter(~pl.col("f").is_in(complete.implode()))
