"""Helpers every importer shares: text of message contents, chat messages as sent, what an exit status means.

The reading of files lives in :mod:`producers.importers._source`, the building of a session in
:mod:`producers.importers._builder`, safe values in :mod:`producers.importers._values`; this module
re-exports the names importers use most.
"""

from __future__ import annotations

import json
import re
from typing import Any

from producers.importers._builder import ImportedSession, RunBuilder, Verdict, digest
from producers.importers._source import ImportFormatError, JsonLines, SourceFile, read_source
from producers.importers._values import FieldIssues


def text_of(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content list (OpenAI, ATIF, OpenHands V1)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                parts.append(text if isinstance(text, str) else "")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return str(content["text"])
    return str(content)


def object_of(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else ``{}``: the optional sections of a recorded run."""
    return value if isinstance(value, dict) else {}


def list_of(value: Any) -> list[Any]:
    """``value`` if it is a JSON array, else ``[]``."""
    return value if isinstance(value, list) else []


def arguments_text(arguments: Any) -> str:
    """Tool-call arguments as the JSON text a model call carries (a string stays as it is)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, sort_keys=True, default=str)


def command_of(arguments: str) -> str | None:
    """The ``command`` argument of a tool call's JSON arguments, if it has a string one."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    command = parsed.get("command") if isinstance(parsed, dict) else None
    return command if isinstance(command, str) else None


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """A recorded chat message as the model saw it: role, content, reasoning, tool calls, call id, name.

    Framework bookkeeping (``extra``, ``agent``, ``message_type``, …) is dropped; contents are kept
    whole (a large one travels in parts).
    """
    out: dict[str, Any] = {"role": str(message.get("role") or "user")}
    out["content"] = message.get("content")
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str) or not reasoning:
        fields = message.get("provider_specific_fields")
        reasoning = fields.get("reasoning_content") if isinstance(fields, dict) else None
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {
                "id": str(call.get("id") or ""),
                "type": str(call.get("type") or "function"),
                "function": {
                    "name": str(object_of(call.get("function")).get("name") or ""),
                    "arguments": arguments_text(object_of(call.get("function")).get("arguments")),
                },
            }
            for call in calls
            if isinstance(call, dict)
        ]
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str) and message[key]:
            out[key] = message[key]
    ids = message.get("tool_call_ids")  # SWE-agent v1: the calls a tool message answers
    if "tool_call_id" not in out and isinstance(ids, list) and ids and isinstance(ids[0], str):
        out["tool_call_id"] = ids[0]
    return out


def apportion(total: int, parts: int) -> list[int]:
    """Split an integer total into ``parts`` near-equal integers that sum to it exactly."""
    if parts <= 0:
        return []
    base, remainder = divmod(max(int(total), 0), parts)
    return [base + (1 if i < remainder else 0) for i in range(parts)]


# What a framework's exit status means, by meaning rather than by framework: each pattern is
# matched (case-insensitively) against the exit status and the last line of the exception.
_LIMIT = re.compile(
    r"limitsexceeded|limit[s]? (?:reached|exceeded)|exit_cost|exit_context|exit_total_execution_time|cost limit"
    r"|step limit|step_limit|max[_ ]?iterations?|maximum iterations?|maximum number of (?:steps|iterations)"
    r"|max_steps|context ?window|context length|contextwindowexceeded|budget exceeded|token limit|max_tokens"
    r"|time limit|time_limit|iteration limit|maxiterationsreached|budget exceeded|agenttimeouterror",
    re.IGNORECASE,
)
_INFRASTRUCTURE = re.compile(
    r"internalservererror|serviceunavailable|apiconnectionerror|apierror|apitimeouterror|badgateway"
    r"|authenticationerror|authentication|unauthorized|permissiondenied|invalid api key|ratelimit|rate[ _-]limit"
    r"|too many requests|overloaded|timeout|timed out|connection|sandbox|runtime|docker|container|environment"
    r"|\b(?:401|403|429|500|502|503|504|529)\b|oom|out of memory|crash",
    re.IGNORECASE,
)
_DONE = re.compile(r"^\s*(?:submitted|submit|finish(?:ed)?|done|completed?|success|terminal|agent_finished)\b", re.I)
_GAVE_UP = re.compile(
    r"exit_forfeit|forfeit|gave[ _]up|give[ _]up|exit_format|formaterror|format error|agentstuck|stuck in a loop", re.I
)


def exit_outcome(exit_status: str | None, exception: str | None = None) -> str:
    """The trajlake session status a framework's exit status (and the exception it ended on) means.

    ``completed`` when the agent finished and submitted (whether it was right is the evaluation's
    business); ``capped`` when it hit a step, iteration, cost, context or time limit of its
    framework (failure cause ``limit_reached``, even when the framework raised it as an error);
    ``error`` when the model API, the sandbox or the host broke (``infrastructure_error``);
    ``gave_up`` when it forfeited or kept breaking the output format; ``failed`` otherwise. The
    framework's own words stay in ``exit_reason``.
    """
    status = exit_status or ""
    last = (exception or "").strip().splitlines()[-1] if exception and exception.strip() else ""
    both = f"{status} {last}"
    if _LIMIT.search(both):
        return "capped"
    if _GAVE_UP.search(both):
        return "gave_up"
    if last or _INFRASTRUCTURE.search(status) or re.search(r"error|exception", status, re.I):
        return "error"
    if _DONE.search(status):
        return "completed"
    return "failed"


def exit_reason(exit_status: str | None, exception: str | None = None) -> str | None:
    """The framework's own words: its exit status, and the last line of the exception it ended on."""
    status = (exit_status or "").strip()
    last = (exception or "").strip().splitlines()[-1].strip() if exception and exception.strip() else ""
    if last and last not in status:
        return f"{status}: {last}" if status else last
    return status or None


__all__ = [
    "FieldIssues",
    "ImportFormatError",
    "ImportedSession",
    "JsonLines",
    "RunBuilder",
    "SourceFile",
    "Verdict",
    "apportion",
    "arguments_text",
    "chat_message",
    "command_of",
    "digest",
    "exit_outcome",
    "exit_reason",
    "list_of",
    "object_of",
    "read_source",
    "text_of",
]
