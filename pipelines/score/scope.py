"""The scope of a run: skipped, incremental from the recorded watermark, or full; and which sessions it indexes.

A run is skipped when the ``scores`` table already records this trajectories snapshot under the same
scorer and configuration (and it is not forced). It is full when forced, when the scorer or the
configuration changed, or when nothing was scored yet; else incremental: the trajectories assembled
after the watermark, minus a lag for the clocks of other machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

import duckdb
import polars as pl
import pyarrow as pa

from pipelines.score.predicates import on_days
from pipelines.score.record import SCORED_DIGEST, SCORED_SNAPSHOT, SCORED_VERSION, SCORED_WATERMARK


@dataclass(frozen=True)
class RunScope:
    """What a run covers, decided from the ``scores`` properties alone."""

    #: "skipped", "full" or "incremental"
    mode: str
    #: the watermark the last run recorded (µs since the epoch, as recorded), or None
    watermark: str | None
    #: changed sessions are those assembled after this (µs since the epoch); None: every session
    since_us: int | None

    @property
    def full(self) -> bool:
        """Every session is scored again (its facts kept where they are current, unless forced)."""
        return self.mode == "full"


def plan_run(
    props: dict[str, str],
    scorer_version: str,
    config_digest: str,
    snapshot_id: int | None,
    force: bool,
    lag_s: float,
) -> RunScope:
    """The scope of a run from the ``scores`` table properties ``props`` the last run recorded.

    Args:
        props: the ``scores`` table properties.
        scorer_version: the scorer this run scores with.
        config_digest: the digest of the configuration this run scores with.
        snapshot_id: the current ``trajectories`` snapshot (None: no trajectories yet).
        force: rescore everything.
        lag_s: how far before the watermark trajectories are looked at again (clocks of other machines).
    """
    same_config = props.get(SCORED_VERSION) == scorer_version and props.get(SCORED_DIGEST) == config_digest
    watermark = props.get(SCORED_WATERMARK)
    if not force and snapshot_id is not None and props.get(SCORED_SNAPSHOT) == str(snapshot_id) and same_config:
        return RunScope("skipped", watermark, None)
    if force or not same_config or watermark is None:
        return RunScope("full", watermark, None)
    # trajectories assembled up to the lag before the watermark are looked at again: other machines'
    # clocks may lag (on one machine assembly stamps ``assembled_at`` under its lock: exact at lag 0)
    return RunScope("incremental", watermark, int(watermark or 0) - int(lag_s * 1_000_000))


@dataclass(frozen=True)
class Selection:
    """The sessions of a run's level 1 and the watermark it records."""

    #: session_id, day, started_at, assembled_us: the changed sessions (those level 2 starts from)
    changed: pl.DataFrame
    #: the same columns: the sessions whose facts level 1 recomputes
    to_index: pl.DataFrame
    #: session ids whose index rows are current (a full run that is not forced keeps them)
    current: pl.Series
    #: the watermark this run records
    watermark: str | None


def changed_sessions(con: duckdb.DuckDBPyConnection, since_us: int | None) -> pl.DataFrame:
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


def select_sessions(
    con: duckdb.DuckDBPyConnection, changed: pl.DataFrame, scope: RunScope, digest: str, force: bool
) -> Selection:
    """Which of the ``changed`` sessions (:func:`changed_sessions`) level 1 indexes, and the new watermark.

    A full run that is not forced keeps the facts already computed for this configuration and
    trajectory (:func:`pipelines.score.run.index_days`). An incremental run drops the sessions of
    the lag window whose facts match their trajectory: they have not changed.
    """
    to_index = changed
    current = pl.Series("session_id", [], pl.Utf8)
    if scope.full and not force:
        current = current_facts(con, digest)
        to_index = changed.filter(~pl.col("session_id").is_in(current.implode()))
    watermark = max_watermark(changed, scope.watermark)
    if not scope.full:
        current = current_facts(con, digest, changed)
        changed = changed.filter(~pl.col("session_id").is_in(current.implode()))
        to_index = changed
    return Selection(changed, to_index, current, watermark)


def current_facts(con: duckdb.DuckDBPyConnection, digest: str, among: pl.DataFrame | None = None) -> pl.Series:
    """Sessions (of ``among``: session_id, day; None: all) whose index row matches their trajectory and configuration.

    Only ``among``'s days are read: an index row on another day has another ``started_at``, so it is
    not current anyway.
    """
    where = ""
    if among is not None:
        con.register("__among", among.select("session_id").to_arrow())
        days = among["day"].unique().to_list()
        where = (
            f"AND t.session_id IN (SELECT session_id FROM __among) AND {on_days(days, 't.started_at')} "
            f"AND {on_days(days, 'i.started_at')}"
        )
    rows = con.sql(
        "SELECT t.session_id FROM trajectories t JOIN session_index i USING (session_id) "
        f"WHERE i.config_digest = $digest AND i.assembled_at IS NOT DISTINCT FROM t.assembled_at {where}",
        params={"digest": digest},
    ).pl()
    if among is not None:
        con.unregister("__among")
    return rows["session_id"].cast(pl.Utf8)


def max_watermark(changed: pl.DataFrame, previous: str | None) -> str | None:
    """The watermark after ``changed`` (its latest ``assembled_us``), never below ``previous``."""
    latest = changed["assembled_us"].max() if changed.height else None
    if latest is None:
        return previous
    return str(max(int(latest), int(previous or 0)))  # type: ignore[arg-type]


def sessions_on_days(con: duckdb.DuckDBPyConnection, days: list[date | None]) -> pl.DataFrame:
    """``session_id``, ``day`` of every trajectory started on one of ``days`` (None: without a start), by id."""
    con.register("__days", pa.table({"day": pa.array([d for d in days if d is not None], pa.date32())}))
    nulls = "OR started_at IS NULL" if None in days else ""
    try:
        return con.sql(
            "SELECT session_id, CAST(started_at AS DATE) AS day FROM trajectories "
            f"WHERE CAST(started_at AS DATE) IN (SELECT day FROM __days) {nulls} ORDER BY session_id"
        ).pl()
    finally:
        con.unregister("__days")
