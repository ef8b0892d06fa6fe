"""Retries by failure cause: which local sessions to run again, as what attempt of which original.

The quality layer's ``scores`` name each session's ``failure_cause`` and ``retry_advice``
(``quality.failure``): ``rerun`` (infrastructure, transient model-API errors: HTTP 429/5xx,
timeouts, a sandbox that died) and ``rerun_once`` (a reaper timeout) are retried; capability
failures (a wrong answer, giving up, cheating) never are. A retry runs the same task instance
(rebuilt from the recorded family and seed) with the same agent, records ``attempt`` (the
original is 1) and ``retry_of`` (the original session id; a retry of a retry points at the
original too), and is itself judged again: only the latest attempt of an original decides
whether another one runs, up to ``max_attempts`` attempts in all. The rows come from
``pipelines.fleet.retry.retry_query`` (producers do not read the lakehouse).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producers.fleet.local import SessionPlan
from producers.fleet.tasks import make_task

RERUN_ADVICE = ("rerun", "rerun_once")


def plan_retries(columns: Sequence[str], rows: Sequence[Sequence[Any]], max_attempts: int = 3) -> list[SessionPlan]:
    """The sessions to run again, one per original whose latest attempt advises a rerun.

    Args:
        columns: the column names of ``pipelines.fleet.retry.retry_query``'s result.
        rows: its rows.
        max_attempts: attempts of an original in all (the original included).

    Returns:
        One plan per original to retry, with ``attempt`` one past its latest and ``retry_of`` the original.
    """
    latest: dict[str, dict[str, Any]] = {}
    tries: dict[str, int] = {}
    group_top: dict[str, int] = {}  # highest attempt number in each rollout group
    for row in rows:
        record = dict(zip(columns, row, strict=True))
        original = record["original"]
        tries[original] = tries.get(original, 0) + 1
        current = latest.get(original)
        if current is None or record["attempt"] > current["attempt"]:
            latest[original] = record
        if record["group_id"] is not None:
            group_top[record["group_id"]] = max(group_top.get(record["group_id"], 0), int(record["attempt"]))
    plans = []
    for original, record in sorted(latest.items()):
        advice = record["retry_advice"]
        if advice not in RERUN_ADVICE or tries[original] >= max_attempts or record["task_seed"] is None:
            continue
        if advice == "rerun_once" and tries[original] > 1:
            continue
        # a group member's retry takes the next attempt number of its group (its siblings hold 1..K)
        attempt = max(int(record["attempt"]), group_top.get(record["group_id"], 0))
        task = make_task(record["task_family"], int(record["task_seed"]))
        plans.append(
            SessionPlan(
                task_index=0,
                group_id=record["group_id"],
                attempt=attempt + 1,
                retry_of=original,
                task=task,
                agent=record["agent_spec"],
            )
        )
    return plans
