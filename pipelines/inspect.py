"""Reading one session, or a set of sessions, back out of the lakehouse for a person to look at.

``trajlake show`` and ``trajlake report`` render what this module reads; it does no rendering.
:func:`load_session` gathers one run: its trajectory row, its steps (command, output, exit code,
tokens, cost), the model calls, files written (as diffs where the earlier content is known), the
submitted patch, network attempts, the evaluation, the flags with their evidence, the scores and
its duplicate cluster. Everything returned is data as recorded: hostile strings included, so
renderers escape it.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipelines.errors import SessionNotFound
from quality.config import SEVERITIES

if TYPE_CHECKING:
    import duckdb

    from common.settings import Settings

#: Event kinds :func:`load_session` reads besides the steps (the rest are in ``steps`` or counted).
_EVENT_KINDS = ("session_start", "agent_input", "evaluation", "session_end", "network_request", "annotation", "file_op")


def severity_rank(column: str) -> str:
    """SQL ranking ``column`` (a flag's severity) most severe first: critical 0, high 1, medium 2, low 3."""
    cases = " ".join(f"WHEN '{name}' THEN {rank}" for rank, name in enumerate(reversed(SEVERITIES)))
    return f"CASE {column} {cases} ELSE {len(SEVERITIES)} END"


def class_rank(column: str) -> str:
    """SQL ranking ``column`` (a flag's class): security 0, behavioural 1, anomaly 2."""
    return f"CASE {column} WHEN 'security' THEN 0 WHEN 'behavioural' THEN 1 ELSE 2 END"


@dataclass
class FileChange:
    """A file an agent wrote: its path, the step that wrote it, and a unified diff (or the new content)."""

    step_index: int
    path: str
    diff: str
    known_before: bool


@dataclass
class SessionDetail:
    """One session as recorded, ready to render.

    Attributes:
        trajectory: the ``trajectories`` row.
        steps: ``steps`` rows in order (``arguments`` parsed into ``arguments_json`` when JSON).
        model_calls: one dict per recorded model call (model, status, tokens, cost, latency).
        changes: files written, as diffs against what the session had read or written before.
        submission: the submitted patch (imported runs), or ``None``.
        network: network attempts (host, port, allowed, error).
        file_ops: file operations (op, path, size, in the workspace or not).
        evaluation: the last evaluation payload, or ``None``.
        annotations: annotations (key, value, author), e.g. an agent's traceback.
        flags: ``flags`` rows with ``evidence`` parsed from JSON where it is JSON.
        scores: the ``scores`` row, or ``None`` when not scored yet.
        duplicate: the ``duplicates`` row, or ``None``.
        start: the ``session_start`` payload (limits, instruction), or ``None``.
        event_steps: event id → the step it belongs to: the step's action and feedback, and the file,
            network and annotation events an action caused (its ``parent_event_id``, else the step before).
    """

    trajectory: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    model_calls: list[dict[str, Any]] = field(default_factory=list)
    changes: list[FileChange] = field(default_factory=list)
    submission: str | None = None
    network: list[dict[str, Any]] = field(default_factory=list)
    file_ops: list[dict[str, Any]] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None
    annotations: list[dict[str, Any]] = field(default_factory=list)
    flags: list[dict[str, Any]] = field(default_factory=list)
    scores: dict[str, Any] | None = None
    duplicate: dict[str, Any] | None = None
    start: dict[str, Any] | None = None
    event_steps: dict[str, int] = field(default_factory=dict)

    @property
    def session_id(self) -> str:
        """The session's id."""
        return str(self.trajectory["session_id"])


def _rows(con: duckdb.DuckDBPyConnection, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cursor = con.execute(query, params)
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def parse_json(text: Any) -> Any:
    """``text`` parsed as JSON when it is a JSON string, else ``text`` unchanged."""
    if isinstance(text, str) and text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def resolve_session(con: duckdb.DuckDBPyConnection, session: str) -> str:
    """The one session id equal to ``session`` or starting with it.

    Raises:
        SessionNotFound: none matches, or a prefix matches several.
    """
    exact = con.execute("SELECT session_id FROM trajectories WHERE session_id = $s LIMIT 1", {"s": session}).fetchall()
    if exact:
        return str(exact[0][0])
    found = con.execute(
        "SELECT session_id FROM trajectories WHERE starts_with(session_id, $s) ORDER BY session_id LIMIT 3",
        {"s": session},
    ).fetchall()
    if not found:
        raise SessionNotFound(f"no session {session!r} in the lakehouse (trajectories has no such id or prefix)")
    if len(found) > 1:
        raise SessionNotFound(
            f"{session!r} is the start of several session ids ({', '.join(r[0] for r in found[:2])}, …): give more"
        )
    return str(found[0][0])


def looks_like_diff(text: str) -> bool:
    """Whether ``text`` is (or holds) a unified diff: ``git diff`` output, a submitted patch."""
    head = text.lstrip()[:4000]
    return head.startswith(("diff --git", "--- ")) or "\ndiff --git " in head or ("\n+++ " in head and "\n@@ " in head)


def flagged_steps(detail: SessionDetail) -> dict[int, list[str]]:
    """Step index → the flags whose evidence names one of its events (action, feedback, or an event it caused)."""
    marks: dict[int, list[str]] = {}
    for flag in detail.flags:
        evidence = flag.get("evidence_json", parse_json(flag.get("evidence")))
        if not isinstance(evidence, dict):
            continue
        for event_id in evidence.get("event_ids") or []:
            step = detail.event_steps.get(str(event_id))
            if step is not None and str(flag["flag"]) not in marks.get(step, []):
                marks.setdefault(step, []).append(str(flag["flag"]))
    return marks


def most_severe_flagged(settings: Settings) -> str:
    """The id of the flagged session to look at first: security flags, then behavioural, then anomalies;
    high severity first; the newest among equals.

    Raises:
        SessionNotFound: no session is flagged.
    """
    from warehouse.sql import open_views

    with open_views(settings) as con:
        found = con.execute(
            "SELECT f.session_id FROM flags f JOIN trajectories t USING (session_id) ORDER BY "
            f"{class_rank('f.flag_class')}, {severity_rank('f.severity')}, t.started_at DESC, f.session_id "
            "LIMIT 1"
        ).fetchall()
    if not found:
        raise SessionNotFound("no session is flagged (trajlake score flags sessions; has it run?)")
    return str(found[0][0])


def file_changes(steps: list[dict[str, Any]]) -> list[FileChange]:
    """The files a session wrote, each as a unified diff against the content it last read or wrote.

    Content is known from ``read_file`` outputs and earlier ``write_file`` arguments; a file never
    seen before is shown whole, as added lines.
    """
    known: dict[str, str] = {}
    changes: list[FileChange] = []
    for step in steps:
        arguments = step.get("arguments_json")
        if not isinstance(arguments, dict) or not isinstance(arguments.get("path"), str):
            continue
        path = arguments["path"]
        if step.get("tool_name") == "read_file" and step.get("exit_code") in (0, None) and step.get("output"):
            known[path] = str(step["output"])
        elif step.get("tool_name") == "write_file" and isinstance(arguments.get("content"), str):
            new = arguments["content"]
            before = known.get(path)
            lines = difflib.unified_diff(
                (before or "").splitlines(keepends=True),
                new.splitlines(keepends=True),
                fromfile=f"a/{path}" if before is not None else "/dev/null",
                tofile=f"b/{path}",
            )
            diff = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
            changes.append(FileChange(int(step["step_index"]), path, diff, before is not None))
            known[path] = new
    return changes


def load_session(settings: Settings, session: str, con: duckdb.DuckDBPyConnection | None = None) -> SessionDetail:
    """Everything recorded about one session (``session`` may be a unique prefix of its id).

    Raises:
        SessionNotFound: no session, or several, match ``session``.
    """
    from warehouse.sql import open_views

    own = con is None
    con = con or open_views(settings)
    try:
        return load_sessions(con, [resolve_session(con, session)])[0]
    finally:
        if own:
            con.close()


def _grouped(con: duckdb.DuckDBPyConnection, query: str, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Rows of ``query`` (which filters on ``$ids``, a list of session ids) by session id, in query order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for row in _rows(con, query, {"ids": ids}):
        found.setdefault(str(row["session_id"]), []).append(row)
    return found


def load_sessions(con: duckdb.DuckDBPyConnection, session_ids: list[str]) -> list[SessionDetail]:
    """Everything recorded about each of ``session_ids`` (exact ids), in that order, one query per table.

    Ids without a trajectory are left out.
    """
    ids = list(dict.fromkeys(session_ids))
    where = "session_id IN (SELECT unnest($ids::VARCHAR[]))"
    trajectories = _grouped(con, f"SELECT * FROM trajectories WHERE {where}", ids)
    steps = _grouped(con, f"SELECT * FROM steps WHERE {where} ORDER BY session_id, step_index", ids)
    kinds = ", ".join(f"'{kind}'" for kind in _EVENT_KINDS)
    events = _grouped(
        con,
        f"SELECT session_id, seq, ts, event_id, parent_event_id, event_type, agent_model, extra, "
        f"{', '.join(_EVENT_KINDS)} "
        f"FROM events WHERE {where} AND event_type IN ({kinds}) ORDER BY session_id, seq",
        ids,
    )
    flags = _grouped(
        con,
        f"SELECT session_id, flag, flag_class, severity, evidence, score FROM flags WHERE {where} "
        f"ORDER BY session_id, {severity_rank('severity')}, {class_rank('flag_class')}, flag",
        ids,
    )
    scores = _grouped(con, f"SELECT * FROM scores WHERE {where}", ids)
    duplicates = _grouped(con, f"SELECT * FROM duplicates WHERE {where}", ids)
    details = []
    for session_id in ids:
        if session_id not in trajectories:
            continue
        detail = SessionDetail(trajectories[session_id][0], steps=steps.get(session_id, []))
        detail.flags = flags.get(session_id, [])
        detail.scores = next(iter(scores.get(session_id, [])), None)
        detail.duplicate = next(iter(duplicates.get(session_id, [])), None)
        _fill(detail, events.get(session_id, []))
        details.append(detail)
    return details


def _fill(detail: SessionDetail, events: list[dict[str, Any]]) -> None:
    """Parse what needs parsing and sort the session's events into the detail's parts."""
    for step in detail.steps:
        step["arguments_json"] = parse_json(step.get("arguments"))
    for flag in detail.flags:
        flag["evidence_json"] = parse_json(flag.get("evidence"))
    detail.changes = file_changes(detail.steps)
    submission_event = None
    for event in events:
        kind, payload = event["event_type"], event.get(event["event_type"]) or {}
        if kind == "session_start":
            detail.start = payload
        elif kind == "agent_input" and payload.get("model_call"):
            call = payload["model_call"]
            detail.model_calls.append({"seq": event["seq"], "event_id": event["event_id"], **call})
        elif kind == "agent_input" and (payload.get("input_tokens") or payload.get("cached_tokens")):
            detail.model_calls.append(
                {
                    "seq": event["seq"],
                    "event_id": event["event_id"],
                    "model": event.get("agent_model"),
                    "status": "ok",
                    "prompt_tokens": payload.get("input_tokens"),
                    "cached_tokens": payload.get("cached_tokens"),
                }
            )
        elif kind == "evaluation":
            detail.evaluation = {**payload, "details": parse_json(payload.get("details"))}
        elif kind == "session_end":
            submission_event = (event.get("extra") or {}).get("submission_event_id")
        elif kind == "network_request":
            detail.network.append({"seq": event["seq"], **payload})
        elif kind == "annotation":
            detail.annotations.append({"seq": event["seq"], **payload})
        elif kind == "file_op":
            detail.file_ops.append({"seq": event["seq"], **payload})
    _attach_step_costs(detail)
    _map_events_to_steps(detail, events)
    if submission_event:
        patch = next((s.get("output") for s in detail.steps if s.get("feedback_event_id") == submission_event), None)
        detail.submission = str(patch) if patch else None


def _map_events_to_steps(detail: SessionDetail, events: list[dict[str, Any]]) -> None:
    """Fill ``detail.event_steps`` (flag evidence names events; people read steps)."""
    by_action: dict[str, int] = {}
    for step in detail.steps:
        index = int(step["step_index"])
        for key in ("action_event_id", "feedback_event_id"):
            if step.get(key):
                detail.event_steps[str(step[key])] = index
        if step.get("action_event_id"):
            by_action[str(step["action_event_id"])] = index
    ordered = sorted((int(s.get("seq") or 0), int(s["step_index"])) for s in detail.steps)
    for event in events:
        event_id = str(event["event_id"])
        if event_id in detail.event_steps:
            continue
        parent = by_action.get(str(event.get("parent_event_id") or ""))
        if parent is None:  # the last step that began before it
            before = [index for seq, index in ordered if seq < int(event["seq"])]
            parent = before[-1] if before else None
        if parent is not None:
            detail.event_steps[event_id] = parent


def _attach_step_costs(detail: SessionDetail) -> None:
    """Give each scripted model call (an ``agent_input`` without a recorded call) the output tokens and
    cost of the action that followed it, as the fleet records them on the action."""
    by_seq = sorted(detail.steps, key=lambda s: s.get("seq") or 0)
    for call in detail.model_calls:
        if "completion_tokens" in call:
            continue
        action = next((s for s in by_seq if (s.get("seq") or 0) > call["seq"]), None)
        if action is not None:
            call["completion_tokens"] = action.get("output_tokens")
            call["cost_usd"] = action.get("cost_usd")
            call["latency_ms"] = action.get("model_latency_ms")
