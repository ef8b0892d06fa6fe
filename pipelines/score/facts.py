"""Level 1: a session's own facts replace its rows of ``session_index``, ``band_keys`` and ``flags``.

The facts (:mod:`quality.facts`: detector flags, failure cause, features, MinHash signature, LSH
band keys) depend on the session alone, so they are computed once per change of its trajectory,
chunk by chunk, and level 2 reads them from the index. An index row records the trajectory's
``assembled_at`` and the configuration's facts digest: a row matching both is current.
"""

from __future__ import annotations

from datetime import UTC, datetime

import duckdb
import polars as pl
from pyiceberg.expressions import And

from pipelines.score.inputs import read_inputs, scope_views
from pipelines.score.predicates import DETECTOR_FLAGS, on_days, whole_days
from pipelines.score.stats import ScoreStats
from pipelines.score.store import (
    arrow_rows,
    band_rows,
    clear_table,
    delete_and_append,
    delete_keys,
    index_positions,
    refresh_view,
    replace_sessions,
)
from quality.config import QualityConfig
from quality.dedup import session_keys
from quality.facts import facts_digest, session_facts
from warehouse.lakehouse import Lakehouse
from warehouse.tables import BAND_KEYS, FLAGS, SESSION_INDEX

#: Stale sessions of one day deleted by id at most; a day with more goes whole (its current facts recomputed too).
BY_ID_PER_DAY = 10_000


def index_sessions(
    lake: Lakehouse,
    con: duckdb.DuckDBPyConnection,
    chunk: pl.DataFrame,
    config: QualityConfig,
    old: pl.DataFrame,
    run: ScoreStats | None = None,
) -> None:
    """Level 1 for ``chunk``'s sessions (session_id, day): their index rows and detector flags are replaced.

    ``old``: where the run found them before (:func:`~pipelines.score.store.index_positions`;
    :data:`~pipelines.score.store.NO_POSITIONS` when their old rows are already gone). ``run``: the
    run whose phase timings to add to.
    """
    if chunk.height == 0:
        return
    run = run or ScoreStats()
    sessions = chunk["session_id"].to_list()
    with run.phase("level1.read"):
        scope_views(con, sessions, chunk["day"].unique().to_list(), lake)
        inputs = read_inputs(con)
        assembled = con.sql("SELECT session_id, assembled_at FROM scoped_traj").pl()
    with run.phase("level1.facts"):
        level1 = session_facts(**inputs, config=config)
    with run.phase("level1.write"):
        now = datetime.now(UTC)
        facts = level1.facts.join(assembled, on="session_id", how="left").with_columns(
            pl.lit(facts_digest(config)).alias("config_digest"), session_keys(level1.facts["session_id"])
        )
        index = lake.table(SESSION_INDEX.name)
        mine = old.filter(pl.col("session_id").is_in(chunk["session_id"].implode()))
        keys = delete_keys(mine)  # flags exist only where an index row does
        replace_sessions(index, arrow_rows(facts, SESSION_INDEX, config.scorer_version, now), keys)
        # their band keys (the old rows found by the keys of the same session ids)
        bands = band_rows(facts)
        old_bands = keys.with_columns(session_keys(keys["session_id"]))
        band_table = lake.table(BAND_KEYS.name)
        replace_sessions(band_table, arrow_rows(bands, BAND_KEYS, config.scorer_version, now), old_bands, "session_key")
        # detector flags: replaced for these sessions (anomaly flags belong to level 2)
        flags = level1.cheat_flags.join(facts.select("session_id", "started_at"), on="session_id", how="left")
        flags_table = lake.table(FLAGS.name)
        flag_rows = arrow_rows(flags, FLAGS, config.scorer_version, now)
        replace_sessions(flags_table, flag_rows, keys, extra=DETECTOR_FLAGS)


def refresh_index_views(con: duckdb.DuckDBPyConnection, lake: Lakehouse) -> None:
    """Point the ``session_index`` and ``band_keys`` views at what level 1 wrote: level 2 reads them next."""
    refresh_view(con, lake, SESSION_INDEX)
    refresh_view(con, lake, BAND_KEYS)


def make_room(
    con: duckdb.DuckDBPyConnection,
    lake: Lakehouse,
    to_index: pl.DataFrame,
    changed: pl.DataFrame,
    everything: bool,
) -> pl.DataFrame:
    """Before a full run's level 1: delete the facts it recomputes, in one pass per table.

    Deleting them chunk by chunk would rewrite the same day files once per chunk. ``everything``
    (forced, or no fact is current): the tables are simply emptied; else the facts of ``to_index``
    go (:func:`drop_facts`).

    Returns:
        ``to_index`` and the sessions of ``changed`` whose current facts went with their day, by start.
    """
    if everything:
        for spec in (SESSION_INDEX, BAND_KEYS, FLAGS):
            clear_table(lake.table(spec.name))
        return to_index
    again = drop_facts(con, lake, index_positions(con, to_index))
    return pl.concat([to_index, changed.join(again, on="session_id", how="semi")]).sort(
        "started_at", "session_id", nulls_last=True
    )


def drop_facts(con: duckdb.DuckDBPyConnection, lake: Lakehouse, positions: pl.DataFrame) -> pl.DataFrame:
    """Delete the level-1 rows (index, band keys, detector flags) of the sessions at ``positions``.

    A day all of whose index rows go — or more than :data:`BY_ID_PER_DAY` of them — is deleted
    by its partition (files dropped, nothing read); the few stale sessions of other days by id
    (a predicate naming millions of ids costs pyiceberg more to bind than the delete itself).

    Returns:
        session_id of the sessions whose facts were current but went with their day: index them again.
    """
    empty = pl.DataFrame(schema={"session_id": pl.Utf8})
    if positions.height == 0:
        return empty
    days = positions["day"].unique().to_list()
    counts = con.sql(f"SELECT day, count(*) AS n FROM session_index WHERE {on_days(days)} GROUP BY day").pl()
    per_day = positions.group_by("day").len().join(counts, on="day", how="left", nulls_equal=True)
    whole = per_day.filter((pl.col("len") == pl.col("n")) | (pl.col("len") > BY_ID_PER_DAY))["day"].to_list()
    partial = positions.filter(~pl.col("day").is_in(whole, nulls_equal=True))
    kept = empty
    if whole:
        con.register("__stale", positions.select("session_id").to_arrow())
        try:
            kept = con.sql(
                f"SELECT session_id FROM session_index WHERE {on_days(whole)} "
                "AND session_id NOT IN (SELECT session_id FROM __stale)"
            ).pl()
        finally:
            con.unregister("__stale")
    for spec, by, extra in (
        (SESSION_INDEX, "session_id", None),
        (BAND_KEYS, "session_key", None),
        (FLAGS, "session_id", DETECTOR_FLAGS),
    ):
        table = lake.table(spec.name)
        if whole:
            within = whole_days("started_at", whole)
            delete_and_append(table, None, within if extra is None else And(within, extra))
        if partial.height:
            keys = delete_keys(partial).with_columns(session_keys(partial["session_id"]))
            replace_sessions(table, spec.arrow_schema().empty_table(), keys, by, extra)
    return kept
