"""The producer SDK a sandbox host embeds.

``EventProducer`` owns one idempotent Kafka producer (``enable.idempotence``,
``acks=all``): every event is keyed by ``session_id``, so one session's events
stay on one partition in order. ``SessionEmitter`` assigns each session's
``seq`` from 0 and a fresh ``event_id`` per event, fills the envelope, and
redacts secrets before the event leaves it, with the session's earlier events in
view (``SessionRedactor``: a token or private key split across two events).

With ``spool_dir`` set, a producer keeps accepting events while Kafka is down:
when librdkafka reports all brokers down (or its queue is full) the queued,
unsent events and every new one go to a bounded on-disk ``Spool`` in emission
order; a background thread re-delivers them, oldest first, once a metadata
request succeeds again, and only then are events produced directly again, so
each session's order holds. A new producer on the same spool directory resumes
delivery of what an earlier process left behind. When the spool is full,
``emit`` raises ``SpoolFullError`` (back-pressure). Delivery is at least once
for the rare event that was in flight when the process stopped during an
outage (it is spooled again rather than risk losing it).

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

import logging
import math
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from producers.emitter import Event, SessionEmitter, new_event_id, now_micros
from producers.errors import DeliveryError, NonFiniteNumberError
from producers.redact import SessionRedactors
from producers.spool import Spool, SpooledEvent
from schemas.registry import encode_event

log = logging.getLogger("trajlake.producer")


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


def check_finite(event: Event) -> None:
    """Refuse an event whose payload holds NaN or ±infinity: no measurement has those values.

    Avro encodes them, but they would poison every sum downstream; refusing them here gives the
    sandbox host a clear error at the line that produced the value.

    Raises:
        NonFiniteNumberError: naming the event type and the field.
    """
    stack: list[tuple[str, Any]] = [("payload", event.get("payload"))]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteNumberError(
                f"{event.get('event_type')} event of session {event.get('session_id')}: {where} is {value}; "
                "send a finite number or null"
            )
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}", v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))


class EventProducer:
    """Encode, key and deliver events to the event topic.

    Args:
        bootstrap: Kafka bootstrap servers.
        topic: the event topic.
        host_id: this sandbox host, recorded in every event.
        extra_config: additional librdkafka settings (security etc.).
        schema_version: writer schema version; the latest by default.
        redact: redact secrets in every string field before encoding.
        spool_dir: directory of the on-disk outage spool; ``None`` (default) disables spooling,
            and ``emit`` then blocks up to 30 s on a full queue as before.
        spool_max_bytes: bound on the spool's undelivered bytes; past it ``emit`` raises
            ``SpoolFullError``.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        host_id: str,
        extra_config: dict[str, str] | None = None,
        schema_version: int | None = None,
        redact: bool = True,
        spool_dir: str | Path | None = None,
        spool_max_bytes: int = 256 << 20,
    ) -> None:
        self.topic = topic
        self.host_id = host_id
        self.schema_version = schema_version
        self.redact = redact
        config = producer_config(bootstrap, extra_config)
        self._spool = Spool(spool_dir, spool_max_bytes) if spool_dir is not None else None
        if self._spool is not None:
            config["error_cb"] = self._on_error
        self._producer = Producer(config, logger=log)
        self._lock = threading.Lock()
        # Serialises the switch between direct and spooled delivery against concurrent sends.
        self._mode_lock = threading.RLock()
        self._kafka_down = False
        self._outage_entered = False  # queued events of this outage were moved to the spool
        self._closed = threading.Event()
        self.produced = 0
        self.delivered = 0
        self.spooled = 0  # events that went through the spool
        self.failed: list[tuple[str, str]] = []  # (event_id, error)
        self._drainer: threading.Thread | None = None
        if self._spool is not None:
            self._drainer = threading.Thread(target=self._drain_loop, name="trajlake-spool-drain", daemon=True)
            self._drainer.start()

    @classmethod
    def from_settings(cls, host_id: str, **kwargs: Any) -> EventProducer:
        """A producer configured from ``TRAJLAKE_*`` settings (embedded broker by default).

        The outage spool is on, in ``TRAJLAKE_SPOOL_DIR`` (default ``home/spool``) bounded by
        ``TRAJLAKE_SPOOL_MAX_BYTES``; pass ``spool_dir=None`` to turn it off.
        """
        from common.broker import resolve_bootstrap
        from common.settings import load_settings

        settings = load_settings()
        kwargs.setdefault("spool_dir", settings.spool_path)
        kwargs.setdefault("spool_max_bytes", settings.spool_max_bytes)
        return cls(resolve_bootstrap(settings), settings.topic, host_id, extra_config=settings.kafka_extra, **kwargs)

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        headers = msg.headers()  # at run time a list of (name, bytes) pairs, event_id first
        first = headers[0][1] if isinstance(headers, list) and headers else None
        event_id = first.decode() if isinstance(first, bytes) else "?"
        if err is not None and self._spool is not None:
            # Purged (we moved it out of the queue during an outage) or timed out: keep it on disk.
            self._spool.append((msg.key() or b"").decode(), event_id, msg.value() or b"")
            with self._lock:
                self.spooled += 1
            return
        with self._lock:
            if err is None:
                self.delivered += 1
            else:
                self.failed.append((event_id, str(err)))

    # -- outage spool --------------------------------------------------------------

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN and self._spool is not None:  # registered only with a spool
            log.warning("all Kafka brokers down; spooling events to %s", self._spool.directory)
            self._kafka_down = True

    def _enter_outage(self) -> None:
        """Move queued, unsent events into the spool (in order) so newer events queue behind them."""
        with self._mode_lock:
            self._kafka_down = True
            self._outage_entered = True
            self._producer.purge(in_queue=True, in_flight=False, blocking=True)
            self._producer.poll(0)  # serves the purge callbacks, which append to the spool

    def _kafka_reachable(self) -> bool:
        try:
            meta = self._producer.list_topics(self.topic, timeout=1.0)
        except KafkaException:
            return False
        topic = meta.topics.get(self.topic)
        return bool(meta.brokers) and topic is not None and topic.error is None

    def _drain_once(self) -> bool:
        """Deliver the spooled events, oldest first; True when the spool is empty afterwards."""
        assert self._spool is not None
        records = self._spool.pending()
        if not records:
            return True
        acked: dict[int, bool] = {}

        def on_delivery(record: SpooledEvent, err: KafkaError | None, _msg: Message) -> None:
            acked[record.end] = err is None

        for record in records:
            while True:
                try:
                    self._producer.produce(
                        self.topic,
                        value=record.value,
                        key=record.session_id.encode(),
                        headers=[("event_id", record.event_id.encode())],
                        on_delivery=partial(on_delivery, record),
                    )
                    break
                except BufferError:
                    self._producer.poll(0.1)
        self._producer.flush(30)
        delivered_to = 0
        for record in records:  # only a contiguous delivered prefix may leave the spool, to keep order
            if not acked.get(record.end):
                break
            delivered_to = record.end
        self._spool.ack(delivered_to)
        with self._lock:
            self.delivered += sum(1 for r in records if r.end <= delivered_to)
        if delivered_to != records[-1].end:
            log.warning("spool drain stopped after %d of %d events", sum(acked.values()), len(records))
            self._kafka_down = True
            return False
        return not self._spool

    def _drain_loop(self) -> None:
        while not self._closed.wait(0.2):
            with self._mode_lock:  # delivery callbacks may spool events: keep them ordered with sends
                self._producer.poll(0)
                if self._kafka_down and not self._outage_entered:
                    self._enter_outage()
            if not self._spool:
                continue
            if self._kafka_down and not self._kafka_reachable():
                continue
            with self._mode_lock:
                self._kafka_down = False
                self._outage_entered = False
            try:
                self._drain_once()
            except Exception:  # keep the thread alive; the events stay spooled
                log.exception("spool drain failed")
                self._kafka_down = True

    def _send_to_spool(self, session_id: str, event_id: str, value: bytes) -> None:
        assert self._spool is not None
        self._spool.append(session_id, event_id, value)
        with self._lock:
            self.produced += 1
            self.spooled += 1

    def encode(self, event: Event, redacted: bool = False) -> bytes:
        """Redact (if enabled and not ``redacted`` already) and encode one event.

        Raises:
            NonFiniteNumberError: a payload number is NaN or ±infinity.
            EncodeError: the event does not fit the schema.
        """
        check_finite(event)
        if self.redact and not redacted:
            # events emitted one by one still pass the session-level pass, per session id (bounded)
            redactors = self.__dict__.setdefault("_session_redactors", SessionRedactors())
            event = redactors.redact_event(event)
            if event.get("event_type") == "session_end":
                redactors.end(event["session_id"])
        return encode_event(event, self.schema_version)

    def emit(self, event: Event, redacted: bool = False) -> str:
        """Encode and enqueue one complete event; returns its ``event_id``.

        Args:
            event: the event.
            redacted: a ``SessionEmitter`` of this producer redacted it already (with its session's
                earlier events in view); otherwise it is redacted here, on its own.

        Raises:
            NonFiniteNumberError: a payload number is NaN or ±infinity (nothing is sent).
            EncodeError: the event does not fit the schema.
            DeliveryError: the local queue stays full for 30 s (Kafka unreachable).
        """
        self.send(event["session_id"], event["event_id"], self.encode(event, redacted))
        return event["event_id"]

    def send(self, session_id: str, event_id: str, value: bytes) -> None:
        """Enqueue already-encoded bytes keyed by ``session_id``.

        Raises:
            SpoolFullError: Kafka is down and the spool is full (only with ``spool_dir``).
            DeliveryError: no spool and the local queue stays full for 30 s.
        """
        if self._spool is not None:
            with self._mode_lock:
                if self._kafka_down and not self._outage_entered:
                    self._enter_outage()  # older queued events must reach the spool before this one
                if self._kafka_down or self._spool:
                    self._send_to_spool(session_id, event_id, value)
                    return
                try:
                    self._producer.produce(
                        self.topic,
                        value=value,
                        key=session_id.encode(),
                        headers=[("event_id", event_id.encode())],
                        on_delivery=self._on_delivery,
                    )
                    self.produced += 1
                except BufferError:
                    self._enter_outage()
                    self._send_to_spool(session_id, event_id, value)
                self._producer.poll(0)
            return
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
        if not self.redact:
            return SessionEmitter(self.emit, host_id=self.host_id, **envelope)
        return SessionEmitter(partial(self.emit, redacted=True), host_id=self.host_id, redact=True, **envelope)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every enqueued event is acknowledged.

        Raises:
            DeliveryError: some events failed, or were not acknowledged within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        remaining = self._producer.flush(timeout)
        if self._spool is not None:
            while (self._spool or len(self._producer)) and time.monotonic() < deadline:
                self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
                time.sleep(0.05)
            if self._spool:
                raise DeliveryError(
                    f"{len(self._spool)} events still spooled in {self._spool.directory} after {timeout:.0f} s "
                    "(Kafka unreachable); they are delivered when it returns, also by a restarted producer"
                )
            remaining = len(self._producer)
        if remaining:
            raise DeliveryError(f"{remaining} events not acknowledged by Kafka within {timeout:.0f} s")
        if self.failed:
            first = self.failed[0]
            raise DeliveryError(f"{len(self.failed)} events failed delivery; first {first[0]}: {first[1]}")

    def close(self, timeout: float = 60.0) -> None:
        """Flush and release the producer.

        With a spool, events Kafka did not take within ``timeout`` stay on disk for the next
        producer on the same ``spool_dir`` instead of failing.
        """
        if self._spool is None:
            self.flush(timeout)
            return
        try:
            self.flush(timeout)
        except DeliveryError as exc:
            log.warning("closing with undelivered events: %s", exc)
        self._closed.set()
        if self._drainer is not None:
            self._drainer.join()
        with self._mode_lock:
            # In-flight events too: spooling one that Kafka did store risks a duplicate, dropping it a loss.
            self._producer.purge(in_queue=True, in_flight=True, blocking=True)
            self._producer.poll(0)
        self._spool.close()

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self._spool is not None:
            self.close(10)
        else:
            self._producer.flush(10)


__all__ = ["Event", "EventProducer", "KafkaException", "SessionEmitter", "new_event_id", "now_micros"]
