"""Costs priced when read: the ``model_prices`` table and the ``trajectories`` view over the stored rows.

The stored ``trajectories`` rows hold token counts, the cost producers or servers recorded
(``cost_usd``), and the tokens of model calls that recorded none, per model
(``unpriced_usage``). :func:`register_priced_trajectories` turns the price table
(``TRAJLAKE_PRICE_TABLE``, :mod:`common.prices`) into a ``model_prices`` table on the
connection and redefines ``trajectories`` as the stored rows with ``cost_usd`` = recorded +
priced (``recorded_cost_usd`` keeps the recorded part), in exact decimals. Everything that reads
costs — the ``costs`` view, ``trajlake sql``, exports — reads this view, so a new price table
takes effect on the next query.
"""

from __future__ import annotations

import duckdb

from common.prices import PriceTable

#: Priced cost of one stored ``trajectories`` row ``t``: recorded + Σ tokens × price of their model.
PRICED_COST_SQL = """
CASE WHEN t.cost_usd IS NULL THEN NULL ELSE (
    t.cost_usd::DECIMAL(38, 12) + coalesce((
        SELECT sum((u.input_tokens - coalesce(u.cached_tokens, 0)) * p.input + coalesce(u.cached_tokens, 0) * p.cached
                   + coalesce(u.output_tokens, 0) * p.output)
        FROM (SELECT unnest(t.unpriced_usage, recursive := true)) u JOIN model_prices p ON p.model = u.model
    ), 0)
)::DOUBLE END
"""


def register_prices(con: duckdb.DuckDBPyConnection, prices: PriceTable) -> None:
    """``model_prices(model, input, cached, output)``: USD per token of each priced model (a temp table)."""
    con.execute(
        "CREATE OR REPLACE TEMP TABLE model_prices "
        "(model VARCHAR PRIMARY KEY, input DECIMAL(18, 12), cached DECIMAL(18, 12), output DECIMAL(18, 12))"
    )
    rows = list(prices.rows())
    if rows:
        con.executemany(
            "INSERT INTO model_prices VALUES (?, ?::DECIMAL(18, 12), ?::DECIMAL(18, 12), ?::DECIMAL(18, 12))", rows
        )


def register_priced_trajectories(con: duckdb.DuckDBPyConnection, prices: PriceTable) -> None:
    """Redefine ``trajectories`` (created over both tiers) with priced costs; the rows as stored stay in
    ``trajectories_recorded``."""
    register_prices(con, prices)
    con.execute(
        'CREATE OR REPLACE VIEW trajectories_recorded AS SELECT * FROM "cold_trajectories" '
        'UNION ALL BY NAME SELECT * FROM "hot_trajectories"'
    )
    con.execute(
        "CREATE OR REPLACE VIEW trajectories AS SELECT t.* REPLACE "
        f"({PRICED_COST_SQL} AS cost_usd), t.cost_usd AS recorded_cost_usd FROM trajectories_recorded t"
    )
