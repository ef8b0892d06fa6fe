"""Incremental scoring equals a full recomputation, and a run's work follows what changed.

The history arrives shuffled over several days: sessions land out of day order, some of them in two
parts (their tail later: the trajectory is reassembled and changes), and some are copies of earlier
sessions made days later (duplicate clusters whose representative changes). After every batch,
``trajlake score`` runs incrementally; at the end its tables must equal both a forced full rescore
and :func:`quality.scoring.score_sessions` over all sessions at once.
"""

from __future__ import annotations

import copy
import random
import uuid
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest

from common.settings import Settings
from pipelines.assemble import assemble
from pipelines.score import load_inputs, quality_config, score_all
from producers.session_generator import synthetic_sessions
from quality.scoring import score_sessions
from tests.helpers import BASE_US, DAY_US, write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.sql import open_views

DAYS = 3
PER_DAY = 64
#: profiles (origin/task family, day) hold 1 to 5 sessions here: at 3 z-scores are live in some, and
#: sessions arriving late move groups across it
MIN_PROFILE = 3
TABLE_QUERIES = {
    "scores": "SELECT * EXCLUDE (scored_at) FROM scores ORDER BY session_id",
    "flags": "SELECT * EXCLUDE (scored_at) FROM flags ORDER BY session_id, flag, evidence",
    "duplicates": "SELECT * EXCLUDE (scored_at) FROM duplicates ORDER BY session_id",
    "profiles": "SELECT * EXCLUDE (scored_at, index_files) FROM profiles ORDER BY day, profile",
}


def _copy_of(session: list[dict[str, Any]], shift_us: int, rng: random.Random) -> list[dict[str, Any]]:
    """The same trajectory as another session, ``shift_us`` later (an exact duplicate document)."""
    new_id = uuid.UUID(int=rng.getrandbits(128)).hex
    events = copy.deepcopy(session)
    for event in events:
        event["session_id"] = new_id
        event["event_id"] = uuid.UUID(int=rng.getrandbits(128)).hex
        event["ts"] += shift_us
    return events


def _history(seed: int = 3) -> list[list[dict[str, Any]]]:
    """Batches of events that make every part of incremental scoring matter.

    1. days 0 and 1, shuffled, without a few day-0 sessions and with some sessions cut in half;
    2. day 2, with copies of day-0/1 sessions made on day 2 (clusters spanning days);
    3. the held-back day-0 sessions (late into an old day: its z-score groups and the novelty of
       later sessions change, and so may the representatives of clusters whose other members are
       on day 2, which nothing in this batch resembles);
    4. the second halves of the cut sessions (reassembled: their facts change).
    """
    rng = random.Random(seed)
    days = [
        [list(s) for s in synthetic_sessions(PER_DAY, seed=day, start_us=BASE_US + day * DAY_US + 3_600_000_000)]
        for day in range(DAYS)
    ]
    early = days[0] + days[1]
    rng.shuffle(early)
    held = days[0][-10:]
    for session in held:  # tasks seen on no other day: their arrival changes day 0 alone
        for event in session:
            if event.get("task_id"):
                event["task_id"] = "late-" + event["task_id"]
    ended = [s for s in early if s[-1]["event_type"] == "session_end" and s not in held]
    copies = []
    for original in rng.sample(ended, 12):
        day = (original[0]["ts"] - BASE_US) // DAY_US
        copies.append(_copy_of(original, int(2 - day) * DAY_US, rng))
    batches: list[list[dict[str, Any]]] = [[], [], [], []]
    for session in early:
        if session in held:
            continue
        if rng.random() < 0.2:
            cut = len(session) // 2
            batches[0] += session[:cut]
            batches[3] += session[cut:]
        else:
            batches[0] += session
    late_day = days[2] + copies
    rng.shuffle(late_day)
    batches[1] = [e for s in late_day for e in s]
    batches[2] = [e for s in held for e in s]
    return batches


def _tables(settings: Settings) -> dict[str, pl.DataFrame]:
    con = open_views(settings)
    try:
        return {name: con.sql(query).pl() for name, query in TABLE_QUERIES.items()}
    finally:
        con.close()


def _assert_equal(left: dict[str, pl.DataFrame], right: dict[str, pl.DataFrame], what: str) -> None:
    for name in TABLE_QUERIES:
        a, b = left[name], right[name]
        assert a.height == b.height, (what, name, a.height, b.height)
        assert a.equals(b), (what, name, a.join(b, on=a.columns, how="anti").head(5))


