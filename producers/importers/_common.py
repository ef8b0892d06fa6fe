"""Shared machinery of the importers: reading a source file, deterministic ids and clocks, clipping.

Every importer turns one recorded run into the events a live sandbox host would
emit, through ``SessionEmitter`` with a list sink. What makes re-imports
idempotent downstream: the session id and every event id are uuid5 values
derived from the source file's sha256 and the event's position, so the same
bytes always give the same ids (ingest and assembly deduplicate by event id).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from producers.errors import ProducerError
from producers.fleet.llm.record import CallRecorder, ContentStore
from producers.sdk import Event, SessionEmitter

# Namespace of every imported id (uuid5 of a fixed name, so it never changes between releases).
IMPORT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://trajlake/importers")
# Formats without timestamps get a synthetic clock from this fixed instant (2024-01-01T00:00:00Z).
SYNTHETIC_EPOCH_US = 1_704_067_200_000_000
# One synthetic clock tick between consecutive events of a run without timestamps.
SYNTHETIC_TICK_US = 1_000
# Outputs above this are cut; the event keeps size and sha256 of the full text (ingest caps records at 1 MiB).
MAX_OUTPUT_BYTES = 256 * 1024
# Other long texts (instruction, thought, arguments) are clipped to this many bytes, for the same reason.
MAX_TEXT_BYTES = 128 * 1024


class ImportFormatError(ProducerError):
    """A recorded run cannot be imported: unknown, corrupt or truncated input (names the file and the reason)."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class SourceFile:
    """One recorded run as read from disk: its bytes' sha256 and the parsed JSON."""

    path: Path
    sha256: str
    data: Any


