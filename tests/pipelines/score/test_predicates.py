"""Day and time predicates: a lookup bounded by them keeps every wanted row, and the bounds are tight."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import duckdb
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.expressions.visitors import expression_evaluator
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import NestedField, TimestamptzType

from pipelines.score.predicates import day_terms, on_dates, on_days, on_times, whole_days

DAY_US = 86_400_000_000
# Days close together (so runs of consecutive days merge into ranges), and the last representable day.
days = st.one_of(st.dates(date(2026, 1, 1), date(2026, 1, 20)), st.just(date.max))
day_lists = st.lists(st.one_of(days, st.none()), max_size=12)
# Moments on those days: midnight, a microsecond either side of it, or anywhere in the day.
offsets = st.one_of(st.sampled_from([0, 1, DAY_US - 1]), st.integers(0, DAY_US - 1))
moments = st.one_of(
    st.none(),
    st.builds(lambda d, us: datetime.combine(d, datetime.min.time(), UTC) + timedelta(microseconds=us), days, offsets),
)


def _selected(predicate: str, values: list[datetime | None], column: str = "started_at") -> list[bool]:
    con = duckdb.connect()
    frame = pl.DataFrame({column: pl.Series(values, dtype=pl.Datetime("us", "UTC")), "i": range(len(values))})
    con.register("t", frame.to_arrow())
    found = {row[0] for row in con.sql(f"SELECT i FROM t WHERE {predicate}").fetchall()}
    return [i in found for i in range(len(values))]


@pytest.mark.slow
@given(day_lists, st.lists(moments, max_size=30))
def test_on_days_selects_exactly_the_moments_on_those_days(
    wanted: list[date | None], values: list[datetime | None]
) -> None:
    expected = [(v is None and None in wanted) or (v is not None and v.date() in wanted) for v in values]
    assert _selected(on_days(wanted), values) == expected


@given(day_lists)
def test_on_days_merges_consecutive_days_into_one_range(wanted: list[date | None]) -> None:
    present = sorted({d for d in wanted if d is not None})
    runs = sum(1 for i, d in enumerate(present) if i == 0 or (d - present[i - 1]).days > 1)
    assert on_days(wanted).count(">=") == runs


@pytest.mark.slow
@given(day_lists, st.lists(st.one_of(days, st.none()), max_size=30))
def test_on_dates_selects_exactly_those_dates(wanted: list[date | None], values: list[date | None]) -> None:
    con = duckdb.connect()
    con.register("t", pl.DataFrame({"day": pl.Series(values, dtype=pl.Date), "i": range(len(values))}).to_arrow())
    found = {row[0] for row in con.sql(f"SELECT i FROM t WHERE {on_dates(wanted)}").fetchall()}
    assert found == {i for i, v in enumerate(values) if v in wanted}


_SCHEMA = Schema(NestedField(1, "started_at", TimestamptzType(), required=False))


def _micros(value: datetime | None) -> int | None:
    return None if value is None else (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


@given(st.lists(st.one_of(days, st.none()), min_size=1, max_size=12), st.lists(moments, max_size=30))
def test_whole_days_is_the_iceberg_predicate_of_exactly_those_days(
    wanted: list[date | None], values: list[datetime | None]
) -> None:
    matches = expression_evaluator(_SCHEMA, whole_days("started_at", wanted), True)
    for value in values:
        expected = (value is None and None in wanted) or (value is not None and value.date() in wanted)
        assert matches(Record(_micros(value))) == expected, value


@given(st.lists(moments, max_size=12), st.lists(moments, max_size=30))
def test_day_terms_cover_the_days_of_the_values_and_the_null_partition(
    keys: list[datetime | None], values: list[datetime | None]
) -> None:
    matches = expression_evaluator(_SCHEMA, day_terms("started_at", keys), True)
    key_days = {k.date() for k in keys if k is not None}
    for value in values:
        assert matches(Record(_micros(value))) == (value is None or value.date() in key_days), value


@pytest.mark.parametrize("spread", [1, 10_000], ids=["few-ranges", "more-ranges-than-allowed"])
def test_a_lookup_by_start_times_keeps_every_wanted_row_and_skips_other_moments(spread: int) -> None:
    rng = random.Random(spread)
    base = datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1e6
    wanted = [int(base + rng.randrange(spread) * 3_600_000_000 + rng.randrange(60_000_000)) for _ in range(300)]
    others = [int(base + 24 * 3_600_000_000 * 500 + k) for k in range(100)]  # 500 days later: in no range
    values = pl.Series("started_at", wanted + [None], dtype=pl.Int64).cast(pl.Datetime("us", "UTC"))
    table = pl.DataFrame({"started_at": pl.Series(wanted + others + [None]).cast(pl.Datetime("us", "UTC"))})
    con = duckdb.connect()
    con.register("t", table.to_arrow())
    predicate = on_times(values)
    found = con.sql(f"SELECT started_at FROM t WHERE {predicate}").pl()["started_at"]
    assert set(values.to_list()) <= set(found.to_list())  # every wanted start, and the NULL one
    assert not set(table["started_at"].to_list()[300:400]) & set(found.to_list())
    assert predicate.count("BETWEEN") <= 64
    if spread > 1:  # the ranges close the narrowest gaps: a minute grid over the span is mostly outside them
        lo, hi = min(wanted), max(wanted)
        grid = pl.DataFrame({"started_at": pl.int_range(lo, hi, 60_000_000, eager=True)}).with_columns(
            pl.col("started_at").cast(pl.Datetime("us", "UTC"))
        )
        con.register("grid", grid.to_arrow())
        inside = con.sql(f"SELECT count(*) FROM grid WHERE {predicate}").fetchall()[0][0]
        assert inside < 0.75 * grid.height, (inside, grid.height)


@pytest.mark.slow
@given(st.lists(moments, max_size=40), st.lists(moments, max_size=40))
def test_on_times_keeps_every_given_moment(wanted: list[datetime | None], others: list[datetime | None]) -> None:
    values = pl.Series("started_at", wanted, dtype=pl.Datetime("us", "UTC"))
    selected = _selected(on_times(values), wanted + others)
    assert all(selected[: len(wanted)])
    if not wanted:
        assert not any(selected)