def _assert_matches_pure(settings: Settings, stored: dict[str, pl.DataFrame], what: str) -> None:
    """The stored tables equal :func:`score_sessions` over every session at once."""
    result = score_sessions(**load_inputs(Lakehouse.open(settings)), config=quality_config(settings))
    pure = result.scores.drop("scorer_version", "config_digest")
    scores = stored["scores"].drop("scorer_version", "config_digest").select(pure.columns).cast(pure.schema)
    assert scores.sort("session_id").equals(pure.sort("session_id")), (
        what,
        scores.join(pure, on=pure.columns, how="anti"),
    )
    dup_cols = ["session_id", "cluster_id", "is_representative", "similarity", "method"]
    dups, expected = stored["duplicates"].select(dup_cols).sort("session_id"), result.duplicates.select(dup_cols)
    assert dups.equals(expected.sort("session_id")), (what, dups, expected)
    flag_cols = ["session_id", "flag", "flag_class", "severity", "evidence", "score", "confirmed"]
    flags = stored["flags"].select(flag_cols).sort(flag_cols)
    assert flags.equals(result.flags.select(flag_cols).sort(flag_cols)), what


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("chunk", [100_000, 40], ids=["one-chunk", "many-chunks"])
def test_incremental_runs_equal_a_full_recomputation_on_a_shuffled_history(settings: Settings, chunk: int) -> None:
    # one machine: the watermark is exact; ``many-chunks``: every run's sessions span several chunks
    settings = settings.model_copy(
        update={
            "score_watermark_lag_s": 0.0,
            "score_chunk_sessions": chunk,
            "quality_min_profile_sessions": MIN_PROFILE,
        }
    )
    runs = []
    for i, batch in enumerate(_history()):
        write_raw(settings, batch)
        assemble(Lakehouse.open(settings))
        runs.append(score_all(Lakehouse.open(settings)))
        _assert_matches_pure(settings, _tables(settings), f"after batch {i}")
    assert runs[0].mode == "full" and all(r.mode == "incremental" for r in runs[1:]), [r.mode for r in runs]
    # later runs recompute the facts of the sessions they got, not the history
    assert all(0 < r.changed_sessions < r.sessions for r in runs[1:]), [(r.changed_sessions, r.sessions) for r in runs]
    incremental = _tables(settings)
    scores = incremental["scores"]
    # the history exercises what incrementality must get right
    assert incremental["duplicates"].filter(~pl.col("is_representative")).height >= 10
    assert scores.filter(pl.col("novelty") < 1.0).height > 0 and scores.filter(pl.col("steps_z") != 0).height > 0
    assert incremental["profiles"]["day"].n_unique() >= DAYS

    full = score_all(Lakehouse.open(settings), force=True)
    assert full.mode == "full" and full.changed_sessions == scores.height
    _assert_equal(incremental, _tables(settings), "incremental vs forced full rescore")


@pytest.mark.slow
def test_a_run_without_new_trajectories_is_skipped_and_a_new_day_touches_only_that_day(settings: Settings) -> None:
    settings = settings.model_copy(update={"score_watermark_lag_s": 0.0})
    first = [e for s in synthetic_sessions(30, seed=1, start_us=BASE_US) for e in s]
    write_raw(settings, first)
    assemble(Lakehouse.open(settings))
    assert score_all(Lakehouse.open(settings)).mode == "full"
    assert score_all(Lakehouse.open(settings)).skipped
    later = [e for s in synthetic_sessions(25, seed=2, start_us=BASE_US + 5 * DAY_US) for e in s]
    write_raw(settings, later)
    assemble(Lakehouse.open(settings))
    run = score_all(Lakehouse.open(settings))
    assert run.mode == "incremental" and run.changed_sessions == 25 and run.rescored_sessions == 25
    assert run.affected_days == 1 and run.sessions == 55


def test_the_index_table_holds_every_fact_and_the_profiles_every_feature() -> None:
    from quality.anomalies import FEATURES
    from quality.facts import FACTS_SCHEMA
    from warehouse.tables import PROFILES, SESSION_INDEX

    index = SESSION_INDEX.arrow_schema()
    assert set(FACTS_SCHEMA) <= set(index.names)
    profile_columns = set(PROFILES.arrow_schema().names)
    assert {f"{name}_{stat}" for name in FEATURES for stat in ("p50", "p90")} <= profile_columns


