"""``SessionEmitter``: one session's events, each with its envelope, ``seq`` from 0 and a fresh ``event_id``.

``emit`` is typed per event kind against ``schemas.typed`` (the Avro schema's ``TypedDict``s): the
payload of a ``session_start`` must be a ``typed.SessionStart``, and so on, so a misspelt or
mistyped field is a type error where the event is built. The keyword helpers (``start``,
``agent_input``, ``action``, …) fill defaults and take the rest as keywords. With ``redact=True``
every event is redacted before its sink sees it, with the session's earlier events in view
(``SessionRedactor``). ``producers.sdk`` re-exports all of it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypedDict, Unpack, cast, overload

from producers.redact import SessionRedactor
from schemas import typed

Event = dict[str, Any]


def now_micros() -> int:
    """Current wall-clock time in microseconds since the epoch."""
    return time.time_ns() // 1000


def new_event_id() -> str:
    """A random 128-bit event id as 32 hex digits."""
    return uuid.uuid4().hex


class EmitOptions(TypedDict, total=False):
    """The envelope fields one ``emit`` call may set besides the payload."""

    ts: int | None
    parent_event_id: str | None
    agent_message_id: str | None
    extra: dict[str, str] | None


class SessionEmitter:
    """Builds one session's events: envelope, ``seq`` from 0, ``event_id``, timestamps.

    Args:
        sink: receives every complete event (``EventProducer.emit`` or a list's ``append``).
        session_id: defaults to a new random id.
        clock: returns event time in micros; wall clock by default.
        id_factory: returns new event ids; random by default (seeded in synthetic fleets).
        redact: redact every event before the sink sees it, with the session's earlier events in view
            (``SessionRedactor``: bounded state per text field). ``EventProducer.session`` and the
            local fleet turn it on; off, the sink sees events as produced (importers, generators).
        envelope: ``sandbox_id``, ``task_id``, ``task_type``, ``image_name``, ``image_version``,
            ``host_id`` and optional ``agent_*``/``policy_version``/``extra``.
    """

    def __init__(
        self,
        sink: Callable[[Event], Any],
        session_id: str | None = None,
        clock: Callable[[], int] = now_micros,
        id_factory: Callable[[], str] = new_event_id,
        redact: bool = False,
        **envelope: Any,
    ) -> None:
        self._sink = sink
        self._redactor = SessionRedactor() if redact else None
        self._clock = clock
        self._new_id = id_factory
        self.session_id = session_id or id_factory()
        self.seq = 0
        self.envelope: dict[str, Any] = {
            "sandbox_id": envelope.pop("sandbox_id", self.session_id),
            "task_id": envelope.pop("task_id"),
            "task_type": envelope.pop("task_type"),
            "host_id": envelope.pop("host_id", "unknown"),
            "image_name": envelope.pop("image_name", "unknown"),
            "image_version": envelope.pop("image_version", "0"),
            "agent_name": envelope.pop("agent_name", None),
            "agent_version": envelope.pop("agent_version", None),
            "agent_model": envelope.pop("agent_model", None),
            "policy_version": envelope.pop("policy_version", None),
            "extra": {str(k): str(v) for k, v in envelope.pop("extra", {}).items()},
        }
        if envelope:
            raise TypeError(f"unknown envelope fields: {sorted(envelope)}")

    @overload
    def emit(
        self,
        event_type: Literal["session_start"],
        payload: typed.SessionStart,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["agent_input"],
        payload: typed.AgentInput,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["agent_action"],
        payload: typed.AgentAction,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["env_feedback"],
        payload: typed.EnvFeedback,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["resource_sample"],
        payload: typed.ResourceSample,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["file_op"],
        payload: typed.FileOp,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["network_request"],
        payload: typed.NetworkRequest,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["evaluation"],
        payload: typed.Evaluation,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["session_end"],
        payload: typed.SessionEnd,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    @overload
    def emit(
        self,
        event_type: Literal["annotation"],
        payload: typed.Annotation,
        source: typed.Source,
        **options: Unpack[EmitOptions],
    ) -> str: ...

    def emit(self, event_type: str, payload: Any, source: str, **options: Unpack[EmitOptions]) -> str:
        """Emit one event of any kind; returns its ``event_id``.

        The payload of each ``event_type`` is checked statically against its ``schemas.typed``
        ``TypedDict`` (one overload per kind): a misspelt or mistyped field is a type error here,
        not a dead letter later. ``options``: ``ts`` (event time, micros; default now),
        ``parent_event_id``, ``agent_message_id`` and ``extra`` (merged over the session's).
        """
        event_id = self._new_id()
        if not self._admit(event_type):
            return event_id  # a parent id nothing refers to: whatever would answer it is not admitted either
        ts = options.get("ts")
        extra = options.get("extra")
        event = {
            "event_id": event_id,
            "session_id": self.session_id,
            "seq": self.seq,
            "ts": ts if ts is not None else self._clock(),
            "event_type": event_type,
            "source": source,
            **self.envelope,
            "agent_message_id": options.get("agent_message_id"),
            "parent_event_id": options.get("parent_event_id"),
            "payload": payload,
        }
        if extra:
            event["extra"] = {**self.envelope["extra"], **extra}
        self.seq += 1
        self._sink(self._redactor.redact_event(event) if self._redactor is not None else event)
        return event_id

    def _admit(self, event_type: str) -> bool:
        """Whether an event of ``event_type`` is emitted (every one here; a bounded emitter says otherwise)."""
        return True

    def start(self, **payload: Any) -> str:
        """``session_start``: limits, config digest, egress allowlist, instruction."""
        return self.emit("session_start", cast(typed.SessionStart, payload), "system")

    def agent_input(self, **payload: Any) -> str:
        """``agent_input``: prompt digest and token counts (incl. cached)."""
        payload.setdefault("prompt_digest", "")
        message_id, extra = payload.pop("message_id", None), payload.pop("extra", None)
        return self.emit(
            "agent_input", cast(typed.AgentInput, payload), "agent", agent_message_id=message_id, extra=extra
        )

    def action(self, tool_name: str, *, arguments: Any = None, command: str | None = None, **payload: Any) -> str:
        """``agent_action``: a tool call; ``arguments`` may be a dict (stored as JSON)."""
        if arguments is None:
            arguments = {"command": command} if command is not None else {}
        payload.update(
            tool_name=tool_name,
            arguments=arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True),
            command=command,
        )
        payload.setdefault("tool_call_id", f"call_{self.seq}")
        payload.setdefault("output_tokens", 0)
        message_id = payload.pop("message_id", None)
        return self.emit("agent_action", cast(typed.AgentAction, payload), "agent", agent_message_id=message_id)

    def feedback(self, action_event_id: str, **payload: Any) -> str:
        """``env_feedback`` answering the action ``action_event_id``."""
        output = payload.setdefault("output", "")
        payload.setdefault("tool_call_id", "")
        payload.setdefault("output_bytes", len(output.encode()))
        payload.setdefault("duration_ms", 0.0)
        feedback = cast(typed.EnvFeedback, payload)
        return self.emit("env_feedback", feedback, "environment", parent_event_id=action_event_id)

    def resource_sample(self, **payload: Any) -> str:
        """``resource_sample``: CPU, memory, processes, disk writes, network requests."""
        return self.emit("resource_sample", cast(typed.ResourceSample, payload), "system")

    def file_op(self, op: str, path: str, **payload: Any) -> str:
        """``file_op`` observed in the sandbox."""
        return self.emit("file_op", cast(typed.FileOp, {"op": op, "path": path, **payload}), "environment")

    def network_request(self, host: str, port: int, allowed: bool, **payload: Any) -> str:
        """``network_request``: an egress attempt, allowed or not."""
        request = cast(typed.NetworkRequest, {"host": host, "port": port, "allowed": allowed, **payload})
        return self.emit("network_request", request, "system")

    def evaluation(self, **payload: Any) -> str:
        """``evaluation``: the hidden-test result from a fresh sandbox."""
        return self.emit("evaluation", cast(typed.Evaluation, payload), "evaluator")

    def end(self, status: str, runtime_s: float, **payload: Any) -> str:
        """``session_end``: final status, reward, runtime and resource peaks."""
        end = cast(typed.SessionEnd, {"status": status, "runtime_s": runtime_s, **payload})
        return self.emit("session_end", end, "system")


__all__ = ["EmitOptions", "Event", "SessionEmitter", "new_event_id", "now_micros"]
