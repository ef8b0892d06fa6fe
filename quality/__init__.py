"""Quality layer: scores, cheat flags, behaviour anomalies, failure causes, deduplication.

Pure functions over polars frames; Dagster and the CLI only wire them
(``pipelines/score/``, ``dagster_project/defs/quality.py``).
"""

from quality.config import SCORER_VERSION

__all__ = ["SCORER_VERSION"]
