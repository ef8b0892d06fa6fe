"""Values read from recorded runs, made safe one field at a time.

A recorded run is untrusted input: timestamps of 1e300, ``Infinity`` token counts, ids of
megabytes, strings with lone surrogates. Each reader here returns a usable value or ``None``
and records what it dropped in a :class:`FieldIssues`, so one bad field never costs the session
(the session lands, its ``session_end`` lists the fields that were set aside, the import
summary reports them) and never ends in a traceback.

:func:`conform_event` walks a finished event against the Avro schema and fixes what the reader
functions could not see coming: integers outside their Avro range, non-finite or absurd
floats, unpaired surrogates, oversized ids.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

from schemas.registry import latest, snake_case

#: Largest magnitude a measured number may have (assembly NULLs anything beyond it as well).
MAX_MAGNITUDE = 1e15
#: Longest id kept as it is (event, session, task, tool-call ids); a longer one is shortened to a
#: prefix and the sha256 of the whole, which stays unique.
MAX_ID_CHARS = 512
#: Longest value of the envelope's ``extra`` map kept as it is (a task family, a run's own id, …).
MAX_EXTRA_CHARS = 4096
#: Envelope and payload fields that are identifiers, not text.
ID_FIELDS = frozenset(
    {
        "event_id",
        "session_id",
        "sandbox_id",
        "task_id",
        "task_type",
        "host_id",
        "image_name",
        "image_version",
        "agent_name",
        "agent_version",
        "agent_model",
        "policy_version",
        "agent_message_id",
        "parent_event_id",
        "trace_id",
        "group_id",
        "retry_of",
        "tool_call_id",
        "tool_name",
        "evaluator",
        "provenance",
        "status",
        "model",
        "response_model",
        "response_id",
    }
)
#: Fields whose text may be of any size (split into parts when too large for one event); every other string
#: is a label, kept up to :data:`MAX_EXTRA_CHARS`.
LARGE_TEXT_FIELDS = frozenset(
    {
        "output",
        "failure_reason",
        "thought",
        "arguments",
        "command",
        "instruction",
        "content",
        "details",
        "exit_reason",
        "text",
        "value",
    }
)
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
# Earliest and latest instants a recorded run may claim (the Unix epoch, the year 9999).
_MIN_US, _MAX_US = 0, 253_402_300_799_000_000


@dataclass
class FieldIssues:
    """What was set aside while importing one session: ``(field, reason)`` pairs, in order."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, where: str, reason: str) -> None:
        """Record that ``where`` held a value that could not be kept as it was."""
        self.items.append((where, reason))

    def summary(self, limit: int = 20) -> str:
        """One line naming the fields (at most ``limit``, then a count)."""
        shown = [f"{where}: {reason}" for where, reason in self.items[:limit]]
        more = len(self.items) - limit
        return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")

    def __bool__(self) -> bool:
        return bool(self.items)


def safe_text(value: str, where: str, issues: FieldIssues) -> str:
    """``value`` with unpaired surrogates replaced by U+FFFD (they cannot be UTF-8)."""
    if value.isascii():
        return value  # (no encoded copy of a large text just to look)
    try:
        for start in range(0, len(value), 1 << 18):
            value[start : start + (1 << 18)].encode("utf-8")
    except UnicodeEncodeError:
        issues.add(where, "unpaired surrogate replaced")
        return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in value)
    return value


def safe_id(value: str, where: str, issues: FieldIssues, limit: int = MAX_ID_CHARS) -> str:
    """An id no longer than ``limit`` characters (a longer one: its head and the sha256 of the whole)."""
    value = safe_text(value, where, issues)
    if len(value) <= limit:
        return value
    issues.add(where, f"value of {len(value)} characters shortened")
    return f"{value[: limit - 72]}…sha256:{hashlib.sha256(value.encode()).hexdigest()}"


def number(value: Any, where: str, issues: FieldIssues) -> float | None:
    """A finite number of sane magnitude from ``value`` (int, float or numeric string), else None."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        result = float(value)
    except (TypeError, ValueError, OverflowError):
        issues.add(where, f"not a number: {str(value)[:40]!r}")
        return None
    if not math.isfinite(result) or abs(result) > MAX_MAGNITUDE:
        issues.add(where, f"out of range: {str(value)[:40]}")
        return None
    return result


def count(value: Any, where: str, issues: FieldIssues) -> int:
    """A non-negative count (tokens, steps) from ``value``; 0 when absent, set aside when out of range."""
    result = number(value, where, issues)
    if result is None:
        return 0
    if result < 0:
        issues.add(where, f"negative count {result:g}")
        return 0
    return int(result)


def optional_count(value: Any, where: str, issues: FieldIssues) -> int | None:
    """Like :func:`count`, but None when absent."""
    return None if value is None else count(value, where, issues)


def unix_micros(value: Any, where: str, issues: FieldIssues) -> int | None:
    """Unix seconds (int/float/numeric string) as epoch micros, or None (absent or out of range)."""
    seconds = number(value, where, issues)
    if seconds is None:
        return None
    micros = int(seconds * 1_000_000)
    if not _MIN_US <= micros <= _MAX_US:
        issues.add(where, f"time out of range: {seconds:g}")
        return None
    return micros


def unix_nanos_micros(value: Any, where: str, issues: FieldIssues) -> int | None:
    """Unix nanoseconds (OTLP ``*UnixNano``, an int or a decimal string) as epoch micros, or None."""
    if value is None or value == "":
        return None
    try:
        nanos = int(value)
    except (TypeError, ValueError):
        issues.add(where, f"not a time: {str(value)[:40]!r}")
        return None
    micros = nanos // 1000
    if not _MIN_US <= micros <= _MAX_US:
        issues.add(where, f"time out of range: {nanos}")
        return None
    return micros


def iso_micros(value: Any, where: str, issues: FieldIssues) -> int | None:
    """ISO-8601 time as epoch micros (no zone: UTC), or None when absent or not a time."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return unix_micros(value, where, issues)
    text = str(value)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except (ValueError, OverflowError):
        issues.add(where, f"not an ISO-8601 time: {text[:40]!r}")
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        micros = int(parsed.timestamp() * 1_000_000)
    except (OverflowError, OSError, ValueError):
        issues.add(where, f"time out of range: {text[:40]}")
        return None
    if not _MIN_US <= micros <= _MAX_US:
        issues.add(where, f"time out of range: {text[:40]}")
        return None
    return micros


