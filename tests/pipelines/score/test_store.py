"""The rows every stage writes: band keys per session and band, and the keys a replace deletes by."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
from hypothesis import given
from hypothesis import strategies as st

from pipelines.score.store import band_rows, delete_keys
from quality.dedup import flat_band_keys

base = datetime(2026, 1, 1, tzinfo=UTC)
band_lists = st.none() | st.lists(st.none() | st.integers(-(2**63), 2**63 - 1), max_size=6)


@given(st.lists(band_lists, max_size=8))
def test_band_rows_are_one_per_session_and_band_with_the_band_number_mixed_in(
    bands: list[list[int | None] | None],
) -> None:
    facts = pl.DataFrame(
        {
            "session_key": pl.Series(range(len(bands)), dtype=pl.Int64),
            "started_at": pl.Series([base + timedelta(minutes=i) for i in range(len(bands))]),
            "bands": pl.Series(bands, dtype=pl.List(pl.Int64)),
        }
    )
    rows = band_rows(facts)
    expected = sorted(
        (int(flat_band_keys(np.array([key]), np.array([band]))[0]), session, base + timedelta(minutes=session))
        for session, keys in enumerate(bands)
        for band, key in enumerate(keys or [], start=1)  # bands are numbered from 1, as in quality.dedup
        if key is not None
    )
    assert rows.columns == ["band_key", "session_key", "started_at"]
    assert sorted(rows.iter_rows()) == expected


moments = st.none() | st.integers(0, 10).map(lambda h: base + timedelta(hours=h))
keyed = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), moments), max_size=8)


@given(keyed, keyed)
def test_delete_keys_are_where_sessions_are_and_were_once_each(
    now: list[tuple[str, object]], was: list[tuple[str, object]]
) -> None:
    schema = pl.Schema({"session_id": pl.Utf8(), "started_at": pl.Datetime("us", "UTC")})
    keys = delete_keys(*(pl.DataFrame(rows, schema=schema, orient="row") for rows in (now, was)))
    assert keys.schema == schema
    assert sorted(keys.iter_rows(), key=repr) == sorted(set(now) | set(was), key=repr)
