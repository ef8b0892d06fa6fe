"""What the HTML report shows, read from the lakehouse: aggregates over a scope of sessions.

The scope is every trajectory of the lakehouse, or the sessions of one export (read from the
export's own data files, named by its manifest). Aggregates are computed by DuckDB, so the report
of a large lakehouse reads a few hundred rows, not the sessions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipelines.errors import ReportError
from pipelines.report.inspect import class_rank, severity_rank

if TYPE_CHECKING:
    import duckdb

#: Bins of the quality histogram (over [0, 1]) and of the cost histogram.
QUALITY_BINS = 20
COST_BINS = 20
#: Flagged sessions listed on the overview at most (all of them count in the figures).
FLAGGED_LISTED = 1000


@dataclass
class Overview:
    """The overview page's content."""

    scope: str
    export: dict[str, Any] | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    families: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[tuple[str, int]] = field(default_factory=list)
    failure_causes: list[tuple[str, int]] = field(default_factory=list)
    quality_bins: list[int] = field(default_factory=list)
    cost_bins: list[int] = field(default_factory=list)
    cost_high: float = 0.0
    cost_stats: dict[str, float | None] = field(default_factory=dict)
    flagged: list[dict[str, Any]] = field(default_factory=list)
    flagged_total: int = 0
    listed: list[dict[str, Any]] = field(default_factory=list)
    #: the session index the overview searches: its shard files and the values of each filter
    index_shards: int = 0
    filters: dict[str, list[tuple[str, int]]] = field(default_factory=dict)


