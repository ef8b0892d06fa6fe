"""An OTLP/HTTP trace receiver: instrumented agents export spans to it, their sessions go to Kafka.

``POST /v1/traces`` takes an ``ExportTraceServiceRequest`` as protobuf (``application/x-protobuf``,
what OpenTelemetry's OTLP/HTTP exporters send) or JSON, gzip-compressed or not. Spans are
buffered per conversation (``gen_ai.conversation.id``, else the trace) and converted by the same
mapping as OTLP files (:mod:`producers.importers.otel`) once the conversation looks finished: its
root span has ended and no span came for ``settle_s``, or nothing came for ``idle_s``. The session
then goes to the sink whole (keyed by its session id, which derives from the conversation).

A span that arrives after its conversation was sent re-sends the conversation: event ids derive
from span ids, so what was sent before is sent with the same ids (ingest and assembly keep it
once) and only the new events are new. Conversations are kept ``retain_s`` after they were sent
for that; memory is bounded by ``max_spans`` buffered spans (the oldest conversations are sent
early when it is reached).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from producers.importers._builder import OTLP_SOURCE, ImportedSession
from producers.importers._source import ImportFormatError, SourceFile
from producers.importers._values import FieldIssues
from producers.importers.otel import Span, convert_spans, group_sessions, spans_from_json, spans_from_proto

log = logging.getLogger("trajlake.otlp")

#: Largest request body taken (an exporter batches 512 spans by default).
MAX_BODY_BYTES = 64 << 20


@dataclass
class _Conversation:
    spans: dict[str, Span] = field(default_factory=dict)  # by span id (a span sent twice counts once)
    last_seen: float = 0.0
    root_ended: bool = False
    sent_at: float | None = None
    dirty: bool = True


class OtlpReceiver:
    """Receives OTLP/HTTP traces and sends each finished conversation as one session.

    Args:
        send: receives each session whole (the CLI encodes it all, then produces it to Kafka).
        host, port: where to listen (port 0 picks a free one; see :attr:`address`).
        settle_s: a conversation whose root span ended is sent after this long without new spans.
        idle_s: a conversation without a root span is sent after this long without new spans.
        retain_s: how long a sent conversation is kept for late spans.
        max_spans: spans buffered at most.
    """

    def __init__(
        self,
        send: Callable[[ImportedSession], Any],
        host: str = "127.0.0.1",
        port: int = 4318,
        settle_s: float = 2.0,
        idle_s: float = 60.0,
        retain_s: float = 600.0,
        max_spans: int = 1_000_000,
    ) -> None:
        self.send, self.settle_s, self.idle_s, self.retain_s, self.max_spans = (
            send,
            settle_s,
            idle_s,
            retain_s,
            max_spans,
        )
        self._conversations: dict[str, _Conversation] = {}
        self._trace_keys: dict[str, str] = {}  # trace id -> its conversation (spans without the id join it)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sessions_sent = 0
        self.spans_received = 0
        self.errors: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("otlp %s", format % args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) it listens on."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def endpoint(self) -> str:
        """The URL an OTLP/HTTP exporter sends traces to."""
        host, port = self.address
        return f"http://{host}:{port}/v1/traces"

    def start(self) -> OtlpReceiver:
        """Serve in background threads (HTTP and the flusher)."""
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="otlp-http", daemon=True),
            threading.Thread(target=self._flush_loop, name="otlp-flush", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and send every conversation still buffered."""
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        self.flush(everything=True)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests ------------------------------------------------------------------------------------------

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        if request.path.rstrip("/") != "/v1/traces":
            request.send_error(404, "only /v1/traces is served")
            return
        length = int(request.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            request.send_error(413, f"request over {MAX_BODY_BYTES} bytes")
            return
        body = request.rfile.read(length)
        content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            if (request.headers.get("Content-Encoding") or "").lower() == "gzip":
                body = gzip.decompress(body)
            spans = self._decode(body, content_type)
        except (ValueError, OSError, EOFError) as exc:
            self.errors.append(f"bad OTLP request: {exc}")
            request.send_error(400, f"not an OTLP trace request: {exc}")
            return
        self.receive(spans)
        protobuf = content_type == "application/x-protobuf"
        payload = b"" if protobuf else b"{}"
        request.send_response(200)
        request.send_header("Content-Type", "application/x-protobuf" if protobuf else "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)

    @staticmethod
    def _decode(body: bytes, content_type: str) -> list[Span]:
        if content_type == "application/json":
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError("JSON body is not an object")
            return list(spans_from_json(data, FieldIssues()))
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        message = ExportTraceServiceRequest()
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise ValueError(str(exc)) from exc
        return list(spans_from_proto(message))

    def receive(self, spans: list[Span]) -> None:
        """Buffer spans (what a request carried) under their conversations."""
        now = time.monotonic()
        with self._lock:
            self.spans_received += len(spans)
            for key, own in group_sessions(spans).items():
                if key.startswith("conversation:"):
                    for trace in {s.trace_id for s in own}:
                        self._trace_keys[trace] = key
                        early = self._conversations.pop(f"trace:{trace}", None)  # spans that came before the id
                        if early is not None:
                            self._conversations.setdefault(key, _Conversation()).spans.update(early.spans)
                else:
                    key = self._trace_keys.get(key.removeprefix("trace:"), key)
                conversation = self._conversations.setdefault(key, _Conversation())
                for span in own:
                    conversation.spans[span.span_id] = span
                    conversation.root_ended |= not span.parent_span_id and span.end_us is not None
                conversation.last_seen, conversation.dirty = now, True
            buffered = sum(len(c.spans) for c in self._conversations.values())
        if buffered > self.max_spans:
            self.flush(everything=True)

    # -- sending -------------------------------------------------------------------------------------------

    def _flush_loop(self) -> None:
        while not self._stop.wait(min(0.2, self.settle_s / 4)):
            self.flush()

    def flush(self, everything: bool = False) -> int:
        """Send every conversation that looks finished (all of them with ``everything``); how many were sent."""
        now = time.monotonic()
        ready: list[tuple[str, list[Span]]] = []
        with self._lock:
            for key, conversation in list(self._conversations.items()):
                quiet = now - conversation.last_seen
                due = quiet >= (self.settle_s if conversation.root_ended else self.idle_s)
                if conversation.dirty and (everything or due):
                    conversation.dirty, conversation.sent_at = False, now
                    ready.append((key, list(conversation.spans.values())))
                elif not conversation.dirty and conversation.sent_at and now - conversation.sent_at > self.retain_s:
                    del self._conversations[key]
        for key, spans in ready:
            self._send(key, spans)
        return len(ready)

    def _send(self, key: str, spans: list[Span]) -> None:
        spans.sort(key=lambda s: (s.start_us if s.start_us is not None else 0, s.span_id))
        digest = hashlib.sha256(f"otlp/{key}".encode()).hexdigest()
        source = SourceFile(OTLP_SOURCE, digest, None, key)
        try:
            session = convert_spans(source, key, spans)
        except ImportFormatError as exc:
            self.errors.append(f"{key}: {exc.reason}")
            log.warning("OTLP conversation %s not imported: %s", key, exc.reason)
            return
        self.send(session)
        self.sessions_sent += 1
