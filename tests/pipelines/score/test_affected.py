"""Level 2's targets, the pure parts: the days a run touches and the sessions whose start moved to another day."""

from __future__ import annotations

from datetime import date

import polars as pl
from hypothesis import given
from hypothesis import strategies as st

from pipelines.score.affected import moved_sessions, touched_days

some_days = st.none() | st.dates(date(2026, 1, 1), date(2026, 1, 5))
placed = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), some_days, max_size=4)


def _frame(days: dict[str, date | None]) -> pl.DataFrame:
    return pl.DataFrame(
        {"session_id": list(days), "day": pl.Series(list(days.values()), dtype=pl.Date)},
        schema={"session_id": pl.Utf8, "day": pl.Date},
    )


@given(placed, placed)
def test_a_moved_session_is_one_indexed_on_another_day_than_it_was(
    now: dict[str, date | None], was: dict[str, date | None]
) -> None:
    moved = moved_sessions(_frame(now), _frame(was))
    assert dict(moved.iter_rows()) == {s: d for s, d in now.items() if s in was and was[s] != d}


@given(placed, placed)
def test_touched_days_are_where_sessions_are_and_were_in_order_none_last(
    now: dict[str, date | None], was: dict[str, date | None]
) -> None:
    days = touched_days(_frame(now), _frame(was))
    everything = set(now.values()) | set(was.values())
    assert set(days) == everything and len(days) == len(everything)
    dated = [d for d in days if d is not None]
    assert dated == sorted(dated) and (None not in days or days[-1] is None)
