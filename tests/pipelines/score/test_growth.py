"""Cluster growth's pure parts: merging old clusters by new links, and choosing a representative."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
from hypothesis import assume, given
from hypothesis import strategies as st

from pipelines.score.growth import merged_components, ranked_first


@st.composite
def clusters_and_links(draw: st.DrawFn) -> tuple[list[list[str]], list[str], list[tuple[str, str]]]:
    """Old clusters (disjoint, of two or more sessions), loose sessions, and links among all of them."""
    sizes = draw(st.lists(st.integers(2, 5), max_size=5))
    clusters, n = [], 0
    for size in sizes:
        clusters.append([f"s{n + i:03d}" for i in range(size)])
        n += size
    loose = [f"s{n + i:03d}" for i in range(draw(st.integers(0, 6)))]
    everyone = [s for c in clusters for s in c] + loose
    links: list[tuple[str, str]] = []
    if len(everyone) >= 2:
        pairs = st.tuples(st.sampled_from(everyone), st.sampled_from(everyone)).filter(lambda p: p[0] != p[1])
        links = draw(st.lists(pairs, max_size=12))
    return clusters, loose, links


def _reference(clusters: list[list[str]], links: list[tuple[str, str]]) -> dict[str, str]:
    """Union-find over the links and the old clusters' memberships: session → root."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for members in clusters:
        for member in members:
            parent[find(member)] = find(members[0])
    for a, b in links:
        parent[find(a)] = find(b)
    return {s: find(s) for s in parent}


@given(clusters_and_links())
def test_sessions_share_a_component_exactly_when_links_or_old_clusters_join_them(
    drawn: tuple[list[list[str]], list[str], list[tuple[str, str]]],
) -> None:
    clusters, _, links = drawn
    assume(clusters or links)
    # each old cluster is named after one of its members (its representative), whichever
    named = [(members, members[len(members) // 2]) for members in clusters]
    rows = pl.DataFrame(
        {
            "session_id": [s for members, _ in named for s in members],
            "cluster_id": [rep for members, rep in named for _ in members],
            "is_representative": [s == rep for members, rep in named for s in members],
        },
        schema={"session_id": pl.Utf8, "cluster_id": pl.Utf8, "is_representative": pl.Boolean},
    )
    edges = pl.DataFrame(links, schema={"a": pl.Utf8, "b": pl.Utf8}, orient="row")
    merged = merged_components(rows, edges)
    root = _reference(clusters, links)
    assert sorted(merged["session_id"].to_list()) == sorted(root)  # every member and every linked session, once
    component = dict(zip(merged["session_id"].to_list(), merged["component"].to_list(), strict=True))
    for a in root:
        for b in root:
            assert (component[a] == component[b]) == (root[a] == root[b]), (a, b)
    # a member keeps its old cluster as label and its row's columns; a session of no cluster is its own label
    cluster_of = {s: rep for members, rep in named for s in members}
    for row in merged.iter_rows(named=True):
        assert row["label"] == cluster_of.get(row["session_id"], row["session_id"])
        if row["session_id"] in cluster_of:
            assert row["is_representative"] == (row["session_id"] == cluster_of[row["session_id"]])
        else:
            assert row["is_representative"] is None


base = datetime(2026, 1, 1, tzinfo=UTC)
candidates = st.lists(
    st.tuples(
        st.sampled_from(["g1", "g2", "g3"]),
        st.none() | st.sampled_from([0.2, 0.5, 0.9]),
        st.none() | st.integers(0, 3).map(lambda h: base + timedelta(hours=h)),
    ),
    min_size=1,
    max_size=20,
)


@given(candidates)
def test_the_representative_is_the_best_then_earliest_then_smallest_id(rows: list[tuple[str, object, object]]) -> None:
    frame = pl.DataFrame(
        {
            "component": [g for g, _, _ in rows],
            "quality": pl.Series([q for _, q, _ in rows], dtype=pl.Float64),
            "started_at": pl.Series([t for _, _, t in rows], dtype=pl.Datetime("us", "UTC")),
            "session_id": [f"s{i:02d}" for i in range(len(rows))],
        }
    )
    chosen = dict(ranked_first(frame, "component").select("component", "session_id").iter_rows())
    for group in set(frame["component"]):
        members = frame.filter(pl.col("component") == group).iter_rows(named=True)
        best = min(
            members,
            key=lambda r: (
                r["quality"] is None,
                -(r["quality"] or 0.0),
                r["started_at"] is None,
                r["started_at"] or base,
                r["session_id"],
            ),
        )
        assert chosen[group] == best["session_id"]
