"""Where a session came from, as scoring reads it: the ``origin`` column, or the envelope's derivation."""

import duckdb

from pipelines.score.inputs import origin_expression

ROWS = [
    # session_id, host_id, image_name, sandbox_id
    ("a" * 32, "importer", "imported/swe-agent", None),
    ("b" * 32, "synthetic-host-07", "trajlake/bugfix", "sb-" + "b" * 16),
    ("c" * 32, "local-box", "trajlake/bugfix", "sb-" + "c" * 16),
    ("d" * 32, "host-1", "my-image", "my-sandbox"),
]


def _origins(with_column: bool) -> list[str]:
    con = duckdb.connect()
    extra = ", origin VARCHAR" if with_column else ""
    con.execute(
        f"CREATE TABLE scoped_trajectories (session_id VARCHAR, host_id VARCHAR, image_name VARCHAR, "
        f"sandbox_id VARCHAR{extra})"
    )
    for row in ROWS:
        values = (*row, "otlp" if row[0][0] == "d" else None) if with_column else row
        con.execute(f"INSERT INTO scoped_trajectories VALUES ({', '.join('?' * len(values))})", values)
    return [r[0] for r in con.sql(f"SELECT {origin_expression(con)} FROM scoped_trajectories ORDER BY 1").fetchall()]


def test_without_an_origin_column_the_envelope_says_where_a_session_came_from() -> None:
    assert _origins(False) == ["import:swe-agent", "sandbox", "sdk", "synthetic"]


def test_the_origin_column_wins_where_it_is_set() -> None:
    assert _origins(True) == ["import:swe-agent", "otlp", "sandbox", "synthetic"]
