"""``trajlake score``: trajectories, steps, events → the scores, flags, duplicates, profiles, session_index tables.

Incremental: a run scores only what changed since the run before it, so its cost follows the new
work, not the history.

1. **Changed sessions**: trajectories assembled after the last run's watermark (the latest
   ``assembled_at`` it covered, kept in the ``scores`` table properties, minus a lag for clocks of
   other machines). Their inputs are read from the views restricted to them, and their own facts
   (:mod:`quality.facts`: detector flags, failure cause, features, MinHash signature, LSH band
   keys) replace their rows of the ``session_index`` table.
2. **Affected days**: the days of the changed sessions, and of the sessions whose novelty window
   (the ``novelty_max_history`` earlier trajectories of the family) a changed session entered or
   left. Level 2 (:mod:`quality.combine`) is recomputed for every session of those days from the
   index alone: z-scores within profile (origin, task family) and day, novelty, quality.
3. **Clusters**: the changed sessions' band keys are joined against the ``band_keys`` table (one
   integer row per session and band) in DuckDB. Where new sessions only add links, the clusters
   grow from those links alone; otherwise the candidates, the affected days' sessions and every old
   cluster any of them is in form a closed set, whose clusters and representatives are recomputed
   (a new better trajectory becomes the representative, the old one is marked a duplicate). The
   exportability of the touched clusters' members is updated.

Every lookup is bounded by what a run can touch: rows of known sessions are read only on their
days (the tables are day-partitioned: DuckDB skips other days' files by their statistics), a
session's steps and events only between its first and last event, a family's earlier sessions by
looking back from the latest one an hour, a day, … (:func:`~pipelines.score.context.novelty_context`).

Every table is updated by session (a delete restricted to the rows' day partitions, and an
append), never rewritten wholesale; the ``scores`` commit, last, records the watermark, the
trajectories snapshot and the configuration digest. A crash before it leaves the watermark where
it was: the next run recomputes the same sessions (every step is idempotent). Days are processed
in chronological chunks of about ``score_chunk_sessions`` sessions, so memory is bounded whatever
the size of a run. A changed scorer version or configuration (or ``force``) rescores everything:
the facts to recompute are deleted first, in one pass per table, then the same steps run over
every day, chunk by chunk (level 1 in any order, or in parallel as Dagster partitions,
:func:`index_days`), with the duplicate clusters rebuilt from empty. The result equals
:func:`quality.scoring.score_sessions` over all sessions at once (tested on a shuffled history).

One module per stage, in the order a run calls them (:mod:`~pipelines.score.run` orders them):
:mod:`~pipelines.score.scope` (skipped, incremental or full; the changed sessions),
:mod:`~pipelines.score.inputs` and :mod:`~pipelines.score.facts` (level 1),
:mod:`~pipelines.score.affected` (level 2's targets), :mod:`~pipelines.score.context` (a chunk's
facts and novelty context), :mod:`~pipelines.score.baselines` (z-score baselines and profiles),
:mod:`~pipelines.score.clusters` and :mod:`~pipelines.score.growth` (duplicate clusters),
:mod:`~pipelines.score.write` (level 2's rows), :mod:`~pipelines.score.record` (what a run records)
and :mod:`~pipelines.score.summary`. Below them, shared by the stages:
:mod:`~pipelines.score.store` (lookups and by-session replaces), :mod:`~pipelines.score.predicates`
(day and time predicates) and :mod:`~pipelines.score.stats`.
"""

from __future__ import annotations

from pipelines.score.inputs import load_inputs
from pipelines.score.record import (
    SCORED_CONFIG,
    SCORED_DIGEST,
    SCORED_SNAPSHOT,
    SCORED_VERSION,
    SCORED_WATERMARK,
    ScoreOptions,
    quality_config,
    scoring_manifest,
)
from pipelines.score.run import index_days, score_all
from pipelines.score.stats import ScoreStats

__all__ = [
    "SCORED_CONFIG",
    "SCORED_DIGEST",
    "SCORED_SNAPSHOT",
    "SCORED_VERSION",
    "SCORED_WATERMARK",
    "ScoreOptions",
    "ScoreStats",
    "index_days",
    "load_inputs",
    "quality_config",
    "score_all",
    "scoring_manifest",
]
