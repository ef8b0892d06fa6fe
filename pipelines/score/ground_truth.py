"""``trajlake quality evaluate``: the stored flags and the deduplication against ground truth.

Cheat labels come from a fleet run's JSONL (``session_id``, ``cheat_type``); near-duplicate
ground truth is made here by injecting perturbed copies of stored trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipelines.errors import LabelsError
from pipelines.score.inputs import load_inputs
from pipelines.score.record import quality_config
from quality.detector_metrics import Metric, evaluate_cheats, evaluate_dedup
from warehouse.lakehouse import Lakehouse
from warehouse.sql import format_rows


@dataclass
class EvaluationReport:
    """Metrics per detector."""

    metrics: list[Metric]
    labelled: int
    matched: int

    def table(self) -> str:
        """Aligned text table plus a line on label coverage."""
        rows = [m.as_dict() for m in self.metrics]
        columns = list(rows[0]) if rows else []
        text = format_rows(columns, [tuple(r.values()) for r in rows], "table")
        return text + f"\nlabels: {self.labelled} sessions, {self.matched} of them scored"


def read_labels(path: Path) -> pl.DataFrame:
    """Fleet labels (``session_id``, ``cheat_type``).

    Raises:
        LabelsError: the file is missing or not JSON lines with those keys.
    """
    if not path.is_file():
        raise LabelsError(f"labels file {path} not found")
    try:
        labels = pl.read_ndjson(path, infer_schema_length=None)
    except Exception as exc:  # polars raises several error types for bad JSON
        raise LabelsError(f"labels file {path}: not JSON lines: {exc}") from exc
    if "session_id" not in labels.columns:
        raise LabelsError(f"labels file {path}: no session_id field")
    if "cheat_type" not in labels.columns:
        labels = labels.with_columns(pl.lit(None, pl.Utf8).alias("cheat_type"))
    return labels.select("session_id", pl.col("cheat_type").cast(pl.Utf8))


def evaluate_quality(lake: Lakehouse, labels_path: Path, inject: int = 500, seed: int = 0) -> EvaluationReport:
    """Compare stored flags with labels, and measure dedup on ``inject`` injected near-duplicates.

    Raises:
        LabelsError: unreadable labels, or none of the labelled sessions has been scored.
    """
    labels = read_labels(Path(labels_path))
    con = lake.views()
    try:
        flags = pl.DataFrame(con.sql("SELECT session_id, flag, flag_class FROM flags").to_arrow_table())
        scored = pl.DataFrame(con.sql("SELECT session_id FROM scores").to_arrow_table())
    finally:
        con.close()
    matched = labels.join(scored, on="session_id", how="semi")
    if matched.is_empty():
        raise LabelsError(
            f"none of the {labels.height} labelled sessions in {labels_path} is scored; run ingest, assemble, score"
        )
    metrics = evaluate_cheats(flags, matched)
    if inject > 0:
        inputs = load_inputs(lake)
        metrics.append(
            evaluate_dedup(inputs["trajectories"], inputs["steps"], inject, seed, quality_config(lake.settings))
        )
    return EvaluationReport(metrics, labels.height, matched.height)
