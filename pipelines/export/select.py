"""What an export selects and how it streams: filters, the split by task family, sessions with steps and calls.

Selection is ``scores.exportable`` without its own quality threshold (no security flag, ended,
representative of its duplicate cluster) and ``quality >= min_quality`` as given, so
``--min-quality 0`` exports every eligible session.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from pyiceberg.catalog import Catalog

from common.settings import Settings
from producers.redact import redact_array
from warehouse.sql import open_views

#: Split shares (percent of task families, by the sha256 of the family name).
SPLIT_PERCENT = {"train": 80, "validation": 10, "test": 10}


@dataclass(frozen=True)
class ExportFilters:
    """What an export selects, beyond ``scores.exportable`` minus its own quality threshold.

    Attributes:
        min_quality: quality at least this (applied as given: 0 exports every eligible session).
        day: only sessions started on this UTC day (the nightly partition).
        policy_version: only this policy version.
        task_family: only this task family.
        since: started at or after this instant.
        until: started before this instant.
        split: only this split (``train``, ``validation``, ``test``; by task family, see :func:`split_of`).
        group_complete: only rollout groups whose K attempts all finished and all pass the filters.
    """

    min_quality: float = 0.5
    day: date | None = None
    policy_version: str | None = None
    task_family: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    split: str | None = None
    group_complete: bool = False

    def as_dict(self) -> dict[str, object]:
        """Plain JSON for the manifest."""
        return {
            "eligible": "no security flag, ended, representative of its duplicate cluster",
            "min_quality": self.min_quality,
            "day": self.day.isoformat() if self.day else None,
            "policy_version": self.policy_version,
            "task_family": self.task_family,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "split": self.split,
            "group_complete": self.group_complete,
        }


def split_of(task_family: str | None) -> str:
    """The split of a task family: sha256 of the family name, 80 % train, 10 % validation, 10 % test.

    Deterministic and by family, so every session of a family lands in one split (no family in two).
    """
    bucket = int.from_bytes(hashlib.sha256((task_family or "").encode()).digest()[:8], "big") % 100
    return (
        "train" if bucket < SPLIT_PERCENT["train"] else "validation" if bucket < 100 - SPLIT_PERCENT["test"] else "test"
    )


def _selection(filters: ExportFilters) -> tuple[str, dict[str, Any]]:
    """The WHERE clause choosing sessions (the quality threshold is the filter's, not ``exportable``'s)."""
    where = [
        "NOT s.security_flagged",
        "s.failure_cause IS DISTINCT FROM 'still_running'",
        "s.session_id NOT IN (SELECT session_id FROM duplicates WHERE NOT is_representative)",
        "s.quality >= $q",
    ]
    params: dict[str, Any] = {"q": filters.min_quality}
    if filters.day:
        where.append("CAST(t.started_at AS DATE) = $day")
        params["day"] = filters.day
    if filters.policy_version is not None:
        where.append("t.policy_version = $pv")
        params["pv"] = filters.policy_version
    if filters.task_family is not None:
        where.append("coalesce(t.task_family, s.task_family, t.task_id) = $tf")
        params["tf"] = filters.task_family
    if filters.since:
        where.append("t.started_at >= $since")
        params["since"] = filters.since
    if filters.until:
        where.append("t.started_at < $until")
        params["until"] = filters.until
    return " AND ".join(where), params


def _merge(
    sessions: list[dict[str, Any]], reader: Any, column: int, redact: tuple[int, ...] = ()
) -> Iterator[list[dict[str, Any]]]:
    """The rows of ``reader`` (ordered by session_id) grouped per session of ``sessions``, in that order.

    Memory is bounded by one Arrow batch plus the rows of the sessions it spans.
    """
    grouped: dict[str, list[dict[str, Any]]] = {}
    position = 0
    for batch in reader:
        for index in redact:
            batch = batch.set_column(index, batch.schema.field(index).name, redact_array(batch.column(index)))
        rows = batch.to_pylist()
        for row in rows:
            grouped.setdefault(row["session_id"], []).append(row)
        last = rows[-1]["session_id"] if rows else ""
        while position < len(sessions) and sessions[position]["session_id"] < last:
            yield grouped.pop(sessions[position]["session_id"], [])
            position += 1
    for session in sessions[position:]:
        yield grouped.pop(session["session_id"], [])


class _Blobs:
    """Model-call content another session emitted (the host stores each text once), looked up and cached."""

    def __init__(self, con: Any, capacity: int = 4096) -> None:
        self.con, self.capacity = con, capacity
        self.cache: dict[str, str] = {}

    def __call__(self, refs: Iterable[str]) -> dict[str, str]:
        wanted = list(refs)
        missing = [r for r in wanted if r not in self.cache]
        if missing:
            rows = self.con.execute(
                "SELECT DISTINCT b.sha256, b.text FROM (SELECT unnest(agent_input.model_call.blobs) AS b FROM events "
                "WHERE event_type = 'agent_input' AND agent_input.model_call IS NOT NULL) WHERE b.sha256 IN "
                "(SELECT unnest($refs))",
                {"refs": missing},
            ).fetchall()
            if len(self.cache) > self.capacity:
                self.cache.clear()
            self.cache.update({sha: text for sha, text in rows})
        return {r: self.cache[r] for r in wanted if r in self.cache}


def _sessions(
    settings: Settings, catalog: Catalog, filters: ExportFilters, weights: dict[str, float], batch_rows: int = 20_000
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], _Blobs]]:
    """Chosen sessions in ``session_id`` order with their steps and model calls, text fields redacted.

    Steps and model calls stream from DuckDB in Arrow batches ordered like the sessions and are
    merged on the fly, so memory is bounded by a batch, not by the export's size.
    """
    con = open_views(settings, catalog)
    where, params = _selection(filters)
    con.execute(
        "CREATE TABLE chosen AS SELECT t.session_id, t.task_id, t.task_type, t.instruction, s.quality, "
        "s.completion, s.flags, coalesce(t.task_family, s.task_family, t.task_id) AS task_family, t.policy_version, "
        "t.group_id, t.attempt, t.agent_name, t.agent_version, t.agent_model, t.status, t.exit_reason, t.reward, "
        "t.input_tokens, t.cached_tokens, t.output_tokens, t.cost_usd "
        f"FROM trajectories t JOIN scores s USING (session_id) WHERE {where}",
        params,
    )
    if filters.group_complete:
        # a group is whole when every attempt 0..K-1 exists, none is running and all K were chosen
        con.execute(
            "DELETE FROM chosen WHERE group_id IS NULL OR group_id NOT IN (SELECT g.group_id FROM (SELECT group_id, "
            "count(DISTINCT attempt) AS k, max(attempt) AS top, bool_and(status <> 'running') AS done, count(*) AS n "
            "FROM trajectories WHERE group_id IS NOT NULL GROUP BY group_id) g JOIN (SELECT group_id, count(*) AS n "
            "FROM chosen GROUP BY group_id) c USING (group_id) WHERE g.done AND g.k = g.top + 1 AND c.n = g.n)"
        )
    chosen = con.sql(
        "SELECT c.*, f.flag_list, sub.submission FROM chosen c "
        "LEFT JOIN (SELECT session_id, list(struct_pack(flag := flag, flag_class := flag_class, severity := severity) "
        "ORDER BY flag) AS flag_list FROM flags WHERE session_id IN (SELECT session_id FROM chosen) "
        "GROUP BY session_id) f USING (session_id) "
        "LEFT JOIN (SELECT e.session_id, arg_max(fb.env_feedback.output, fb.seq) AS submission FROM events e "
        "JOIN events fb ON fb.event_id = e.extra['submission_event_id'] WHERE e.event_type = 'session_end' "
        "AND e.session_id IN (SELECT session_id FROM chosen) GROUP BY e.session_id) sub USING (session_id) "
        "ORDER BY session_id"
    ).to_arrow_table()
    for name in ("instruction", "submission"):
        chosen = chosen.set_column(chosen.schema.get_field_index(name), name, redact_array(chosen.column(name)))
    sessions = []
    for session in chosen.to_pylist():
        session["split"] = split_of(session["task_family"])
        if filters.split and session["split"] != filters.split:
            continue
        flags = session.pop("flag_list") or []
        for flag in flags:
            flag["weight"] = weights.get(flag["flag"], 1.0)
        session["flag_list"] = flags
        session["weight"] = min((flag["weight"] for flag in flags), default=1.0)
        sessions.append(session)
    con.execute(
        "DELETE FROM chosen WHERE session_id NOT IN (SELECT unnest($ids))", {"ids": [s["session_id"] for s in sessions]}
    )
    # one cursor per open stream: a query on a connection would end the stream still pending on it
    ids = [s["session_id"] for s in sessions]
    steps = con.sql(
        "SELECT session_id, step_index, tool_name, tool_call_id, arguments, command, thought, output, exit_code, "
        "ts "
        "FROM steps WHERE session_id IN (SELECT session_id FROM chosen) ORDER BY session_id, step_index"
    ).to_arrow_reader(batch_rows)
    # another connection per open stream: a query on a connection ends the stream pending on it
    calls = (
        open_views(settings, catalog)
        .sql(
            "SELECT session_id, ts AS _ts, agent_input.model_call AS call FROM events WHERE event_type = 'agent_input' "
            "AND agent_input.model_call IS NOT NULL AND session_id IN (SELECT unnest($ids)) "
            "ORDER BY session_id, seq",
            params={"ids": ids},
        )
        .to_arrow_reader(max(batch_rows // 20, 256))
    )
    step_groups = _merge(sessions, steps, 0, redact=(6, 7))
    call_groups = _merge(sessions, calls, 0)
    lookup = _Blobs(open_views(settings, catalog))
    for session, own_steps, own_calls in zip(sessions, step_groups, call_groups, strict=True):
        yield session, own_steps, [{**row["call"], "_ts": row["_ts"]} for row in own_calls], lookup