@cache
def _record_schemas() -> dict[str, Any]:
    """Avro record schemas of the newest version by name (the envelope is ``Event``)."""
    records: dict[str, Any] = {}
    stack = [latest().raw]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("type") == "record":
                records[node["name"]] = node
                stack.extend(f["type"] for f in node["fields"])
            elif node.get("type") == "array":
                stack.append(node["items"])
    return records


def _branches(avro: Any) -> list[Any]:
    return avro if isinstance(avro, list) else [avro]


def _conform(value: Any, avro: Any, where: str, issues: FieldIssues, name: str) -> Any:
    """``value`` fitted to the Avro type ``avro``: out-of-range numbers nulled (or zeroed), text made UTF-8."""
    branches = _branches(avro)
    nullable = "null" in branches
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if name in ID_FIELDS:
            return safe_id(value, where, issues)
        if name in LARGE_TEXT_FIELDS:
            return safe_text(value, where, issues)
        return safe_id(value, where, issues, MAX_EXTRA_CHARS)
    if isinstance(value, int):
        kind = next((b for b in branches if b in ("int", "long", "double")), None)
        low, high = _INT32 if kind == "int" else _INT64
        if kind in ("int", "long") and not low <= value <= high:
            issues.add(where, f"out of range: {value}")
            return None if nullable else 0
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
            issues.add(where, f"out of range: {value}")
            return None if nullable else 0.0
        return value
    if isinstance(value, dict):
        record = next((b for b in branches if isinstance(b, dict) and b.get("type") == "record"), None)
        if record is not None:
            return conform_record(value, record, where, issues)
        mapped = next((b for b in branches if isinstance(b, dict) and b.get("type") == "map"), None)
        if mapped is not None:  # the envelope's extra: short labels and ids, never a payload's worth
            return {
                safe_id(str(k), where, issues, MAX_EXTRA_CHARS): safe_id(v, f"{where}.{k}", issues, MAX_EXTRA_CHARS)
                if isinstance(v, str)
                else _conform(v, mapped["values"], f"{where}.{k}", issues, "")
                for k, v in value.items()
            }
        return value
    if isinstance(value, list):
        array = next((b for b in branches if isinstance(b, dict) and b.get("type") == "array"), None)
        if array is None:
            return value
        return [_conform(item, array["items"], f"{where}[{i}]", issues, name) for i, item in enumerate(value)]
    return value


def conform_record(value: dict[str, Any], record: Any, where: str, issues: FieldIssues) -> dict[str, Any]:
    """A record's fields fitted to their Avro types (see :func:`conform_event`)."""
    if isinstance(record, str):
        record = _record_schemas()[record]
    types = {f["name"]: f["type"] for f in record["fields"]}
    out = {}
    for key, item in value.items():
        avro = types.get(key)
        path = f"{where}.{key}" if where else key
        out[key] = item if avro is None else _conform(item, avro, path, issues, key)
    return out


def conform_event(event: dict[str, Any], issues: FieldIssues) -> dict[str, Any]:
    """The event with every field inside its Avro type's range; what had to change is added to ``issues``.

    Integers beyond int/long, floats that are not finite or beyond :data:`MAX_MAGNITUDE` become
    null (0 where the field cannot be null); unpaired surrogates become U+FFFD; ids longer than
    :data:`MAX_ID_CHARS` are shortened (unique by their sha256).
    """
    records = _record_schemas()
    envelope = {k: v for k, v in event.items() if k != "payload"}
    out = conform_record(envelope, records["Event"], "", issues)
    kind = event.get("event_type")
    payload_record = next(
        (r for name, r in records.items() if isinstance(kind, str) and snake_case(name) == kind and name != "Event"),
        None,
    )
    payload = event.get("payload")
    if isinstance(payload, dict) and payload_record is not None:
        out["payload"] = conform_record(payload, payload_record, str(kind), issues)
    else:
        out["payload"] = payload
    return out
