"""Baselines and profiles: the per (profile, day) feature statistics z-scores are measured against.

A group's baseline is the previous day's group of its profile (origin/task family) when that one is large enough
(:func:`quality.combine.baseline_days`). Its statistics are the day's ``profiles`` rows, each of which
records the ``session_index`` files it was computed from: while those are still the day's files the
row holds, so a new day's sessions read their complete baseline day's statistics, not every session
of it.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, date, datetime, timedelta

import duckdb
import polars as pl
from pyiceberg.table import Table

from pipelines.score.predicates import on_dates, on_days
from pipelines.score.store import arrow_rows, refresh_view, replace_days
from quality.anomalies import FEATURES
from quality.combine import baseline_days, baseline_of, profiles
from quality.config import QualityConfig
from warehouse.lakehouse import Lakehouse
from warehouse.snapshots import day_partitions, live_files
from warehouse.tables import PROFILES, SESSION_INDEX


def baselines(
    lake: Lakehouse, con: duckdb.DuckDBPyConnection, facts: pl.DataFrame, config: QualityConfig
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`quality.combine.baseline_days` of ``facts``' groups and the stats of those baselines.

    The stats are the baseline days' ``profiles`` rows (:func:`quality.combine.baseline_of`): a day's
    rows are recomputed first only when its index files changed since (:func:`write_profiles`).
    """
    days = [d for d in facts["day"].unique().to_list()]
    near = days + [d - timedelta(days=1) for d in days if d is not None and d > date.min]
    counts = con.sql(
        f"SELECT coalesce(profile, 'unknown') AS profile, day, count(*) AS n FROM session_index "
        f"WHERE {on_days(near)} GROUP BY ALL"
    ).pl()
    wanted = facts.select(pl.col("profile").fill_null("unknown"), "day").unique()
    chosen = baseline_days(counts, config.min_profile_sessions)
    chosen = chosen.join(wanted, on=["profile", "day"], how="inner", nulls_equal=True)
    chosen_days = chosen["baseline_day"].unique().to_list()
    write_profiles(lake, con, chosen_days, config)
    rows = con.sql(f"SELECT * FROM profiles WHERE {on_dates(chosen_days)}").pl()
    return chosen, baseline_of(rows.cast({"day": pl.Date}))


def write_profiles(
    lake: Lakehouse, con: duckdb.DuckDBPyConnection, days: list[date | None], config: QualityConfig
) -> None:
    """Recompute the profiles of those of ``days`` (every profile of each) whose index files changed.

    A row records the ``session_index`` files of its day it was computed from (``index_files``): while
    they are still the day's files — no session of the day was indexed, re-indexed or moved since, and
    the scorer is the same — the row holds and the day is not read again.
    """
    table = lake.table(PROFILES.name)
    prints = index_files(lake.table(SESSION_INDEX.name))
    wanted = sorted(set(days), key=lambda d: (d is None, d or date.min))
    held: dict[date | None, set[tuple[str | None, str | None]]] = {}
    for day, files, version in con.sql(
        f"SELECT DISTINCT day, index_files, scorer_version FROM profiles WHERE {on_dates(wanted)}"
    ).fetchall():
        held.setdefault(day, set()).add((files, version))
    # a day without index files has no profile: stale only if it still has rows
    stale = [
        d
        for d in wanted
        if (d in prints or d in held) and (d not in prints or held.get(d) != {(prints[d], config.scorer_version)})
    ]
    for day in stale:  # a day at a time (3M sessions at the design scale: a week would not fit)
        chunk = [day]
        members = con.sql(
            f"SELECT profile, day, {', '.join(FEATURES)}, tool_counts, exit_code_counts "
            f"FROM session_index WHERE {on_days(chunk)}"
        ).pl()
        rows = profiles(members).with_columns(
            pl.lit(config.scorer_version).alias("scorer_version"), pl.lit(prints.get(day)).alias("index_files")
        )
        replace_days(table, arrow_rows(rows, PROFILES, config.scorer_version, datetime.now(UTC)), chunk)
    if stale:
        refresh_view(con, lake, PROFILES)


def index_files(table: Table) -> dict[date | None, str]:
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
