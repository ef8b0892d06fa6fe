"""Quality layer: scores, cheat flags, behaviour anomalies, failure causes, deduplication.

Pure functions over polars frames; Dagster and the CLI only wire them
(``pipelines/score/``, ``dagster_project/defs/quality.py``).
"""

#: Bumped whenever a rule, weight default or feature changes, so stored rows can be recomputed.
SCORER_VERSION = "quality-3.4.0"
