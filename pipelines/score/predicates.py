"""Predicates on start times and days: how a scoring run reads and deletes only the days it touches.

Pure builders of SQL text (for DuckDB over the views) and of Iceberg expressions (for deletes). The quality
tables are partitioned by the day of ``started_at``: ranges of days and of times, rather than lists of
values, let DuckDB skip files and row groups by their statistics and let Iceberg delete by partition.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time

import numpy as np
import polars as pl
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    IsNull,
    LessThan,
    Not,
    Or,
    Reference,
    literal,
)

from quality.config import QualityConfig

#: Iceberg predicates: the anomaly flags (level 2) and the detector flags (level 1) of the ``flags`` table.
ANOMALY_FLAGS = EqualTo(term=Reference("flag_class"), value=literal("anomaly"))
DETECTOR_FLAGS = Not(ANOMALY_FLAGS)

#: Start times closer than this go into one range of :func:`on_times`; at most this many ranges.
TIME_GAP = timedelta(minutes=10)
TIME_RANGES = 64


def moment(values: pl.Series, how: str) -> datetime | None:
    """The least (``how="min"``) or greatest aware timestamp of ``values`` (None: none)."""
    value = values.min() if how == "min" else values.max()
    return value if isinstance(value, datetime) else None


def instant(value: datetime) -> str:
    """SQL literal of an aware timestamp."""
    return f"TIMESTAMPTZ '{value.astimezone(UTC).isoformat(sep=' ')}'"


def on_days(days: list[date | None], column: str = "started_at") -> str:
    """SQL: the UTC timestamp ``column`` falls on one of ``days`` (None: is NULL).

    As ranges of consecutive days, which DuckDB checks against each file's and row group's
    statistics: the day-partitioned tables are then read only on those days (a
    ``CAST(… AS DATE) IN …`` reads every file).
    """
    ordered = sorted({d for d in days if d is not None})
    terms: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and (ordered[end + 1] - ordered[end]).days == 1:
            end += 1
        term = f"{column} >= {instant(datetime.combine(ordered[start], dt_time.min, UTC))}"
        if ordered[end] < date.max:
            term += f" AND {column} < {instant(datetime.combine(ordered[end] + timedelta(days=1), dt_time.min, UTC))}"
        terms.append(f"({term})")
        start = end + 1
    if None in days:
        terms.append(f"{column} IS NULL")
    return "(" + " OR ".join(terms or ["FALSE"]) + ")"


def on_dates(days: list[date | None], column: str = "day") -> str:
    """SQL: the DATE ``column`` is one of ``days`` (None: is NULL)."""
    listed = ", ".join(f"DATE '{d.isoformat()}'" for d in sorted({d for d in days if d is not None}))
    terms = [f"{column} IN ({listed})"] if listed else []
    if None in days:
        terms.append(f"{column} IS NULL")
    return "(" + " OR ".join(terms or ["FALSE"]) + ")"


def on_times(values: pl.Series, column: str = "started_at") -> str:
    """A SQL predicate true for rows whose ``column`` is one of ``values`` (and some around them).

    The values, sorted, go into ranges where they are closer than :data:`TIME_GAP` (at most
    :data:`TIME_RANGES`: the smallest gaps are closed first): files and row groups written at
    other times are skipped by their statistics (a day's files are written a run's chunk at a time,
    so rows of a few moments are in a few of them). Null values: ``column IS NULL`` too.
    """
    times = values.cast(pl.Datetime("us", "UTC"))
    present = times.drop_nulls().unique().sort()
    terms = [f"{column} IS NULL"] if times.null_count() else []
    if present.len():
        micros = present.dt.epoch("us").to_numpy()
        gaps = np.diff(micros)
        breaks = np.flatnonzero(gaps > TIME_GAP / timedelta(microseconds=1))
        if len(breaks) >= TIME_RANGES:  # keep the widest gaps only
            breaks = np.sort(breaks[np.argsort(gaps[breaks])[-(TIME_RANGES - 1) :]])
        starts = np.r_[0, breaks + 1]
        ends = np.r_[breaks, len(micros) - 1]
        for lo, hi in zip(micros[starts].tolist(), micros[ends].tolist(), strict=True):
            terms.append(f"{column} BETWEEN make_timestamptz({lo}::BIGINT) AND make_timestamptz({hi}::BIGINT)")
    return "(" + " OR ".join(terms or ["FALSE"]) + ")"


def exportable_base(config: QualityConfig) -> str:
    """SQL over ``scores`` columns: exportable on the session's own merits (before duplicate clusters)."""
    return (
        f"quality >= {float(config.min_quality)!r} AND NOT coalesce(security_flagged, FALSE) "
        "AND outcome = 'success'"  # a verified success, as quality.combine decides
    )


def whole_days(column: str, days: list[date | None]) -> BooleanExpression:
    """Iceberg predicate: ``column`` on one of ``days`` (None: NULL), exactly."""
    terms: list[BooleanExpression] = []
    for d in sorted(d for d in days if d is not None):
        start = GreaterThanOrEqual(
            term=Reference(column), value=literal(datetime.combine(d, dt_time.min, UTC).isoformat())
        )
        if d == date.max:
            terms.append(start)
            continue
        end = datetime.combine(d + timedelta(days=1), dt_time.min, UTC).isoformat()
        terms.append(And(start, LessThan(term=Reference(column), value=literal(end))))
    if None in days:
        terms.append(IsNull(term=Reference(column)))
    return terms[0] if len(terms) == 1 else Or(*terms)


def day_terms(column: str, values: list[datetime | None]) -> BooleanExpression:
    """Iceberg predicate: ``column`` on one of the days of ``values`` (partition pruning for day-partitioned tables).

    Rows without a start (and rows of an older scorer, from before the column existed) sit in the
    null partition: it is always included.
    """
    return whole_days(column, [*{v.date() for v in values if v is not None}, None])
