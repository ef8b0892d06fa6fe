"""A digest of a fleet's event stream that ignores what differs between two runs of one seed.

Event ids, session ids, times, durations, resource figures, command outputs (``ls -la`` shows
dates) and git object ids change from run to run; everything a policy decides (tools, commands,
thoughts, arguments, exit codes, file operations, egress, the verdict, the status) does not. Two
runs of the same seed and policies must give the same digest, whatever the code structure that
emitted the events.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

# extra keys whose values depend on the run (timings, git commit ids made with the wall clock)
_VOLATILE_EXTRA = {
    "sandbox_ready_ms",
    "first_command_ms",
    "git_head",
    "git_history_commit",
    "git_history_ref",
    "processes_started",
    "cost_usd",
    "cgroup",
}
_KEEP = {
    "session_start": None,  # all of it
    "agent_input": ("prompt_digest", "n_messages", "content"),
    "agent_action": ("tool_name", "tool_call_id", "arguments", "command", "thought", "output_tokens"),
    "env_feedback": ("tool_call_id", "exit_code", "failure_reason"),
    "file_op": ("op", "path", "in_workspace"),
    "network_request": ("host", "port", "protocol", "allowed", "error"),
    "evaluation": ("passed", "tests_total", "tests_passed", "reward", "fresh_sandbox", "evaluator"),
    "session_end": ("status", "reward", "exit_reason"),
    "resource_sample": (),
    "annotation": ("key", "author"),
}


def normalise_session(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One session's events reduced to what a policy and the fleet decide (see the module docstring)."""
    events = sorted(events, key=lambda e: e["seq"])
    seq_of = {e["event_id"]: e["seq"] for e in events}
    out = []
    for event in events:
        kind = event["event_type"]
        keep = _KEEP.get(kind, ())
        payload = event["payload"] or {}
        fields = dict(payload) if keep is None else {k: payload.get(k) for k in keep}
        if kind == "file_op" and "/.git/" in str(payload.get("path")):
            fields = {"op": "git-internal"}  # git's own bookkeeping files vary with the clock
        if kind == "evaluation":
            details = json.loads(payload.get("details") or "{}")
            fields["tests"] = [(t.get("id"), t.get("outcome")) for t in details.get("tests", [])]
            fields["tamper_kinds"] = details.get("tamper_kinds")
            fields["ignored_changes"] = details.get("ignored_changes")
            fields["deliverable"] = sorted(details.get("deliverable") or {})
        extra = {k: (None if k in _VOLATILE_EXTRA else v) for k, v in sorted((event.get("extra") or {}).items())}
        out.append(
            {
                "seq": event["seq"],
                "type": kind,
                "source": event["source"],
                "task": (event["task_id"], event["task_type"], event["image_name"], event["image_version"]),
                "agent": (event["agent_name"], event["agent_version"], event["agent_model"], event["policy_version"]),
                "message": event.get("agent_message_id"),
                "parent": seq_of.get(event.get("parent_event_id") or "", None),
                "payload": fields,
                "extra": extra,
            }
        )
    return out


def stream_digest(events: list[dict[str, Any]]) -> tuple[str, list[list[dict[str, Any]]]]:
    """(sha256, normalised sessions in task order) of a fleet's events."""
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        sessions[event["session_id"]].append(event)
    normal = sorted((normalise_session(s) for s in sessions.values()), key=lambda s: json.dumps(s[0]["task"]))
    text = json.dumps(normal, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest(), normal