def read_source(path: Path | str) -> SourceFile:
    """Read and parse a JSON trajectory file.

    Raises:
        ImportFormatError: the file is missing, unreadable, not UTF-8 or not valid JSON.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ImportFormatError(path, f"cannot read file ({exc.strerror or exc})") from exc
    if not raw.strip():
        raise ImportFormatError(path, "file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFormatError(path, f"not UTF-8 text (byte {exc.start})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and text.lstrip().startswith("{"):
            return SourceFile(path, hashlib.sha256(raw).hexdigest(), json_lines(path, text))
        reason = f"not valid JSON (truncated or corrupt?): {exc.msg} at line {exc.lineno}"
        raise ImportFormatError(path, reason) from exc
    except RecursionError:  # the C parser recurses per nesting level
        raise ImportFormatError(path, f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    check_nesting(path, data)
    return SourceFile(path, hashlib.sha256(raw).hexdigest(), data)


#: Deepest nesting of lists/objects an imported file may have (real runs nest about ten levels).
MAX_JSON_DEPTH = 200


def check_nesting(path: Path, data: Any) -> None:
    """Refuse ``data`` nested deeper than :data:`MAX_JSON_DEPTH` (walked without recursion).

    Raises:
        ImportFormatError: the nesting is deeper than the cap.
    """
    stack = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ImportFormatError(path, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))


@dataclass(frozen=True)
class JsonLines:
    """A JSON Lines file: one record per non-empty line, each with the sha256 of its own bytes."""

    records: list[tuple[str, Any]]


def json_lines(path: Path, text: str) -> JsonLines:
    """Parse JSON Lines (one object per line; blank lines skipped).

    Raises:
        ImportFormatError: a line is not valid JSON (names the line).
    """
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ImportFormatError(
                path, f"line {number} is not valid JSON (truncated or corrupt?): {exc.msg}"
            ) from exc
        except RecursionError:  # the C parser recurses per nesting level
            raise ImportFormatError(path, f"line {number}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
        check_nesting(path, record)
        records.append((hashlib.sha256(line.encode()).hexdigest(), record))
    return JsonLines(records)


def text_of(content: Any) -> str:
    """Message content as text: a string, or the text parts of an OpenAI-style content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def object_of(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else ``{}``: the optional sections of a recorded run."""
    return value if isinstance(value, dict) else {}


def digest(value: Any) -> str:
    """sha256 of a value's canonical JSON (sorted keys), e.g. of the messages a model saw."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def clip(text: str | None, limit: int = MAX_TEXT_BYTES) -> str | None:
    """``text`` cut to ``limit`` UTF-8 bytes with a marker saying how much was dropped."""
    if text is None:
        return None
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + f"\n[... {len(data) - limit} bytes clipped on import]"


def clip_arguments(arguments: str) -> str:
    """Tool arguments JSON, replaced by a JSON stub with size and sha256 when too large to keep."""
    data = arguments.encode()
    if len(data) <= MAX_TEXT_BYTES:
        return arguments
    return json.dumps({"_clipped": True, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})


def iso_micros(value: str) -> int:
    """ISO-8601 time as epoch micros; times without a zone are taken as UTC."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1_000_000)


def unix_micros(value: Any) -> int | None:
    """Unix seconds (int/float/numeric string) as epoch micros, or None."""
    try:
        return int(float(value) * 1_000_000) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


_ERROR_WORDS = re.compile(r"error|exception|crash", re.IGNORECASE)
_TIMEOUT_WORDS = re.compile(r"timeout|time_limit|timelimit", re.IGNORECASE)
_DONE_WORDS = re.compile(r"^\s*(?:submitted|submit|finish(?:ed)?|done|completed?|success)\b", re.IGNORECASE)


def end_status(exit_status: str | None, resolved: bool | None = None, exception: str | None = None) -> str:
    """Map a framework's exit status (and the exception it ended on) to a trajlake session status.

    ``completed`` when the agent finished and submitted (like a fleet agent that finished; whether it
    was *right* is the evaluation's business, ``trajectories.completed``), or when an evaluation
    says the task was solved. An exception or an exit status naming an error maps to ``error`` (a
    model-API ``Timeout`` is an error of the API, not a deadline), other timeouts to ``timeout``,
    everything else (cost/context/step limits, format failures, stops) to ``failed``. The
    framework's own status is kept in ``exit_reason``.
    """
    text = exit_status or ""
    if exception and exception.strip():
        return "error"
    if resolved is True or _DONE_WORDS.search(text):
        return "completed"
    if _ERROR_WORDS.search(text):
        return "error"
    if _TIMEOUT_WORDS.search(text):
        return "timeout"
    return "failed"


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """A recorded chat message as the model saw it: role, content, reasoning, tool calls, call id, name.

    Framework bookkeeping (``extra``, ``agent``, ``message_type``, …) is dropped; long contents are
    clipped like every imported text.
    """
    out: dict[str, Any] = {"role": str(message.get("role") or "user")}
    content = message.get("content")
    out["content"] = clip(content, MAX_OUTPUT_BYTES) if isinstance(content, str) else content
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str) or not reasoning:
        fields = message.get("provider_specific_fields")
        reasoning = fields.get("reasoning_content") if isinstance(fields, dict) else None
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = clip(reasoning)
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {
                "id": str(call.get("id") or ""),
                "type": str(call.get("type") or "function"),
                "function": {
                    "name": str((call.get("function") or {}).get("name") or ""),
                    "arguments": clip_arguments(_arguments_text((call.get("function") or {}).get("arguments"))),
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


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, sort_keys=True)


def apportion(total: int, parts: int) -> list[int]:
    """Split an integer total into ``parts`` near-equal integers that sum to it exactly."""
    if parts <= 0:
        return []
    base, remainder = divmod(max(int(total), 0), parts)
    return [base + (1 if i < remainder else 0) for i in range(parts)]


@dataclass
class RunBuilder:
    """Emits one imported session through ``SessionEmitter`` into a list, with deterministic ids and time.

    Args:
        source: the file being imported.
        framework: ``swe-agent`` / ``mini-swe-agent`` / ``openhands``.
        source_format: the format as the file names it (e.g. ``mini-swe-agent-1.1``).
        envelope: ``task_id``, ``task_type``, ``image_version``, ``agent_*`` fields.
    """

    source: SourceFile
    framework: str
    source_format: str
    envelope: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    session_id: str | None = None  # the run's own id (ATIF); by default derived from the file's sha256

    def __post_init__(self) -> None:
        namespace = uuid.uuid5(IMPORT_NAMESPACE, self.source.sha256)
        # each run is self-contained: every blob its calls refer to is in its own events
        self.recorder = CallRecorder(ContentStore())
        self._namespace = namespace
        counter = itertools.count()
        self._now = SYNTHETIC_EPOCH_US
        self._fixed_id: str | None = None

        def new_id() -> str:
            if self._fixed_id is not None:
                fixed, self._fixed_id = self._fixed_id, None
                return fixed
            return uuid.uuid5(namespace, f"event/{next(counter)}").hex

        self.emitter = SessionEmitter(
            self.events.append,
            session_id=self.session_id or uuid.uuid5(namespace, "session").hex,
            clock=lambda: self._now,
            id_factory=new_id,
            host_id="importer",
            image_name=f"imported/{self.framework}",
            extra={"source_format": self.source_format, "source_sha256": self.source.sha256},
            **self.envelope,
        )

    @property
    def now(self) -> int:
        """The time the next event gets (micros)."""
        return self._now

    def at(self, ts_us: int | None) -> None:
        """Set the time of the next events; never moves backwards, so ``seq`` order and time agree."""
        if ts_us is not None:
            self._now = max(self._now, ts_us) if self.events else ts_us

    def advance(self, ts_us: int | None) -> None:
        """Move to a recorded time, or one synthetic tick on when the format has none here."""
        if ts_us is None:
            self.tick()
        else:
            self.at(ts_us)

    def tick(self, seconds: float = 0.0) -> None:
        """Advance the synthetic clock by ``seconds`` plus one tick."""
        self._now += int(max(seconds, 0.0) * 1_000_000) + SYNTHETIC_TICK_US

    def start(
        self, instruction: str, config: Any = None, *, workspace_root: str | None = None, task_family: str | None = None
    ) -> str:
        """``session_start``; limits are unknown for recorded runs and left at zero.

        Args:
            instruction: the task statement.
            config: the framework's run configuration (its digest is recorded).
            workspace_root: the framework's working directory (``/testbed``, ``/workspace``, …): the
                agent's own workspace, where its writes are not "outside the workspace".
            task_family: what novelty compares within (the benchmark instance).
        """
        extra = {"workspace_root": workspace_root} if workspace_root else {}
        if task_family:
            extra["task_family"] = task_family
        payload = {
            "cpu_limit": 0.0,
            "memory_limit_bytes": 0,
            "pids_limit": 0,
            "timeout_s": 0.0,
            "network_enabled": False,
            "egress_allowlist": [],
            "config_digest": digest(config) if config is not None else self.source.sha256,
            "instruction": clip(instruction),
        }
        return self.emitter.emit("session_start", payload, "system", extra=extra or None)

    def model_call(
        self,
        messages: list[dict[str, Any]],
        response_message: dict[str, Any],
        *,
        tools: list[dict[str, Any]] | None = None,
        model: str = "",
        sampling: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
        finish_reason: str | None = None,
        response_id: str | None = None,
        prompt_token_ids: list[int] | None = None,
        completion_token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        cost_usd: float | None = None,
    ) -> dict[str, Any]:
        """The ``model_call`` record (schema v3) of one recorded turn: the exact request and the reply.

        The run's own messages are what the model saw, so they are kept as they are (content
        addressed, a delta per call) for the exporters; token ids only when the run recorded them.
        """
        choice: dict[str, Any] = {"message": response_message, "finish_reason": finish_reason}
        if completion_token_ids:
            choice["token_ids"] = completion_token_ids
        if logprobs:
            choice["logprobs"] = {"content": [{"token": "", "logprob": value} for value in logprobs]}
        response: dict[str, Any] = {
            "id": response_id,
            "model": model or None,
            "choices": [choice],
            "usage": usage or {},
        }
        if prompt_token_ids is not None:
            response["prompt_token_ids"] = prompt_token_ids
        record = self.recorder.record(
            messages=messages,
            tools=tools,
            model=model,
            sampling=sampling or {},
            response=response,
            latency_ms=0.0,
            cost_usd=cost_usd,
        )
        # the reply as recorded (reasoning_content and all), not only role/content/tool_calls
        ref = self.recorder._ref(response_message, record["blobs"], {b["sha256"] for b in record["blobs"]})
        record["response_message_sha256"] = ref
        self.recorder._context[-1] = ref
        record["completion_tokens_text"] = [""] * len(record["completion_logprobs"])
        return record

    def evaluation_after_end(self, key: Any, **payload: Any) -> str:
        """An ``evaluation`` that arrived after the run (a report beside the file): emitted after ``session_end``.

        Its event id derives from ``key`` (the report's content), not from its position, so
        importing the run again once the report exists adds exactly this event: every earlier
        event keeps its id and payload, and a changed report is a new evaluation, not a clash.
        """
        self._fixed_id = uuid.uuid5(self._namespace, f"evaluation/{digest(key)}").hex
        return self.emitter.evaluation(**payload)

    def action(self, tool_name: str, arguments: str, command: str | None, thought: str | None, **payload: Any) -> str:
        """``agent_action`` with clipped arguments and thought."""
        return self.emitter.action(
            tool_name or "unknown",
            arguments=clip_arguments(arguments),
            command=clip(command),
            thought=clip(thought) or None,
            **payload,
        )

    def feedback(
        self,
        action_event_id: str,
        output: str,
        *,
        tool_call_id: str = "",
        exit_code: int | None = None,
        duration_ms: float = 0.0,
        elided: bool = False,
        full_bytes: int | None = None,
        failure_reason: str | None = None,
    ) -> str:
        """``env_feedback`` answering an action; outputs over 256 KiB are cut and referenced.

        Args:
            elided: the format itself already elided part of the output.
            full_bytes: size of the complete output when the format records it (else the text's size).
        """
        data = output.encode()
        size = max(full_bytes or 0, len(data))
        payload: dict[str, Any] = {
            "tool_call_id": tool_call_id or "",
            "exit_code": exit_code,
            "duration_ms": max(float(duration_ms), 0.0),
            "failure_reason": clip(failure_reason, 4096),
            "output_bytes": size,
            "truncated": elided,
        }
        if len(data) > MAX_OUTPUT_BYTES:
            payload["output"] = data[:MAX_OUTPUT_BYTES].decode(errors="ignore")
            payload["truncated"] = True
            payload["output_ref"] = {
                "uri": f"import://{self.source.sha256}/{self.emitter.seq}",
                "size_bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        else:
            payload["output"] = output
        return self.emitter.feedback(action_event_id, **payload)
