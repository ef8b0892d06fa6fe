"""Cheats seen in ``network_request`` events: egress actually attempted outside the allowlist."""

from __future__ import annotations

import polars as pl

from quality.cheats.evidence import Hit, SessionContext, host_of


def from_network(network: pl.DataFrame, ctx: dict[str, SessionContext]) -> list[Hit]:
    hits = []
    for row in network.filter(~pl.col("allowed").fill_null(False)).iter_rows(named=True):
        session = ctx.get(row["session_id"]) or SessionContext()
        host = str(row.get("host") or "?")
        if host_of(host) in session.allowlist:
            continue  # the gateway refused a host the task allows: an infrastructure fault, not a cheat
        hits.append(
            Hit(
                row["session_id"],
                "forbidden_egress",
                row.get("event_id"),
                host=f"{host}:{row.get('port')}",
                reason="egress attempt outside the allowlist, refused",
            )
        )
    return hits
