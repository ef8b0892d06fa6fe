"""``trajlake fleet retry``: read which sessions failed in a way worth retrying, and run them again.

The decision per original session is ``producers.fleet.retry.plan_retries`` (pure, over rows);
this module is the part that needs the lakehouse: the query over ``trajectories``, ``scores``
and the ``session_start`` events, then the local fleet run of the plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.errors import RetryError

if TYPE_CHECKING:
    from common.progress import Progress
    from common.settings import Settings
    from producers.fleet import FleetReport


@dataclass
class RetryOutcome:
    """What ``fleet retry`` did: originals seen, sessions retried, and the fleet run's report."""

    originals: int
    retried: int
    report: FleetReport | None


def retry_query(since: datetime | None = None) -> str:
    """The SQL (over the lakehouse views) of every local session with its cause, advice and lineage.

    Args:
        since: only sessions started at or after this time (``None``: all).
    """
    where = f"WHERE t.started_at >= TIMESTAMPTZ '{since.isoformat()}'" if since is not None else ""
    return f"""
SELECT t.session_id, s.failure_cause, s.retry_advice, t.task_family, t.group_id,
       coalesce(t.attempt, 1) AS attempt, coalesce(t.retry_of, t.session_id) AS original,
       e.extra['task_seed'] AS task_seed, e.extra['agent_spec'] AS agent_spec
FROM trajectories t
JOIN scores s USING (session_id)
JOIN events e ON e.session_id = t.session_id AND e.event_type = 'session_start'
{where}
ORDER BY original, attempt
"""


def retry_sessions(
    settings: Settings,
    *,
    since: datetime | None = None,
    max_attempts: int = 3,
    concurrency: int = 4,
    labels_path: Path | None = None,
    llm: Any = None,
    progress: Progress | None = None,
) -> RetryOutcome:
    """Re-run, in local sandboxes, the sessions whose failure cause advises it.

    Args:
        settings: trajlake settings.
        since: only sessions started at or after this time.
        max_attempts: attempts of an original session in all.
        concurrency: sandboxes at once.
        labels_path: ground-truth labels of the retries (JSONL).
        llm: ``producers.fleet.llm.LLMConfig`` for sessions whose agent was ``llm``.
        progress: told of each retried session as it finishes.

    Raises:
        RetryError: sessions of the ``llm`` agent are to be retried and ``llm`` is ``None``.
        BubblewrapMissing: the local fleet cannot run.
    """
    from producers.fleet import run_fleet
    from producers.fleet.retry import plan_retries
    from warehouse.sql import open_views

    cursor = open_views(settings).execute(retry_query(since))
    columns = [d[0] for d in cursor.description]
    rows = cursor.fetchall()
    originals = len({dict(zip(columns, row, strict=True))["original"] for row in rows})
    plans = plan_retries(columns, rows, max_attempts)
    if not plans:
        return RetryOutcome(originals=originals, retried=0, report=None)
    if llm is None and any(plan.agent == "llm" for plan in plans):
        raise RetryError("sessions of --agent llm are among the retries: give --model-endpoint and --model")
    report = run_fleet(
        settings,
        backend="local",
        sessions=len(plans),
        concurrency=concurrency,
        labels_path=labels_path,
        llm=llm,
        plans=plans,
        progress=progress,
    )
    return RetryOutcome(originals=originals, retried=len(plans), report=report)
