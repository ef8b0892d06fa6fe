"""The producer SDK a sandbox host embeds.

``EventProducer`` owns one idempotent Kafka producer (``enable.idempotence``,
``acks=all``): every event is keyed by ``session_id``, so one session's events
stay on one partition in order. ``SessionEmitter`` assigns each session's
``seq`` from 0 and a fresh ``event_id`` per event, fills the envelope, and
redacts secrets before the event is encoded.

Example::

    with EventProducer.from_settings(host_id="host-1") as producer:
        session = producer.session(task_id="t1", task_type="bugfix", sandbox_id="sb1",
                                   image_name="py", image_version="1")
        session.start(cpu_limit=1, memory_limit_bytes=1 << 30, pids_limit=64, timeout_s=600,
                      network_enabled=False, config_digest="...")
        action_id = session.action(tool_name="bash", command="pytest -q", output_tokens=12)
        session.feedback(action_id, output="1 passed", exit_code=0, duration_ms=800)
        session.end(status="completed", runtime_s=3.2)
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from producers.errors import DeliveryError
from producers.redact import redact_value
from schemas.registry import encode_event

Event = dict[str, Any]

log = logging.getLogger("trajlake.producer")


def now_micros() -> int:
    """Current wall-clock time in microseconds since the epoch."""
    return time.time_ns() // 1000


def new_event_id() -> str:
    """A random 128-bit event id as 32 hex digits."""
    return uuid.uuid4().hex


def producer_config(bootstrap: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """librdkafka settings for a loss-free, idempotent, per-key ordered producer."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "batch.size": 1 << 20,
        "compression.type": "lz4",
        # Keep retrying through short outages instead of failing the event.
        "message.timeout.ms": 300_000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1 << 20,
    }
    config.update(extra or {})
    return config


class EventProducer:
    """Encode, key and deliver events to the event topic.

    Args:
        bootstrap: Kafka bootstrap servers.
        topic: the event topic.
        host_id: this sandbox host, recorded in every event.
        extra_config: additional librdkafka settings (security etc.).
        schema_version: writer schema version; the latest by default.
        redact: redact secrets in every string field before encoding.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        host_id: str,
        extra_config: dict[str, str] | None = None,
        schema_version: int | None = None,
        redact: bool = True,
    ) -> None:
        self.topic = topic
        self.host_id = host_id
        self.schema_version = schema_version
        self.redact = redact
        self._producer = Producer(producer_config(bootstrap, extra_config), logger=log)
        self._lock = threading.Lock()
        self.produced = 0
        self.delivered = 0
        self.failed: list[tuple[str, str]] = []  # (event_id, error)

    @classmethod
    def from_settings(cls, host_id: str, **kwargs: Any) -> EventProducer:
        """A producer configured from ``TRAJLAKE_*`` settings (embedded broker by default)."""
        from pipelines.broker import resolve_bootstrap
        from pipelines.settings import load_settings

        settings = load_settings()
        return cls(resolve_bootstrap(settings), settings.topic, host_id, extra_config=settings.kafka_extra, **kwargs)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        with self._lock:
            if err is None:
                self.delivered += 1
            else:
                self.failed.append((msg.headers()[0][1].decode() if msg.headers() else "?", str(err)))

    def encode(self, event: Event) -> bytes:
        """Redact (if enabled) and encode one event."""
        if self.redact:
            event = redact_value(event)
        return encode_event(event, self.schema_version)

    def emit(self, event: Event) -> str:
        """Encode and enqueue one complete event; returns its ``event_id``.

        Raises:
            EncodeError: the event does not fit the schema.
            DeliveryError: the local queue stays full for 30 s (Kafka unreachable).
        """
        self.send(event["session_id"], event["event_id"], self.encode(event))
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Enqueue already-encoded bytes keyed by ``session_id``."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value=value,
                    key=session_id.encode(),
                    headers=[("event_id", event_id.encode())],
                    on_delivery=self._on_delivery,
                )
                self.produced += 1
                break
            except BufferError as exc:
                if time.monotonic() > deadline:
                    raise DeliveryError(f"local queue full for 30 s; is Kafka reachable? ({exc})") from exc
                self._producer.poll(0.1)
        self._producer.poll(0)

    def session(self, **envelope: Any) -> SessionEmitter:
        """Start emitting a new session; ``envelope`` fills the envelope fields."""
        return SessionEmitter(self.emit, host_id=self.host_id, **envelope)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every enqueued event is acknowledged.

        Raises:
            DeliveryError: some events failed, or were not acknowledged within ``timeout``.
        """
        remaining = self._producer.flush(timeout)
        if remaining:
            raise DeliveryError(f"{remaining} events not acknowledged by Kafka within {timeout:.0f} s")
        if self.failed:
            first = self.failed[0]
            raise DeliveryError(f"{len(self.failed)} events failed delivery; first {first[0]}: {first[1]}")

    def close(self, timeout: float = 60.0) -> None:
        """Flush and release the producer."""
        self.flush(timeout)

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._producer.flush(10)