def _rows(con: duckdb.DuckDBPyConnection, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    cursor = con.execute(query, params or {})
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def export_sessions(export_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """An export's manifest and the session ids of its records.

    Raises:
        ReportError: no ``manifest.json``, a data file it names is missing or is not a plain name
            inside the directory, or a record has no ``session_id``.
    """
    manifest_path = export_dir / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{export_dir} is not a trajlake export (cannot read {manifest_path}: {exc})") from exc
    ids: list[str] = []
    for entry in manifest.get("files") or []:
        name = str(entry.get("path", ""))
        path = export_dir / name
        parts = name.split("/")  # a split's file: data/<split>.jsonl (never outside the directory)
        if any(part in ("", ".", "..") for part in parts) or len(parts) > 2 or not path.is_file():
            raise ReportError(f"{export_dir}: the manifest names {name!r}, which is not a file of the export")
        try:
            if name.endswith(".parquet"):
                import pyarrow.parquet as pq

                ids += [str(v) for v in pq.read_table(path, columns=["session_id"]).column("session_id").to_pylist()]
            else:
                with path.open() as handle:
                    ids += [str(json.loads(line)["session_id"]) for line in handle if line.strip()]
        except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
            raise ReportError(f"{path}: cannot read the session ids of its records ({exc})") from exc
    return manifest, ids


def define_scope(con: duckdb.DuckDBPyConnection, session_ids: list[str] | None) -> None:
    """Create the temp table ``scope(session_id)``: ``session_ids``, or every trajectory when ``None``."""
    if session_ids is None:
        con.execute("CREATE OR REPLACE TEMP TABLE scope AS SELECT DISTINCT session_id FROM trajectories")
        return
    ids = pa.table({"session_id": pa.array(sorted(set(session_ids)), pa.string())})
    con.register("scope_ids", ids)
    con.execute("CREATE OR REPLACE TEMP TABLE scope AS SELECT session_id FROM scope_ids")
    con.unregister("scope_ids")


def overview(con: duckdb.DuckDBPyConnection, scope: str, max_pages: int) -> Overview:
    """The overview of the sessions in ``scope`` (see :func:`define_scope`); ``max_pages`` sessions get a page."""
    result = Overview(scope=scope)
    base = (
        "FROM scope JOIN trajectories t USING (session_id) LEFT JOIN scores s USING (session_id) "
        "LEFT JOIN (SELECT DISTINCT session_id, true AS flagged FROM flags) f USING (session_id)"
    )
    _counts(con, base, result)
    _costs(con, base, result)
    result.flagged_total = int(result.totals["flagged"] or 0)
    result.flagged = _flagged(con)
    _listed(con, result, max_pages)
    return result


def _counts(con: duckdb.DuckDBPyConnection, base: str, result: Overview) -> None:
    """``result``'s totals, its rows per task family, status and failure cause, and its quality histogram."""
    result.totals = _rows(
        con,
        "SELECT count(*) AS sessions, coalesce(sum(t.n_steps), 0) AS steps, "
        "count(*) FILTER (WHERE t.eval_passed IS NOT NULL) AS evaluated, "
        "count(*) FILTER (WHERE t.eval_passed) AS passed, count(*) FILTER (WHERE f.flagged) AS flagged, "
        "count(*) FILTER (WHERE s.exportable) AS exportable, sum(t.cost_usd) AS cost_usd, "
        "sum(t.input_tokens) AS input_tokens, sum(t.output_tokens) AS output_tokens, "
        f"avg(s.quality) AS mean_quality {base}",
    )[0]
    result.families = _rows(
        con,
        "SELECT coalesce(t.task_family, t.task_type, t.task_id, '?') AS task_family, count(*) AS sessions, "
        "count(*) FILTER (WHERE t.eval_passed IS NOT NULL) AS evaluated, "
        "count(*) FILTER (WHERE t.eval_passed) AS passed, avg(s.quality) AS mean_quality, "
        f"avg(t.cost_usd) AS mean_cost_usd, count(*) FILTER (WHERE f.flagged) AS flagged {base} "
        "GROUP BY 1 ORDER BY 1",
    )
    result.statuses = [
        (str(r["status"]), int(r["n"]))
        for r in _rows(
            con, f"SELECT coalesce(t.status, '?') AS status, count(*) AS n {base} GROUP BY 1 ORDER BY 2 DESC"
        )
    ]
    result.failure_causes = [
        (str(r["cause"]), int(r["n"]))
        for r in _rows(
            con,
            f"SELECT s.failure_cause AS cause, count(*) AS n {base} WHERE s.failure_cause IS NOT NULL "
            "GROUP BY 1 ORDER BY 2 DESC",
        )
    ]
    bins = {
        int(r["bin"]): int(r["n"])
        for r in _rows(
            con,
            f"SELECT least(floor(s.quality * {QUALITY_BINS}), {QUALITY_BINS - 1})::INT AS bin, count(*) AS n {base} "
            "WHERE s.quality IS NOT NULL GROUP BY 1",
        )
    }
    result.quality_bins = [bins.get(i, 0) for i in range(QUALITY_BINS)]


def _costs(con: duckdb.DuckDBPyConnection, base: str, result: Overview) -> None:
    """``result``'s cost figures (median, p95, max, mean) and cost histogram up to the 99th percentile."""
    stats = _rows(
        con,
        "SELECT quantile_cont(t.cost_usd, 0.5) AS p50, quantile_cont(t.cost_usd, 0.95) AS p95, "
        f"quantile_cont(t.cost_usd, 0.99) AS p99, max(t.cost_usd) AS max, avg(t.cost_usd) AS mean {base}",
    )[0]
    result.cost_stats = {k: stats[k] for k in ("p50", "p95", "max", "mean")}
    # the top 1% are left out of the bins (and said so), or one runaway session would squash the rest
    high = float(stats["p99"] or 0.0) or float(stats["max"] or 0.0)
    result.cost_high = high
    if high > 0:
        bins = {
            int(r["bin"]): int(r["n"])
            for r in _rows(
                con,
                f"SELECT least(floor(t.cost_usd / $high * {COST_BINS}), {COST_BINS - 1})::INT AS bin, count(*) AS n "
                f"{base} WHERE t.cost_usd IS NOT NULL AND t.cost_usd <= $high GROUP BY 1",
                {"high": high},
            )
        }
        result.cost_bins = [bins.get(i, 0) for i in range(COST_BINS)]


def _flagged(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The first ``FLAGGED_LISTED`` flagged sessions in scope (worst class and severity first, then the most
    recent), each with its flags."""
    flags = _rows(
        con,
        "SELECT fl.session_id, fl.flag, fl.flag_class, fl.severity, fl.evidence, "
        "coalesce(t.task_family, t.task_type) AS task_family, t.status, t.started_at, s.quality "
        "FROM flags fl JOIN scope USING (session_id) JOIN trajectories t USING (session_id) "
        "LEFT JOIN scores s USING (session_id) "
        f"ORDER BY {class_rank('fl.flag_class')}, {severity_rank('fl.severity')}, t.started_at DESC, fl.session_id",
    )
    by_session: dict[str, dict[str, Any]] = {}
    for row in flags:
        entry = by_session.get(row["session_id"])
        if entry is None:
            if len(by_session) >= FLAGGED_LISTED:
                continue
            entry = by_session[row["session_id"]] = {
                k: row[k] for k in ("session_id", "task_family", "status", "started_at", "quality")
            }
            entry["flags"] = []
        entry["flags"].append({k: row[k] for k in ("flag", "flag_class", "severity", "evidence")})
    return list(by_session.values())


def _listed(con: duckdb.DuckDBPyConnection, result: Overview, max_pages: int) -> None:
    """``result``'s listed sessions (those that get a page): the flagged first, then the most recent others,
    ``max_pages`` in all."""
    flagged_ids = [row["session_id"] for row in result.flagged][:max_pages]
    rest = max_pages - len(flagged_ids)
    recent = _rows(
        con,
        "SELECT t.session_id FROM scope JOIN trajectories t USING (session_id) "
        "WHERE t.session_id NOT IN (SELECT session_id FROM flags) "
        "ORDER BY t.started_at DESC NULLS LAST, t.session_id LIMIT $n",
        {"n": max(0, rest)},
    )
    chosen = flagged_ids + [str(r["session_id"]) for r in recent]
    if chosen:
        con.register("listed_ids", pa.table({"session_id": pa.array(chosen, pa.string())}))
        result.listed = _rows(
            con,
            "SELECT t.session_id, coalesce(t.task_family, t.task_type) AS task_family, t.status, t.eval_passed, "
            "t.n_steps, t.cost_usd, s.quality, t.started_at, t.agent_name, t.host_id "
            "FROM listed_ids JOIN trajectories t USING (session_id) LEFT JOIN scores s USING (session_id) "
            "ORDER BY t.started_at DESC NULLS LAST, t.session_id",
        )
        con.unregister("listed_ids")


#: Sessions per index shard (``sessions/index-NNNNN.js``): the search page loads them one by one.
INDEX_SHARD = 5000
#: What the search page filters on, each a column of :func:`session_index` rows.
FILTERS = ("family", "outcome", "origin", "agent", "flag")


def _columns(con: duckdb.DuckDBPyConnection, view: str) -> set[str]:
    return {str(r[0]) for r in con.execute(f"SELECT column_name FROM (DESCRIBE {view})").fetchall()}


def _index_query(con: duckdb.DuckDBPyConnection) -> str:
    """The query of every session in scope with what the search page shows and filters on, flagged first."""
    origin = "t.origin" if "origin" in _columns(con, "trajectories") else "NULL::VARCHAR"
    return (
        "SELECT t.session_id, t.task_id, coalesce(t.task_family, t.task_type, t.task_id, '?') AS family, "
        "coalesce(s.outcome, CASE WHEN t.eval_passed THEN 'success' WHEN t.eval_passed = false THEN 'failure' "
        "ELSE t.status END, '?') AS outcome, "
        f"{origin} AS origin, concat_ws(' / ', t.agent_name, t.agent_model) AS agent, t.status, t.eval_passed, "
        "t.n_steps, s.quality, s.exportable, t.cost_usd, t.started_at, f.flags "
        "FROM scope JOIN trajectories t USING (session_id) LEFT JOIN scores s USING (session_id) "
        "LEFT JOIN (SELECT session_id, list(struct_pack(flag, flag_class, severity, evidence) ORDER BY "
        f"{class_rank('flag_class')}, {severity_rank('severity')}, flag) AS flags FROM flags GROUP BY session_id) f "
        "USING (session_id) "
        "ORDER BY f.flags IS NULL, t.started_at DESC NULLS LAST, t.session_id"
    )


def session_index(con: duckdb.DuckDBPyConnection, batch: int = INDEX_SHARD) -> Iterator[list[dict[str, Any]]]:
    """Every session in scope (see :func:`define_scope`), ``batch`` rows at a time, flagged sessions first.

    Each row: session_id, task_id, family, outcome, origin (None where trajectories have no
    ``origin`` column), agent, status, eval_passed, n_steps, quality, exportable, cost_usd,
    started_at, and flags (a list of flag, flag_class, severity, evidence, or None).
    """
    cursor = con.execute(_index_query(con))
    columns = [d[0] for d in cursor.description]
    while rows := cursor.fetchmany(batch):
        yield [dict(zip(columns, row, strict=True)) for row in rows]
