"""Reading one session, or a set of sessions, back out of the lakehouse for a person to look at.

``trajlake show`` and ``trajlake report`` render what this module reads; it does no rendering.
:func:`load_session` gathers one run: its trajectory row, its steps (command, output, exit code,
tokens, cost), the model calls (each with the messages it sent, rebuilt from the recorded deltas
and content blobs, and the reply it got), files written (as diffs where the earlier content is
known), the submitted patch, network attempts, the evaluation, the flags with their evidence, the
scores and its duplicate cluster. Everything returned is data as recorded: hostile strings
included, so renderers escape it.

Both renderers show the same readings of it, made here: :func:`evidence_lines` (a flag's
evidence as lines a person reads: reason, command, path, host, step, the hunk that wrote the
file) and :func:`score_lines` (quality as arithmetic, the threshold and what decided
exportability), and :func:`timeline` (model calls and steps in the order they happened).
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

    from warehouse.lakehouse import Lakehouse

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
    origin: str | None = None

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


def most_severe_flagged(con: duckdb.DuckDBPyConnection) -> str:
    """The id of the flagged session to look at first: security flags, then behavioural, then anomalies;
    high severity first; the newest among equals (``con``: the lakehouse's views).

    Raises:
        SessionNotFound: no session is flagged.
    """
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


def load_session(lake: Lakehouse, session: str, con: duckdb.DuckDBPyConnection | None = None) -> SessionDetail:
    """Everything recorded about one session (``session`` may be a unique prefix of its id).

    ``con``: the lakehouse's views, when the caller has them open (else they are opened and closed here).

    Raises:
        SessionNotFound: no session, or several, match ``session``.
    """
    own = con is None
    con = con or lake.views()
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
    calls = [c for found in events.values() for e in found if (c := (e.get("agent_input") or {}).get("model_call"))]
    blobs = _missing_blobs(con, calls)
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
        _rebuild_messages(detail.model_calls, blobs)
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
    detail.origin = detail.trajectory.get("origin")
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


# ------------------------------------------------------------------------------- model calls


def _missing_blobs(con: duckdb.DuckDBPyConnection, calls: list[dict[str, Any]]) -> dict[str, str]:
    """Texts of the content refs ``calls`` use but do not carry (the host emitted them once, in another session)."""
    from pipelines.intake.parts import blob_texts

    own = {b["sha256"] for c in calls for b in c.get("blobs") or []}
    wanted = {ref for c in calls for ref in c.get("new_messages") or []}
    wanted |= {c[k] for c in calls for k in ("response_message_sha256", "tools_sha256") if c.get(k)}
    missing = sorted(wanted - own)
    if not missing:
        return {}
    rows = con.execute(
        "SELECT DISTINCT b.sha256, b.text FROM (SELECT unnest(agent_input.model_call.blobs) AS b FROM events "
        "WHERE event_type = 'agent_input' AND agent_input.model_call IS NOT NULL) "
        "WHERE b.sha256 IN (SELECT unnest($refs::VARCHAR[]))",
        {"refs": missing},
    ).fetchall()
    found = {str(sha): str(text) for sha, text in rows}
    found.update(blob_texts(con, [r for r in missing if r not in found]))
    return found


def _message(texts: dict[str, str], ref: str) -> dict[str, Any]:
    text = texts.get(ref)
    if text is None:
        return {"role": "?", "content": f"[message {ref[:12]}… is in no event]"}
    parsed = parse_json(text)
    return parsed if isinstance(parsed, dict) else {"role": "?", "content": text}


def _rebuild_messages(calls: list[dict[str, Any]], blobs: dict[str, str]) -> None:
    """Give each recorded call (``call_index`` order) ``messages`` (the request as sent), ``new_from``
    (where the messages the previous call had not sent start), ``reply`` (the assistant message) and
    ``tools`` (the tool names offered). A ref whose blob is nowhere becomes a message saying so."""
    recorded = [c for c in calls if "new_messages" in c]
    texts = dict(blobs)
    for call in recorded:
        texts.update({b["sha256"]: b["text"] for b in call.get("blobs") or []})
    context: list[str] = []
    for call in sorted(recorded, key=lambda c: (c.get("call_index") or 0, c.get("try_index") or 0)):
        prefix = int(call.get("prefix_messages") or 0)
        refs = context[:prefix] + list(call.get("new_messages") or [])
        call["messages"] = [_message(texts, ref) for ref in refs]
        call["new_from"] = min(prefix, len(refs))
        reply = call.get("response_message_sha256")
        call["reply"] = _message(texts, reply) if reply else None
        tools = parse_json(texts.get(call.get("tools_sha256") or ""))
        call["tools"] = (
            [str((t.get("function") or t).get("name")) for t in tools if isinstance(t, dict)]
            if isinstance(tools, list)
            else []
        )
        if call.get("status") == "ok" and reply:
            context = [*refs, reply]


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message's ``content`` (a string, or the text parts of a list of parts)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") if part.get("type", "text") == "text" else f"[{part.get('type')}]"))
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def tool_calls(message: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """A reply's tool calls as (id, tool name, arguments parsed from JSON where they are JSON)."""
    found = []
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function") or {}
            found.append(
                (str(call.get("id") or ""), str(function.get("name") or "?"), parse_json(function.get("arguments")))
            )
    return found


def timeline(detail: SessionDetail) -> list[tuple[str, dict[str, Any]]]:
    """The run in the order it happened: ``("call", model call)`` and ``("step", step)`` by event seq."""
    items = [(int(c.get("seq") or 0), 0, "call", c) for c in detail.model_calls]
    items += [(int(s.get("seq") or 0), 1, "step", s) for s in detail.steps]
    return [(kind, item) for _, _, kind, item in sorted(items, key=lambda i: (i[0], i[1]))]


def change_of_step(detail: SessionDetail, step_index: int) -> FileChange | None:
    """The file write a step made (a ``write_file`` whose content was recorded), or ``None``."""
    return next((c for c in detail.changes if c.step_index == step_index), None)


# ------------------------------------------------------------------------------- evidence


@dataclass(frozen=True)
class EvidenceLine:
    """One line of a flag's evidence: ``kind`` (reason, command, path, host, step, feature, hunk, note) and text.

    ``step`` is the step it points at (for links), when known.
    """

    kind: str
    text: str
    step: int | None = None


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


#: Evidence keys shown one line per item, singular or plural, as the kind of line they make.
_LISTED = {"reasons": "reason", "reason": "reason", "commands": "command", "command": "command"}
_LISTED |= {"paths": "path", "path": "path", "hosts": "host", "host": "host"}


def evidence_lines(flag: dict[str, Any], detail: SessionDetail | None = None) -> list[EvidenceLine]:
    """A flag's evidence as lines a person reads, none left out: each reason, command, path and host; the
    steps its events belong to (with the tool and command); an anomaly's features (value, z); and, for a
    path the session wrote with recorded content, the diff hunk that wrote it. Keys this function does not
    know are shown as ``key: value``."""
    evidence = flag.get("evidence_json", parse_json(flag.get("evidence")))
    if not isinstance(evidence, dict):
        text = "" if evidence is None else str(evidence)
        return [EvidenceLine("note", line) for line in text.splitlines() if line.strip()]
    lines: list[EvidenceLine] = []
    for key, value in evidence.items():
        lines += _evidence_entry(key, value)
    event_ids = [str(e) for e in evidence.get("event_ids") or []] if isinstance(evidence.get("event_ids"), list) else []
    if detail is None:
        if event_ids:
            lines.append(EvidenceLine("step", f"{len(event_ids)} events (the session's page links each to its step)"))
        return lines
    paths = [ln.text for ln in lines if ln.kind == "path"]
    steps, seen = _evidence_steps(detail, event_ids)
    return lines + steps + _evidence_hunks(detail, seen, paths)


def _evidence_entry(key: str, value: Any) -> list[EvidenceLine]:
    """The lines of one evidence key: its items, an anomaly's features, or ``key: value`` (event ids: none here)."""
    if key in _LISTED:
        return [EvidenceLine(_LISTED[key], str(v)) for v in (value if isinstance(value, list) else [value])]
    if key == "event_ids":
        return []  # shown as steps
    if key == "features" and isinstance(value, dict):
        return [EvidenceLine("feature", f"{name}: {_features(inner)}") for name, inner in value.items()]
    if value in (None, [], {}, ""):
        return []
    shown = value if isinstance(value, str | int | float) else json.dumps(value, ensure_ascii=False)
    return [EvidenceLine("note", f"{key}: {shown}")]


def _features(facts: Any) -> str:
    """An anomaly feature's facts (``value 12, z 4.1``), or its one value."""
    return ", ".join(f"{k} {_short(v)}" for k, v in facts.items()) if isinstance(facts, dict) else _short(facts)


def _evidence_steps(detail: SessionDetail, event_ids: list[str]) -> tuple[list[EvidenceLine], list[int]]:
    """One line per step the events belong to (its tool, and its command or the file it wrote), and those steps."""
    steps = {int(s["step_index"]): s for s in detail.steps}
    lines: list[EvidenceLine] = []
    seen: list[int] = []
    for event_id in event_ids:
        index = detail.event_steps.get(event_id)
        if index is None:
            lines.append(EvidenceLine("step", f"event {event_id} (in no step)"))
        elif index not in seen:
            seen.append(index)
            step = steps.get(index) or {}
            what = step.get("command") or ""
            change = change_of_step(detail, index)
            if change is not None:
                what = f"write {change.path}"
            lines.append(
                EvidenceLine("step", f"step #{index} {step.get('tool_name') or 'action'}: {what}".rstrip(": "), index)
            )
    return lines, seen


def _evidence_hunks(detail: SessionDetail, seen: list[int], paths: list[str]) -> list[EvidenceLine]:
    """The diff hunks of the session's writes in those steps or to those paths."""
    lines: list[EvidenceLine] = []
    for change in detail.changes:
        hit = change.step_index in seen or any(p == change.path or p.endswith("/" + change.path) for p in paths)
        if hit:
            lines.append(EvidenceLine("hunk", f"step #{change.step_index} wrote {change.path}:", change.step_index))
            lines += [EvidenceLine("hunk", row, change.step_index) for row in change.diff.splitlines()]
    return lines


# ------------------------------------------------------------------------------- scores


def _n(value: Any) -> str:
    if value is None:
        return "?"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.0f}"
    return str(value)


