"""A mistyped name in `trajlake sql` keeps DuckDB's suggestions in its one-line error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.settings import Settings
from tests.helpers import sample_events, write_raw
from warehouse.errors import QueryError
from warehouse.isolation import error_line
from warehouse.query import run_query


@pytest.fixture
def lake(settings: Settings) -> Settings:
    write_raw(settings, sample_events(2))
    return settings


#: misspelt names and the suggestion DuckDB makes for each
MISSPELT = [
    ("SELECT * FROM trajectorie", 'Did you mean "trajectories"?'),
    ("SELECT lenght(session_id) FROM events", 'Did you mean "length"?'),
    ("SELECT sesion_id FROM events", 'Candidate bindings: "session_id"'),
]


@pytest.mark.slow  # a query process per statement over a fresh lakehouse
def test_the_error_names_the_candidates(lake: Settings) -> None:
    for query, said in MISSPELT:
        with pytest.raises(QueryError) as raised:
            run_query(lake, query)
        message = str(raised.value)
        assert said in message and "\n" not in message, query


def test_error_line_keeps_the_first_line_and_only_the_suggestions() -> None:
    text = 'Catalog Error: Table with name x does not exist!\nDid you mean "y"?\n\nLINE 1: SELECT * FROM x\n   ^^^'
    assert error_line(text) == 'Catalog Error: Table with name x does not exist! Did you mean "y"?'
    assert error_line("  \n ") == ""


@given(st.lists(st.text(st.characters(exclude_categories=["Cs"]), max_size=30), max_size=6))
def test_error_line_is_one_line_holding_the_first_line(lines: list[str]) -> None:
    text = "\n".join(lines)
    line = error_line(text)
    assert "\n" not in line and "\r" not in line
    kept = [part.strip() for part in text.strip().splitlines() if part.strip()]
    assert line.startswith(kept[0]) if kept else line == ""