class SessionEmitter:
    """Builds one session's events: envelope, ``seq`` from 0, ``event_id``, timestamps.

    Args:
        sink: receives every complete event (``EventProducer.emit`` or a list's ``append``).
        session_id: defaults to a new random id.
        clock: returns event time in micros; wall clock by default.
        id_factory: returns new event ids; random by default (seeded in synthetic fleets).
        envelope: ``sandbox_id``, ``task_id``, ``task_type``, ``image_name``, ``image_version``,
            ``host_id`` and optional ``agent_*``/``policy_version``/``extra``.
    """

    def __init__(
        self,
        sink: Callable[[Event], Any],
        session_id: str | None = None,
        clock: Callable[[], int] = now_micros,
        id_factory: Callable[[], str] = new_event_id,
        **envelope: Any,
    ) -> None:
        self._sink = sink
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

    def emit(
        self,
        event_type: str,
        payload: dict[str, Any],
        source: str,
        *,
        ts: int | None = None,
        parent_event_id: str | None = None,
        agent_message_id: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> str:
        """Emit one event of any kind; returns its ``event_id``."""
        event_id = self._new_id()
        event = {
            "event_id": event_id,
            "session_id": self.session_id,
            "seq": self.seq,
            "ts": ts if ts is not None else self._clock(),
            "event_type": event_type,
            "source": source,
            **self.envelope,
            "agent_message_id": agent_message_id,
            "parent_event_id": parent_event_id,
            "payload": payload,
        }
        if extra:
            event["extra"] = {**self.envelope["extra"], **extra}
        self.seq += 1
        self._sink(event)
        return event_id

    def start(self, **payload: Any) -> str:
        """``session_start``: limits, config digest, egress allowlist, instruction."""
        return self.emit("session_start", payload, "system")

    def agent_input(self, **payload: Any) -> str:
        """``agent_input``: prompt digest and token counts (incl. cached)."""
        payload.setdefault("prompt_digest", "")
        return self.emit("agent_input", payload, "agent", agent_message_id=payload.pop("message_id", None))

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
        return self.emit("agent_action", payload, "agent", agent_message_id=message_id)

    def feedback(self, action_event_id: str, **payload: Any) -> str:
        """``env_feedback`` answering the action ``action_event_id``."""
        output = payload.setdefault("output", "")
        payload.setdefault("tool_call_id", "")
        payload.setdefault("output_bytes", len(output.encode()))
        payload.setdefault("duration_ms", 0.0)
        return self.emit("env_feedback", payload, "environment", parent_event_id=action_event_id)

    def resource_sample(self, **payload: Any) -> str:
        """``resource_sample``: CPU, memory, processes, disk writes, network requests."""
        return self.emit("resource_sample", payload, "system")

    def file_op(self, op: str, path: str, **payload: Any) -> str:
        """``file_op`` observed in the sandbox."""
        return self.emit("file_op", {"op": op, "path": path, **payload}, "environment")

    def network_request(self, host: str, port: int, allowed: bool, **payload: Any) -> str:
        """``network_request``: an egress attempt, allowed or not."""
        return self.emit("network_request", {"host": host, "port": port, "allowed": allowed, **payload}, "system")

    def evaluation(self, **payload: Any) -> str:
        """``evaluation``: the hidden-test result from a fresh sandbox."""
        return self.emit("evaluation", payload, "evaluator")

    def end(self, status: str, runtime_s: float, **payload: Any) -> str:
        """``session_end``: final status, reward, runtime and resource peaks."""
        return self.emit("session_end", {"status": status, "runtime_s": runtime_s, **payload}, "system")


__all__ = ["EventProducer", "SessionEmitter", "KafkaException", "new_event_id", "now_micros"]
