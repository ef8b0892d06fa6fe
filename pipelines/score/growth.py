"""Duplicate clusters grown from the fresh sessions' links alone, where that is exact.

Documents are linked to the earliest session of each LSH bucket they are in
(:func:`quality.combine.clusters`), so a session that is new to the index and later than the first
of each of its buckets adds links and changes none: clusters only grow and merge, and the members of
an old cluster keep their rows unless its representative changes. That holds unless a fresh session
was indexed before (re-assembled: its old links may be gone, so a cluster can split) or heads a
bucket that holds older sessions (every one of them links to it now): then :func:`grown_clusters`
says so, and the closed set is recomputed instead (:func:`pipelines.score.clusters.cluster_set`).

What is read: the band keys that a fresh session's keys hit and their sessions' ids and starts; the
rows of the old clusters the fresh sessions, their links and the targets are in (``duplicates``
holds cluster members only); the ``scores`` rows of sessions that can take or lose a
representative's place; signatures only of the links' heads and of the members whose row changes.
Not every member's signature across history.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from pipelines.score.predicates import exportable_base
from pipelines.score.stats import ScoreStats
from pipelines.score.store import band_rows, lookup
from quality.config import QualityConfig
from quality.dedup import DUPLICATES_SCHEMA, components
from quality.facts import signatures_of

_UTC = pl.Datetime("us", "UTC")
#: Members of no touched cluster (:func:`grown_clusters`' first frame).
NO_MEMBERS = pl.DataFrame(
    schema={"session_id": pl.Utf8, "started_at": _UTC, "exact_key": pl.Int64, "signature": pl.Binary}
)
#: ``scores`` rows of no member outside the targets (:func:`grown_clusters`' last frame).
NO_OUTSIDE = pl.DataFrame(
    schema={
        "session_id": pl.Utf8,
        "quality": pl.Float64,
        "started_at": _UTC,
        "_old": pl.Boolean,
        "exportable_base": pl.Boolean,
    }
)


def grown_clusters(
    con: duckdb.DuckDBPyConnection,
    facts: pl.DataFrame,
    scores: pl.DataFrame,
    changed: set[str],
    config: QualityConfig,
    old: pl.DataFrame,
    run: ScoreStats,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """The clusters around ``facts`` updated from the fresh sessions' links alone; None where that is not exact.

    Args:
        con: the run's views.
        facts: the chunk's targets' index rows.
        scores: their level-2 scores of this run (session_id, quality, started_at).
        changed: the ids of the run's changed sessions (the fresh ones are those in ``facts``).
        config: the LSH parameters and the similarity threshold.
        old: where the run's changed sessions stood in the index before it.
        run: the run whose phase timings to add to.

    Returns:
        As :func:`pipelines.score.clusters.cluster_set` followed by :func:`quality.combine.clusters`:
        (members: session_id, started_at, exact_key, signature (where known) of every member of a
        touched cluster; duplicates: their rows; outside: current ``scores`` rows, with ``_old`` and
        ``exportable_base``, of members outside ``facts`` whose role can change). None: a fresh
        session was indexed before, or heads a bucket of older sessions.
    """
    fresh = facts.filter(pl.col("session_id").is_in(list(changed)))
    if old.height and fresh["session_id"].is_in(old["session_id"].implode()).any():
        return None
    lap = run.laps("level2.clusters.")
    probed = _probe(con, fresh)
    if probed is None:
        return None  # a fresh session now heads a bucket of older ones: each of them links to it
    links, twins, positions = probed
    lap("probe")
    rows = _old_clusters(con, pl.concat([links["b"], twins["b"], facts["session_id"]]).unique())
    lap("old_clusters")
    # signatures: the fresh sessions' from their facts, members' from their rows, the rest from the index
    signatures = _Signatures(
        con,
        pl.concat(
            [
                facts.select("session_id", "exact_key", "signature"),
                rows.filter(pl.col("signature").is_not_null()).select("session_id", "exact_key", "signature"),
            ]
        ).unique("session_id", keep="first"),
    )
    sigs = signatures.of(links["b"], positions)
    left = links.join(sigs, left_on="a", right_on="session_id", how="left", maintain_order="left")
    right = links.join(sigs, left_on="b", right_on="session_id", how="left", maintain_order="left")
    similar = _similarity(left["signature"], right["signature"], config.num_perm)
    edges = pl.concat([links.filter(pl.Series(similar >= config.dedup_threshold, dtype=pl.Boolean)), twins])
    # only the clusters a confirmed link or a target is in are touched
    touched = rows.filter(
        pl.col("session_id").is_in(pl.concat([edges["a"], edges["b"], facts["session_id"]]).implode())
    )["cluster_id"].unique()
    rows = rows.filter(pl.col("cluster_id").is_in(touched.implode())).drop("exact_key", "signature")
    if rows.height == 0 and edges.height == 0:
        return NO_MEMBERS, pl.DataFrame(schema=DUPLICATES_SCHEMA), NO_OUTSIDE
    lap("links")
    members = merged_components(rows, edges)
    starts = pl.concat([positions, facts.select("session_id", pl.col("started_at").cast(_UTC))]).unique("session_id")
    members = (
        members.join(starts, on="session_id", how="left", suffix="_c")
        .with_columns(pl.coalesce("started_at", "started_at_c").alias("started_at"))
        .drop("started_at_c")
    )
    lap("components")
    members, roles = _representatives(con, members, facts, scores, config)
    lap("representatives")
    duplicates = _cluster_rows(members, signatures, config)
    lap("rows")
    members = members.select("session_id", "started_at").join(signatures.known, on="session_id", how="left")
    return members, duplicates, roles


def merged_components(rows: pl.DataFrame, edges: pl.DataFrame) -> pl.DataFrame:
    """Old clusters merged by new links: the connected components over clusters and loose sessions.

    Args:
        rows: session_id, cluster_id and any other columns of the members of old clusters, each
            cluster whole (its ``cluster_id`` is one of its members: the representative).
        edges: a, b: links between sessions (members of ``rows`` or sessions in no old cluster).

    Returns:
        One row per member of ``rows`` and per end of ``edges``: session_id; label (its old cluster,
        or itself when it was in none); component (the same integer for sessions joined by links,
        directly, through other sessions or through an old cluster); and ``rows``' other columns
        (null for a session in no old cluster).
    """
    label = rows.select("session_id", pl.col("cluster_id").alias("label"))
    ends = pl.concat([edges["a"], edges["b"]]).unique()
    loose = ends.filter(~ends.is_in(label["session_id"].implode()))
    label = pl.concat([label, pl.DataFrame({"session_id": loose, "label": loose})])
    names = label["label"].unique().sort()
    index = {name: i for i, name in enumerate(names.to_list())}
    to_label = dict(zip(label["session_id"].to_list(), label["label"].to_list(), strict=True))
    a = np.array([index[to_label[v]] for v in edges["a"].to_list()], dtype=np.int64)
    b = np.array([index[to_label[v]] for v in edges["b"].to_list()], dtype=np.int64)
    component = components(len(names), a, b)
    groups = pl.DataFrame({"label": names, "component": component})
    return label.join(groups, on="label").join(rows.drop("cluster_id"), on="session_id", how="left")


def ranked_first(frame: pl.DataFrame, by: str) -> pl.DataFrame:
    """The best-ranked row per ``by``: highest quality, then earliest start, then smallest id (nulls last)."""
    return frame.sort(
        [by, "quality", "started_at", "session_id"], descending=[False, True, False, False], nulls_last=True
    ).unique(by, keep="first", maintain_order=True)


class _Signatures:
    """Exact keys and MinHash signatures of sessions: those known so far, the others read from the index once."""

    def __init__(self, con: duckdb.DuckDBPyConnection, known: pl.DataFrame) -> None:
        self._con = con
        #: session_id, exact_key, signature: one row per session
        self.known = known

    def of(self, ids: pl.Series, where: pl.DataFrame) -> pl.DataFrame:
        """Every known row, after reading those of ``ids`` not known yet (their starts are in ``where``)."""
        wanted = ids.unique()
        missing = wanted.filter(~wanted.is_in(self.known["session_id"].implode()))
        if missing.len():
            times = where.filter(pl.col("session_id").is_in(missing.implode()))["started_at"]
            days = times.dt.date().unique().to_list()
            found = lookup(self._con, "session_id, exact_key, signature", "session_index", missing, days, starts=times)
            self.known = pl.concat([self.known, found.select(self.known.columns).cast(self.known.schema)])
        return self.known


def _similarity(left: pl.Series, right: pl.Series, num_perm: int) -> np.ndarray:
    """Estimated Jaccard similarity of each pair of signatures: the share of their MinHash values that agree."""
    if left.len() == 0:
        return np.empty(0)
    return (signatures_of(left, num_perm) == signatures_of(right, num_perm)).mean(axis=1)


def _probe(
    con: duckdb.DuckDBPyConnection, fresh: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """The fresh sessions' candidate links: to the heads of the buckets they are in, and to older exact twins.

    Returns:
        (links: a (fresh), b (a bucket's head), unconfirmed; twins: a (fresh), b (same exact key);
        positions: session_id, started_at of the sessions found), or None when a fresh session heads
        a bucket that holds older sessions.
    """
    fresh_bands = band_rows(fresh).join(fresh.select("session_key", "session_id"), on="session_key")
    con.register("__keys", fresh_bands.select("band_key").unique().to_arrow())
    try:
        buckets = _bucket_heads(con)
        candidates = _candidates(con, fresh, buckets)
    finally:
        for name in ("__keys", "__heads", "__exact", "__fresh"):
            con.unregister(name)
    candidates = candidates.with_columns(pl.col("started_at").cast(_UTC)).unique("session_id")
    return _links(fresh, fresh_bands, buckets, candidates)


def _bucket_heads(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """The fresh sessions' buckets (``__keys``) of more than one session: band_key, n, head_key (the earliest)."""
    # Buckets of one (most keys of most sessions: only their own row) link nothing; of the others only
    # the head -- the earliest session -- is wanted (two integer columns of every band_keys row are what
    # a run reads in proportion to history). With two earliest at one moment, or no start at all, the
    # head is the smallest id of them: those buckets are read whole.
    buckets = con.sql(
        "SELECT band_key, count(*) AS n, arg_min(session_key, started_at) AS head_key, "
        "min_by(started_at, started_at, 2) AS earliest "
        "FROM band_keys WHERE band_key IN (SELECT band_key FROM __keys) GROUP BY band_key HAVING count(*) > 1"
    ).pl()
    unsure = buckets.filter(
        pl.col("head_key").is_null()
        | (pl.col("earliest").list.get(0) == pl.col("earliest").list.get(1, null_on_oob=True))
    )
    if unsure.height:
        con.register("__unsure", unsure.select("band_key").to_arrow())
        members = con.sql(
            "SELECT b.band_key, b.session_key, i.session_id, b.started_at FROM band_keys b "
            "JOIN session_index i USING (session_key) WHERE b.band_key IN (SELECT band_key FROM __unsure)"
        ).pl()
        con.unregister("__unsure")
        firsts = (
            members.sort("started_at", "session_id", nulls_last=True)
            .group_by("band_key", maintain_order=True)
            .agg(pl.col("session_key").first().alias("first_key"))
        )
        buckets = (
            buckets.join(firsts, on="band_key", how="left")
            .with_columns(pl.coalesce("first_key", "head_key").alias("head_key"))
            .drop("first_key")
        )
    return buckets


def _candidates(con: duckdb.DuckDBPyConnection, fresh: pl.DataFrame, buckets: pl.DataFrame) -> pl.DataFrame:
    """The buckets' heads, the fresh sessions' older exact twins and the fresh sessions themselves.

    Registers ``__heads``, ``__exact`` and ``__fresh`` on ``con`` (the caller unregisters them).
    """
    # the heads, and the older exact twins of the fresh sessions (twins share every band: found by their
    # key, whichever session heads their buckets)
    con.register("__heads", buckets.select(pl.col("head_key").alias("session_key")).unique().to_arrow())
    con.register("__exact", fresh.select("exact_key").unique().to_arrow())
    con.register("__fresh", fresh.select("session_key").to_arrow())
    columns = "session_id, session_key, exact_key, started_at::TIMESTAMPTZ AS started_at, day"
    return pl.concat(
        [
            con.sql(f"SELECT {columns} FROM session_index WHERE session_key IN (SELECT session_key FROM __heads)").pl(),
            con.sql(
                f"SELECT {columns} FROM session_index WHERE exact_key IN (SELECT exact_key FROM __exact) "
                "AND session_key NOT IN (SELECT session_key FROM __fresh)"
            ).pl(),
            fresh.select(
                "session_id",
                "session_key",
                "exact_key",
                pl.col("started_at").cast(_UTC),
                pl.col("day").cast(pl.Date),
            ),
        ],
        how="vertical_relaxed",
    )


def _links(
    fresh: pl.DataFrame, fresh_bands: pl.DataFrame, buckets: pl.DataFrame, candidates: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame] | None:
    """Links to the heads and twins, from the candidates (None: a fresh session heads a bucket of older ones)."""
    per_key = fresh_bands.group_by("band_key").len("mine")
    heads = (
        buckets.join(per_key, on="band_key")
        .join(
            candidates.select(pl.col("session_key").alias("head_key"), pl.col("session_id").alias("head")),
            on="head_key",
        )
        .with_columns(pl.col("head_key").is_in(fresh["session_key"].implode()).alias("head_fresh"))
    )
    if heads.filter(pl.col("head_fresh") & (pl.col("n") > pl.col("mine"))).height:
        return None
    links = (
        fresh_bands.join(heads.select("band_key", "head"), on="band_key")
        .filter(pl.col("session_id") != pl.col("head"))
        .select(pl.col("session_id").alias("a"), pl.col("head").alias("b"))
        .unique()
    )
    twins = (
        fresh.select(pl.col("session_id").alias("a"), "exact_key")
        .join(candidates.select(pl.col("session_id").alias("b"), "exact_key"), on="exact_key")
        .filter(pl.col("a") != pl.col("b"))
        .select("a", "b")
    )
    return links, twins, candidates.select("session_id", "started_at")


def _old_clusters(con: duckdb.DuckDBPyConnection, involved: pl.Series) -> pl.DataFrame:
    """The ``duplicates`` rows of every old cluster one of ``involved`` is in, whole, with their keys and signatures.

    ``duplicates`` holds only members of clusters, with their signatures: a member's is not read from
    the index, wherever in history it is.
    """
    con.register("__involved", pa.table({"session_id": involved.to_arrow()}))
    try:
        rows = con.sql(
            """
            SELECT session_id, cluster_id, is_representative, similarity, method,
                   started_at::TIMESTAMPTZ AS started_at, exact_key, signature
            FROM duplicates WHERE cluster_id IN (
                SELECT DISTINCT cluster_id FROM duplicates WHERE session_id IN (SELECT session_id FROM __involved)
            )
            """
        ).pl()
    finally:
        con.unregister("__involved")
    return rows.with_columns(pl.col("started_at").cast(_UTC))


def _representatives(
    con: duckdb.DuckDBPyConnection,
    members: pl.DataFrame,
    facts: pl.DataFrame,
    scores: pl.DataFrame,
    config: QualityConfig,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Each component's representative (``rep``), and the ``scores`` rows of outside members whose role can change.

    Who can represent a component: its old representatives, sessions new to a cluster, and rescored
    ones (``scores``: this run's quality); an old representative rescored worse lets any member take over.
    """
    here = facts["session_id"].implode()
    base = exportable_base(config)
    table_columns = f"session_id, quality, started_at, exportable AS _old, {base} AS exportable_base"
    contenders = members.filter(pl.col("is_representative").fill_null(True) | pl.col("session_id").is_in(here))

    def stored(ids: pl.Series, where: pl.DataFrame) -> pl.DataFrame:
        times = where.filter(pl.col("session_id").is_in(ids.implode()))["started_at"]
        found = lookup(con, table_columns, "scores", ids, times.dt.date().unique().to_list(), starts=times)
        return found.cast({"quality": pl.Float64, "started_at": _UTC})

    table = stored(contenders["session_id"], members)
    now = scores.select("session_id", pl.col("quality").cast(pl.Float64), pl.col("started_at").cast(_UTC))
    worse = (
        contenders.filter(pl.col("is_representative").fill_null(False))
        .join(table.select("session_id", pl.col("quality").alias("was")), on="session_id")
        .join(now.select("session_id", "quality"), on="session_id")
        .filter(pl.col("quality").is_null() & pl.col("was").is_not_null() | (pl.col("quality") < pl.col("was")))
    )
    if worse.height:
        rest = members.filter(
            pl.col("component").is_in(worse["component"].implode())
            & ~pl.col("session_id").is_in(contenders["session_id"].implode())
            & ~pl.col("session_id").is_in(here)
        )
        table = pl.concat([table, stored(rest["session_id"], members)])
        contenders = pl.concat([contenders, rest])
    outside = table.filter(~pl.col("session_id").is_in(here))
    ranking = pl.concat([now, outside.select("session_id", "quality", "started_at")])
    candidates_ranked = contenders.select("session_id", "component").join(ranking, on="session_id", how="left")
    reps = ranked_first(candidates_ranked, "component").select("component", pl.col("session_id").alias("rep"))
    # members outside ``facts`` whose exportability can change: those that were or now are a representative
    roles = outside.filter(pl.col("session_id").is_in(contenders["session_id"].implode()))
    return members.join(reps, on="component"), roles


def _cluster_rows(members: pl.DataFrame, signatures: _Signatures, config: QualityConfig) -> pl.DataFrame:
    """The ``duplicates`` rows of the components' members (:data:`quality.dedup.DUPLICATES_SCHEMA`).

    A row stays as it was where its representative did (same similarity and method, no signature
    changed); the others are measured against their new representative.
    """
    keep = pl.col("is_representative").is_not_null() & (pl.col("rep") == pl.col("label"))
    stay = members.filter(keep)
    redo = members.filter(~keep)
    sigs = signatures.of(pl.concat([redo["session_id"], redo["rep"]]), members)
    redo_left = redo.join(sigs, on="session_id", how="left", maintain_order="left")
    redo_right = redo.select("rep").join(sigs, left_on="rep", right_on="session_id", how="left", maintain_order="left")
    similarity = _similarity(redo_left["signature"], redo_right["signature"], config.num_perm)
    redone = redo_left.select(
        "session_id",
        pl.col("rep").alias("cluster_id"),
        (pl.col("session_id") == pl.col("rep")).alias("is_representative"),
        pl.Series("similarity", similarity, dtype=pl.Float64).round(4),
        pl.when(redo_left["exact_key"] == redo_right["exact_key"])
        .then(pl.lit("exact"))
        .otherwise(pl.lit("minhash"))
        .alias("method"),
    )
    kept = stay.select(
        "session_id",
        pl.col("rep").alias("cluster_id"),
        (pl.col("session_id") == pl.col("rep")).alias("is_representative"),
        "similarity",
        "method",
    )
    return pl.concat([kept, redone]).cast(DUPLICATES_SCHEMA).sort("cluster_id", "session_id")
