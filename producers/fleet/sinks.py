"""Where a fleet's events go: the ``EventSink`` interface and the in-process sinks.

``producers.sdk.EventProducer`` (Kafka) satisfies ``EventSink``; the sinks here keep, adapt,
count or drop events for tests, benchmarks and the fleet runner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol


class EventSink(Protocol):
    """Where a fleet's events go: ``EventProducer`` satisfies it, so does ``ListSink``."""

    def emit(self, event: dict[str, Any]) -> str:
        """Encode and deliver one event dict; returns its id."""
        ...

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Deliver one already-encoded event."""
        ...


def _decoded(value: bytes) -> dict[str, Any]:
    """Decode wire bytes back into an emitted-style event dict (``ts`` as epoch micros)."""
    from datetime import UTC, datetime, timedelta

    from schemas.registry import decode_event

    event = decode_event(value)
    event.pop("schema_version", None)
    if isinstance(event["ts"], datetime):
        event["ts"] = (event["ts"] - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return event


class ListSink:
    """An in-memory sink for tests and benchmarks (no Kafka).

    Args:
        decode: decode ``send``'s bytes back into event dicts (else keep raw bytes in ``raw``).
    """

    def __init__(self, decode: bool = True) -> None:
        self.events: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.decode = decode
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> str:
        """Keep one event dict."""
        with self._lock:
            self.events.append(event)
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Keep one encoded event (decoded when ``decode``)."""
        if self.decode:
            self.emit(_decoded(value))
        else:
            with self._lock:
                self.raw.append(value)


class CallableSink:
    """Adapts a plain callable (``list.append``, ``EventProducer.emit``) to ``EventSink``."""

    def __init__(self, func: Callable[[dict[str, Any]], Any]) -> None:
        self.func = func

    def emit(self, event: dict[str, Any]) -> str:
        """Pass one event dict to the callable."""
        self.func(event)
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Decode and pass on (slow; only for tests)."""
        self.func(_decoded(value))


class PreRedactedSink:
    """Hands events a redacting ``SessionEmitter`` produced to an ``EventProducer`` without a second pass.

    ``EventProducer.emit`` redacts each event on its own unless told it is redacted already; the
    local fleet's emitters redact every event with its session's earlier events in view.

    Args:
        producer: an ``EventProducer`` (anything whose ``emit`` takes ``redacted=True``).
    """

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def emit(self, event: dict[str, Any]) -> str:
        """Encode and deliver one event its emitter redacted."""
        return str(self.producer.emit(event, redacted=True))

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Deliver one already-encoded event."""
        self.producer.send(session_id, event_id, value)


class CountingSink:
    """Counts events on their way to another sink (thread-safe)."""

    def __init__(self, inner: EventSink) -> None:
        self.inner = inner
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, event: dict[str, Any]) -> str:
        return self.emit(event)

    def emit(self, event: dict[str, Any]) -> str:
        """Forward one event dict."""
        self.inner.emit(event)
        with self._lock:
            self.count += 1
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Forward one encoded event."""
        self.inner.send(session_id, event_id, value)
        with self._lock:
            self.count += 1


class DiscardSink:
    """Drops encoded events (generation benchmarks)."""

    def emit(self, event: dict[str, Any]) -> str:
        """Drop one event dict."""
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Drop one encoded event."""
