"""The end of a run: its counters from the quality tables as they now stand."""

from __future__ import annotations

import duckdb

from pipelines.score.stats import ScoreStats
from pipelines.score.store import refresh_view
from warehouse.lakehouse import Lakehouse
from warehouse.tables import DUPLICATES, FLAGS, SCORES


def summarize(con: duckdb.DuckDBPyConnection, lake: Lakehouse, stats: ScoreStats) -> None:
    """Fill the counters of ``stats`` from the quality tables as they now stand."""
    for spec in (SCORES, FLAGS, DUPLICATES):
        refresh_view(con, lake, spec)
    row = con.execute("SELECT count(*), count(*) FILTER (WHERE exportable), avg(quality) FROM scores").fetchone()
    if row is not None:
        stats.sessions, stats.exportable = int(row[0]), int(row[1])
        stats.mean_quality = round(float(row[2]), 4) if row[2] is not None else None
    flagged = con.execute("SELECT count(DISTINCT session_id) FROM flags WHERE flag_class <> 'anomaly'").fetchone()
    stats.flagged_sessions = int(flagged[0]) if flagged else 0
    stats.flags_by_type = dict(con.execute("SELECT flag, count(*) FROM flags GROUP BY flag ORDER BY flag").fetchall())
    dups = con.execute(
        "SELECT count(*) FILTER (WHERE NOT is_representative), count(DISTINCT cluster_id) FROM duplicates"
    ).fetchone()
    if dups is not None:
        stats.duplicate_sessions, stats.clusters = int(dups[0]), int(dups[1])
