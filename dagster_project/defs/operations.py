"""Operations: every failed run is recorded with its cause, where ``trajlake sql`` and a person can see it.

The record (one JSON line per failed run under ``$TRAJLAKE_HOME/ops/run_failures.jsonl``) names
the job, the failed steps and each step's error class and message, and whether the failure was
transient (retrying may help) — the same marker the CLI's exit code and the step retries use.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

from dagster import DefaultSensorStatus, Definitions, RunFailureSensorContext, run_failure_sensor

from common.errors import TransientError
from common.settings import Settings
from dagster_project.resources import LakehouseResource


def _transient_class_names() -> set[str]:
    """Names of every loaded error class marked transient (the error tree is the one source)."""
    names, pending = set(), [TransientError]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return names


def failures_path(settings: Settings) -> str:
    """Where failed runs are recorded."""
    return str(settings.home_dir / "ops" / "run_failures.jsonl")


def failure_record(context: RunFailureSensorContext) -> dict[str, Any]:
    """The cause of one failed run: job, run id, failed steps with their error class and message."""
    transient_names = _transient_class_names()
    steps = []
    for event in context.get_step_failure_events():
        cause = event.step_failure_data.error if event.step_failure_data else None
        while cause is not None and cause.cause is not None and cause.cls_name == "DagsterExecutionStepExecutionError":
            cause = cause.cause
        steps.append(
            {
                "step": event.step_key,
                "error": cause.cls_name if cause else None,
                "message": (cause.message.strip().splitlines() or [""])[0] if cause else None,
                "transient": bool(cause and cause.cls_name in transient_names),
            }
        )
    return {
        "run_id": context.dagster_run.run_id,
        "job": context.dagster_run.job_name,
        "failed_at": datetime.now(UTC).isoformat(),
        "message": context.failure_event.message,
        "steps": steps,
        "transient": bool(steps) and all(step["transient"] for step in steps),
    }


@run_failure_sensor(
    default_status=DefaultSensorStatus.RUNNING,
    description="Records each failed run with its cause (ops/run_failures.jsonl under TRAJLAKE_HOME).",
)
def record_run_failures(context: RunFailureSensorContext, lakehouse: LakehouseResource) -> None:
    """Append the failed run's cause to the failure log."""
    path = failures_path(lakehouse.settings())
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(failure_record(context)) + "\n")


defs = Definitions(sensors=[record_run_failures])
