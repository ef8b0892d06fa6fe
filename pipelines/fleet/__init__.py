"""The fleet as the pipelines drive it: ``trajlake fleet retry`` re-runs what failed in a way worth retrying.

The fleet itself (sandboxes, agents, tasks) is ``producers.fleet``; this package holds what needs the
lakehouse as well: :mod:`~pipelines.fleet.retry` (the query over trajectories and scores, then the run).
"""

from pipelines.fleet.retry import RetryOutcome, retry_query, retry_sessions

__all__ = ["RetryOutcome", "retry_query", "retry_sessions"]