@pytest.mark.slow
def test_new_sessions_of_a_day_with_a_complete_baseline_rescore_only_themselves(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipelines.score.baselines as baselines
    from pipelines.score import ScoreStats

    # a profile is complete at 20 sessions here (the default, 50, would need a day 0 of ~150 sessions per family)
    settings = settings.model_copy(update={"score_watermark_lag_s": 0.0, "quality_min_profile_sessions": 20})
    hour = 3_600_000_000
    profiled: list[set[object]] = []  # the days whose profiles each run computed from the index
    real = baselines.profiles

    def counted(members: pl.DataFrame) -> pl.DataFrame:
        profiled[-1].update(members["day"])
        return real(members)

    monkeypatch.setattr(baselines, "profiles", counted)

    def batch(n: int, seed: int, start: int) -> ScoreStats:
        # the generator names 36 tasks; here each task type is one family (three profiles of ~40 sessions a day)
        events = [e for s in synthetic_sessions(n, seed=seed, start_us=start) for e in s]
        for event in events:
            event["extra"] = {**event.get("extra", {}), "task_family": event["task_type"]}
        write_raw(settings, events)
        assemble(Lakehouse.open(settings))
        profiled.append(set())
        return score_all(Lakehouse.open(settings))

    for n, seed, start in ((120, 1, BASE_US), (30, 2, BASE_US + DAY_US), (10, 3, BASE_US + DAY_US + 6 * hour)):
        run = batch(n, seed, start)
    # day 0 (about 40 sessions per task type, over 20) is the baseline of day 1: the ten newest sessions of day 1
    # change no other session's z-score, and come after every other session of their task families
    assert run.mode == "incremental" and run.changed_sessions == 10 and run.rescored_sessions == 10
    assert run.sessions == 160
    _assert_matches_pure(settings, _tables(settings), "after the last batch")
    # the baseline day's stats are its profile rows, computed when day 0 last changed, not read again
    day0, day1 = (datetime.fromtimestamp(us / 1e6, UTC).date() for us in (BASE_US, BASE_US + DAY_US))
    assert profiled == [{day0}, {day1}, {day1}]
    # a late session of day 0 changes its index files: its profile (and every z-score against it) is redone
    run = batch(1, 4, BASE_US + 12 * hour)
    assert day0 in profiled[-1]
    _assert_matches_pure(settings, _tables(settings), "after a late session of the baseline day")


def _passing(events: list[dict[str, Any]], reward: float = 1.0) -> list[dict[str, Any]]:
    """``events`` with the evaluation passed and rewarded (the same trajectory, done right)."""
    out = copy.deepcopy(events)
    for event in out:
        if event["event_type"] == "evaluation":
            payload = event["payload"]
            payload.update(passed=True, reward=reward, tests_passed=payload["tests_total"])
        if event["event_type"] == "session_end":
            event["payload"]["reward"] = reward
    return out


def _score_files(settings: Settings) -> set[str]:
    from warehouse.catalog import open_catalog
    from warehouse.snapshots import current_files
    from warehouse.tables import SCORES, ensure_table

    return set(current_files(ensure_table(open_catalog(settings), settings, SCORES.name)).paths)


def _failed(sessions: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """The sessions of ``sessions`` that ended with a failed evaluation (a passing copy ranks above them)."""
    return [
        s
        for s in sessions
        if s[-1]["event_type"] == "session_end"
        and any(e["event_type"] == "evaluation" and not e["payload"]["passed"] for e in s)
    ]


@pytest.mark.slow
def test_a_better_copy_days_later_takes_over_and_the_old_representative_loses_exportability(
    settings: Settings,
) -> None:
    # every success is exportable unless a better duplicate shadows it
    settings = settings.model_copy(update={"score_watermark_lag_s": 0.0, "quality_min": 0.0})
    rng = random.Random(11)
    day0 = [list(s) for s in synthetic_sessions(70, seed=4, start_us=BASE_US + 3_600_000_000)]
    failed = _failed(day0)
    assert len(failed) >= 3
    # three that passed with a partial reward: successes, which a copy with the full reward later outranks
    originals = [_passing(s, reward=0.5) for s in failed[:3]]
    day0 = [originals[failed.index(s)] if s in failed[:3] else s for s in day0]
    write_raw(settings, [e for s in day0 for e in s])
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    before = _tables(settings)["scores"]
    ids = [s[0]["session_id"] for s in originals]
    assert before.filter(pl.col("session_id").is_in(ids))["exportable"].all()

    # two days later: the same trajectories, each passing; day 0 is not a baseline of day 2
    better = [_passing(_copy_of(s, 2 * DAY_US, rng)) for s in originals]
    write_raw(settings, [e for s in better for e in s])
    assemble(Lakehouse.open(settings))
    history = _score_files(settings)
    run = score_all(Lakehouse.open(settings))
    assert run.mode == "incremental" and run.rescored_sessions == len(better)  # day 0 is not rescored
    tables = _tables(settings)
    scores, dups = tables["scores"], tables["duplicates"]
    copies = [s[0]["session_id"] for s in better]
    reps = dups.filter(pl.col("is_representative"))["session_id"].to_list()
    assert set(copies) <= set(reps) and not set(ids) & set(reps)
    # the old representatives lost exportability although their day was not rescored, and no file of
    # that day was rewritten for it (the ``scores`` view applies ``duplicates``)
    assert not scores.filter(pl.col("session_id").is_in(ids))["exportable"].any()
    assert history <= _score_files(settings)
    assert scores.filter(pl.col("session_id").is_in(copies))["exportable"].all()
    _assert_matches_pure(settings, tables, "after the better copies")


@pytest.mark.slow
def test_clusters_grow_from_new_sessions_alone_and_a_better_later_member_takes_over(settings: Settings) -> None:
    settings = settings.model_copy(update={"score_watermark_lag_s": 0.0, "quality_min": 0.0})
    rng = random.Random(5)
    day0 = [list(s) for s in synthetic_sessions(70, seed=6, start_us=BASE_US + 3_600_000_000)]
    failed = _failed(day0)
    originals = sorted(failed, key=lambda s: -sum(e["event_type"] == "agent_action" for e in s))[:2]
    write_raw(settings, [e for s in day0 for e in s])
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    # day 1: a failing copy of each (two clusters of two), the first's last command changed (a near-duplicate);
    # day 2: a passing copy of the first, its first command changed, joins its cluster and takes it over
    later = [_copy_of(s, DAY_US, rng) for s in originals]
    [e for e in later[0] if e["event_type"] == "agent_action"][-1]["payload"]["command"] = "echo changed"
    best = _passing(_copy_of(originals[0], 2 * DAY_US, rng))
    [e for e in best if e["event_type"] == "agent_action"][0]["payload"]["command"] = "echo first"
    # last, late: a near-copy of the second that started before it (now the first of its buckets: the old
    # members link to it, not to each other, so their clusters are recomputed from every session around them)
    early = _copy_of(originals[1], -1_800_000_000, rng)
    [e for e in early if e["event_type"] == "agent_action"][-1]["payload"]["command"] = "echo early"
    runs = []
    for batch in (later, [best], [early]):
        write_raw(settings, [e for s in batch for e in s])
        assemble(Lakehouse.open(settings))
        runs.append(score_all(Lakehouse.open(settings)))
        _assert_matches_pure(settings, _tables(settings), f"after {len(runs)} batches of copies")
    # the first two runs recomputed no closed set of sessions: the clusters grew from the new sessions' links
    assert [r.closed_sets for r in runs] == [0, 0, 1], [r.closed_sets for r in runs]
    dups = _tables(settings)["duplicates"]
    assert early[0]["session_id"] in dups.filter(pl.col("cluster_id") != best[0]["session_id"])["session_id"]
    # every row carries its member's exact key and signature, as the index has them
    con = open_views(settings)
    try:
        stale = con.sql(
            "SELECT count(*) FROM duplicates d JOIN session_index i USING (session_id) "
            "WHERE d.signature IS DISTINCT FROM i.signature OR d.exact_key IS DISTINCT FROM i.exact_key"
        ).fetchall()[0][0]
    finally:
        con.close()
    assert stale == 0
    winner = best[0]["session_id"]
    cluster = dups.filter(pl.col("cluster_id") == winner)
    # every older member's row now names the new representative (their rows were rewritten, not kept)
    members = {originals[0][0]["session_id"], later[0][0]["session_id"], winner}
    assert set(cluster["session_id"]) == members, dups
    assert cluster.filter(pl.col("is_representative"))["session_id"].to_list() == [winner]
    # similarity to the new representative: the original and the first copy have rows unlike their old ones
    assert cluster.filter(pl.col("session_id") != winner)["method"].to_list() == ["minhash"] * 2, cluster
    assert dups["cluster_id"].n_unique() == 2


@pytest.mark.slow
def test_a_bucket_whose_earliest_sessions_started_together_is_headed_by_the_smallest_id(settings: Settings) -> None:
    """Copies started at the same moment as their original: their buckets' earliest sessions tie, so those
    buckets are read whole for the head (the smallest id of them); a later copy grows their cluster as a
    full recomputation has it."""
    settings = settings.model_copy(update={"score_watermark_lag_s": 0.0})
    rng = random.Random(11)
    day0 = [list(s) for s in synthetic_sessions(40, seed=12, start_us=BASE_US + 3_600_000_000)]
    original = max(day0, key=lambda s: sum(e["event_type"] == "agent_action" for e in s))
    together = [_copy_of(original, 0, rng) for _ in range(3)]  # same start, other ids
    for i, copy_ in enumerate(together):
        [e for e in copy_ if e["event_type"] == "agent_action"][-1]["payload"]["command"] = f"echo twin {i}"
    later = _copy_of(original, DAY_US, rng)
    [e for e in later if e["event_type"] == "agent_action"][0]["payload"]["command"] = "echo later"
    runs = []
    for batch in (day0 + together, [later]):
        write_raw(settings, [e for s in batch for e in s])
        assemble(Lakehouse.open(settings))
        runs.append(score_all(Lakehouse.open(settings)))
        _assert_matches_pure(settings, _tables(settings), f"after {len(runs)} batches")
    assert runs[-1].closed_sets == 0
    dups = _tables(settings)["duplicates"]
    assert later[0]["session_id"] in dups["session_id"].to_list()


@pytest.mark.slow
@pytest.mark.parametrize("by_id", [10_000, 0], ids=["stale-by-id", "stale-days-whole"])
def test_a_full_rescore_keeps_current_facts_and_leaves_no_stale_row(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, by_id: int
) -> None:
    import pipelines.score.facts
    from common.settings import load_settings
    from pipelines.score import index_days

    # 0: a day with any stale session goes whole, its current facts recomputed with it
    monkeypatch.setattr(pipelines.score.facts, "BY_ID_PER_DAY", by_id)

    settings = settings.model_copy(update={"score_watermark_lag_s": 0.0})
    sessions = [list(s) for d in range(DAYS) for s in synthetic_sessions(30, seed=d, start_us=BASE_US + d * DAY_US)]
    write_raw(settings, [e for s in sessions for e in s])
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    # facts depend on the LSH bands: after the change, only days 0 and 1 are indexed again (as Dagster
    # partitions would), and then one of day 1's sessions changes (a late event): its facts are stale
    monkeypatch.setenv("TRAJLAKE_DEDUP_ROWS", "7")
    changed = load_settings().model_copy(update={"score_watermark_lag_s": 0.0})
    day0 = (BASE_US // DAY_US) * DAY_US
    from datetime import UTC, datetime

    index_days(Lakehouse.open(changed), [datetime.fromtimestamp((day0 + d * DAY_US) / 1e6, UTC).date() for d in (0, 1)])
    late = copy.deepcopy(next(s for s in sessions[30:60] if s[-1]["event_type"] == "session_end"))
    extra = {**late[-2], "event_id": uuid.uuid4().hex, "seq": max(e["seq"] for e in late) + 1}
    write_raw(changed, [extra])
    assemble(Lakehouse.open(changed))
    run = score_all(Lakehouse.open(changed))
    # day 2 and the changed session (or its whole day)
    assert run.mode == "full" and run.changed_sessions == (30 + 1 if by_id else 60)
    stored = _tables(changed)
    con = open_views(changed)
    try:
        index = con.sql("SELECT session_id, count(*) AS n FROM session_index GROUP BY ALL").pl()
        bands = con.sql("SELECT count(*) FROM band_keys").fetchall()[0][0]
        width = con.sql("SELECT max(len(bands)) FROM session_index").fetchall()[0][0]
    finally:
        con.close()
    assert index.height == DAYS * 30 and index["n"].max() == 1  # one row per session, none left behind
    assert bands == DAYS * 30 * width
    _assert_matches_pure(changed, stored, "after a full rescore that kept current facts")
    score_all(Lakehouse.open(changed), force=True)
    _assert_equal(stored, _tables(changed), "kept facts vs every fact recomputed")