def score_lines(scores: dict[str, Any]) -> list[str]:
    """The session's quality as arithmetic, its threshold and what decided exportability, one line each:

    ``raw quality = 0.5 × completion 1 + 0.3 × validity 1 + 0.2 × novelty 0.902 = 0.9804``,
    ``quality = raw 0.9804 × governance weight 0.5 (flag edited_tests) = 0.4902``,
    ``threshold: quality 0.4902 < min_quality 0.5``, ``outcome success → not exportable: quality … < …``.
    A row scored before the arithmetic was stored says so (``trajlake score`` rewrites it).
    """
    s = scores
    lines = []
    if s.get("raw_quality") is None:
        lines.append(
            f"quality {_n(s.get('quality'))} (completion {_n(s.get('completion'))}, validity {_n(s.get('validity'))}, "
            f"novelty {_n(s.get('novelty'))}); scored before scores kept their arithmetic: rescore to see it"
        )
    else:
        lines.append(
            f"raw quality = {_n(s.get('w_completion'))} × completion {_n(s.get('completion'))} + "
            f"{_n(s.get('w_validity'))} × validity {_n(s.get('validity'))} + "
            f"{_n(s.get('w_novelty'))} × novelty {_n(s.get('novelty'))} = {_n(s.get('raw_quality'))}"
        )
        weight = s.get("governance_weight")
        why = f"flag {s['weight_flag']}" if s.get("weight_flag") else "no flag lowers it"
        lines.append(
            f"quality = raw {_n(s.get('raw_quality'))} × governance weight {_n(weight)} ({why}) "
            f"= {_n(s.get('quality'))}"
        )
    if s.get("min_quality") is not None and s.get("quality") is not None:
        sign = "≥" if s["quality"] >= s["min_quality"] else "<"
        lines.append(f"threshold: quality {_n(s['quality'])} {sign} min_quality {_n(s['min_quality'])}")
    decision = s.get("export_decision") or ("exportable" if s.get("exportable") else "not exportable")
    lines.append(f"outcome {s.get('outcome') or '?'} → {decision}")
    return lines
