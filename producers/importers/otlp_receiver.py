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

A conversation belongs to the client credential that opened it (the first to post its spans).
With a credentials file (``TRAJLAKE_OTLP_TOKENS_FILE``: client name -> token) each request is authenticated
as one named client, ``extra['otlp_client'] = 'client:<name>'`` (the single ``TRAJLAKE_OTLP_TOKEN`` is the
client ``default``); with none (loopback only) the client is a fingerprint of whatever credential the request
carries, never the secret. It is part of the identity the lakehouse's admission stage checks
(``pipelines.intake.admission``). Spans another client posts under the same conversation id are
kept apart and sent only after the opener's session, so the opener is admitted first and the
other client's events are quarantined, never merged into its session.

What reaches the receiver is bounded before it is read: a request needs a ``Content-Length`` (a
number, at most ``max_body_bytes``) or chunked framing whose chunks add up to no more; anything else is
refused before the body is read. A compressed body (``gzip``, ``deflate``) is inflated in steps and
refused as soon as it passes ``max_body_bytes``, so a small bomb never inflates in full. It listens on
loopback unless given a bearer token: on any other address every request must carry
``Authorization: Bearer <token>``. A request that fails in any way answers an HTTP error; no payload
can stop the serving or the flushing thread.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from common.errors import ConfigError
from producers.importers._builder import OTLP_SOURCE, ImportedSession
from producers.importers._source import ImportFormatError, SourceFile
from producers.importers._values import FieldIssues
from producers.importers.otel import Span, convert_spans, group_sessions, spans_from_json, spans_from_proto

log = logging.getLogger("trajlake.otlp")

#: Largest request body taken, compressed or inflated (an exporter batches 512 spans by default).
MAX_BODY_BYTES = 64 << 20
#: Seconds a connection may stay silent while its request is read (a stalled client frees its thread).
READ_TIMEOUT_S = 30.0
#: Errors kept in :attr:`OtlpReceiver.errors` (the newest).
MAX_ERRORS = 1000
#: Longest chunk-size line of a chunked body (hex size plus extensions).
_MAX_CHUNK_LINE = 1024


class _Refused(Exception):
    """A request refused with an HTTP status (and a reason for the client)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def _printable(text: str, limit: int = 200) -> str:
    """``text`` as printable ASCII (an HTTP status line takes nothing else), at most ``limit`` characters."""
    return "".join(c if " " <= c <= "~" else "?" for c in text[:limit])


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_body(rfile: Any, headers: Any, limit: int) -> bytes:
    """The request body, framed by ``Content-Length`` or chunked transfer, never more than ``limit`` bytes.

    Raises:
        _Refused: 411 without framing, 400 for a malformed length or chunk, 413 past ``limit``.
    """
    encoding = [v.strip().lower() for v in ",".join(headers.get_all("Transfer-Encoding") or []).split(",") if v]
    lengths = headers.get_all("Content-Length") or []
    if encoding:
        if encoding != ["chunked"]:
            raise _Refused(501, f"transfer encoding {','.join(encoding)!r} is not supported (only chunked)")
        if lengths:  # both framings at once is how requests are smuggled: refuse
            raise _Refused(400, "both Content-Length and Transfer-Encoding")
        return _read_chunked(rfile, limit)
    if not lengths:
        raise _Refused(411, "Content-Length required")
    if len(set(lengths)) != 1 or not lengths[0].strip().isdigit() or not lengths[0].strip().isascii():
        raise _Refused(400, "Content-Length is not one non-negative number")
    length = int(lengths[0].strip())
    if length > limit:
        raise _Refused(413, f"request over {limit} bytes")
    body = rfile.read(length)
    if len(body) != length:
        raise _Refused(400, f"body ended after {len(body)} of {length} bytes")
    return bytes(body)


def _read_chunked(rfile: Any, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        line = rfile.readline(_MAX_CHUNK_LINE + 1)
        if not line.endswith(b"\n") or len(line) > _MAX_CHUNK_LINE:
            raise _Refused(400, "malformed chunk size line")
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
            raise _Refused(400, "malformed chunk size")
        size = int(size_text, 16)
        if size == 0:
            break
        total += size
        if total > limit:
            raise _Refused(413, f"request over {limit} bytes")
        chunk = rfile.read(size)
        if len(chunk) != size or rfile.read(2) != b"\r\n":
            raise _Refused(400, "chunk shorter than its size")
        parts.append(chunk)
    for _ in range(100):  # trailer fields, up to the empty line
        line = rfile.readline(_MAX_CHUNK_LINE + 1)
        if line in (b"\r\n", b"\n"):
            return b"".join(parts)
        if not line.endswith(b"\n"):
            break
    raise _Refused(400, "malformed chunk trailer")


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded from its ``Content-Encoding`` (identity, gzip, deflate), refused past ``limit`` bytes.

    Inflation goes in steps of at most the bytes still allowed, so a bomb stops at ``limit``.

    Raises:
        _Refused: 413 when the inflated body passes ``limit``, 415 for another encoding, 400 for a corrupt one.
    """
    codings = [c.strip().lower() for c in encoding.split(",") if c.strip()]
    for coding in reversed(codings):  # the last coding applied is undone first
        if coding == "identity":
            continue
        if coding in ("gzip", "x-gzip"):
            body = _inflate(body, 16 + zlib.MAX_WBITS, limit, members=True)
        elif coding == "deflate":
            try:
                body = _inflate(body, zlib.MAX_WBITS, limit, members=False)
            except _Refused as exc:
                if exc.status != 400:
                    raise
                body = _inflate(body, -zlib.MAX_WBITS, limit, members=False)  # raw deflate, as some clients send
        else:
            raise _Refused(415, f"content encoding {coding!r} is not supported (gzip, deflate)")
    return body


def _inflate(data: bytes, wbits: int, limit: int, members: bool) -> bytes:
    out: list[bytes] = []
    total = 0
    while True:
        inflater = zlib.decompressobj(wbits)
        pending = data
        try:
            while pending:
                piece = inflater.decompress(pending, limit - total + 1)
                total += len(piece)
                if total > limit:
                    raise _Refused(413, f"request over {limit} bytes once inflated")
                out.append(piece)
                pending = inflater.unconsumed_tail
                if inflater.eof:
                    break
                if not piece and not pending:
                    break
        except zlib.error as exc:
            raise _Refused(400, f"corrupt compressed body: {exc}") from None
        if not inflater.eof:
            raise _Refused(400, "compressed body is truncated")
        data = inflater.unused_data
        if not data or not members:
            if data:
                raise _Refused(400, "bytes after the compressed body")
            return b"".join(out)


#: ``extra['otlp_client']`` of spans posted without a credential.
ANONYMOUS = "anonymous"
#: ``extra['otlp_client']`` of an authenticated client: this prefix and its name in the credentials.
CLIENT_PREFIX = "client:"
#: The client name of the single ``TRAJLAKE_OTLP_TOKEN``.
DEFAULT_CLIENT = "default"


def client_id(authorization: str | None) -> str:
    """Who posted a request: a fingerprint of its ``Authorization`` credential (never the secret itself)."""
    if not authorization or not authorization.strip():
        return ANONYMOUS
    return "credential:" + hashlib.sha256(authorization.strip().encode()).hexdigest()[:16]


_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Shortest token a credentials file may hold (as ``TRAJLAKE_OTLP_TOKEN``).
MIN_TOKEN_CHARS = 16


def read_credentials(path: str | os.PathLike[str]) -> dict[str, str]:
    """The OTLP clients of a credentials file: one ``NAME:TOKEN`` a line (``#`` starts a comment).

    Names are letters, digits, ``.``, ``_``, ``-`` (up to 64); each token at least 16 printable characters
    and used by one client only. The file must be readable by its owner alone (as ssh asks of a key).

    Raises:
        ConfigError: the file is missing, readable by others, or a line is not a sound credential.
    """
    where = os.fspath(path)
    try:
        mode = os.stat(where).st_mode
        with open(where, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"OTLP credentials file {where}: cannot read it ({exc})") from None
    if mode & 0o077:
        raise ConfigError(f"OTLP credentials file {where} is readable by others: chmod 600 it")
    clients: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, token = line.partition(":")
        name, token = name.strip(), token.strip()
        if not sep or not _CLIENT_NAME.fullmatch(name):
            raise ConfigError(f"OTLP credentials file {where}, line {number}: want NAME:TOKEN with a plain name")
        if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or any(c.isspace() for c in token):
            raise ConfigError(
                f"OTLP credentials file {where}, line {number}: the token of {name} is not "
                f"{MIN_TOKEN_CHARS}+ printable characters without spaces"
            )
        if name in clients:
            raise ConfigError(f"OTLP credentials file {where}, line {number}: client {name} appears twice")
        if token in clients.values():
            raise ConfigError(f"OTLP credentials file {where}, line {number}: {name} shares a token with another")
        clients[name] = token
    if not clients:
        raise ConfigError(f"OTLP credentials file {where} names no client")
    return clients


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
        token: the bearer token every request must carry (``Authorization: Bearer …``), one client named
            ``default``; this or ``credentials`` is required when ``host`` is not a loopback address.
        credentials: client name -> bearer token (``TRAJLAKE_OTLP_TOKENS_FILE``): a request is the client whose
            token it carries (``extra['otlp_client'] = 'client:<name>'``), any other is refused (401).
        max_body_bytes: largest request body, compressed and inflated.

    Raises:
        ConfigError: ``host`` is not loopback and no token was given; two clients share a token.
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
        token: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        credentials: Mapping[str, str] | None = None,
    ) -> None:
        if not token and not credentials and not is_loopback(host):
            raise ConfigError(
                f"the OTLP receiver serves {host} (not loopback) only with a bearer token: "
                "set TRAJLAKE_OTLP_TOKEN or TRAJLAKE_OTLP_TOKENS_FILE (a token per client), or listen on 127.0.0.1"
            )
        self.token, self.max_body_bytes = token or None, max_body_bytes
        # client name -> token; the single token is one client of its own
        self.credentials: dict[str, str] = dict(credentials or {})
        if token and DEFAULT_CLIENT not in self.credentials:
            self.credentials[DEFAULT_CLIENT] = token
        if len(set(self.credentials.values())) != len(self.credentials):
            raise ConfigError("two OTLP clients share one token: give each client its own")
        self.send, self.settle_s, self.idle_s, self.retain_s, self.max_spans = (
            send,
            settle_s,
            idle_s,
            retain_s,
            max_spans,
        )
        # by (client, conversation): another client's spans under a conversation id never join the opener's
        self._conversations: dict[tuple[str, str], _Conversation] = {}
        self._trace_keys: dict[tuple[str, str], str] = {}  # (client, trace id) -> its conversation
        self._openers: dict[str, str] = {}  # conversation -> the client that opened it
        self.foreign_spans = 0  # spans posted under a conversation another client opened
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sessions_sent = 0
        self.spans_received = 0
        self.errors: deque[str] = deque(maxlen=MAX_ERRORS)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            timeout = READ_TIMEOUT_S  # a client that stops sending frees its thread

            def do_POST(self) -> None:
                try:
                    receiver._handle(self)
                except (ConnectionError, TimeoutError):  # the client went away or went silent: nobody to answer
                    self.close_connection = True
                except Exception as exc:  # a payload must never stop serving: answer 500, keep going
                    receiver._error(f"OTLP request failed: {type(exc).__name__}: {exc}")
                    self.close_connection = True
                    try:
                        self.send_error(500, "internal error")
                    except OSError:
                        pass

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

    def _error(self, message: str) -> None:
        self.errors.append(message)
        log.warning("%s", message)

    def _client(self, request: BaseHTTPRequestHandler) -> str | None:
        """Who posted ``request``: ``client:<name>`` of the credential its bearer token matches (None: no
        match), or, with no credentials configured (loopback only), a fingerprint of what it carries."""
        authorization = request.headers.get("Authorization")
        if not self.credentials:
            return client_id(authorization)
        scheme, _, given = (authorization or "").strip().partition(" ")
        found: str | None = None
        for name, token in self.credentials.items():  # every credential compared: the time tells nothing
            if hmac.compare_digest(given.strip().encode(), token.encode()) and scheme.lower() == "bearer":
                found = name
        return None if found is None else CLIENT_PREFIX + found

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        try:
            if request.path.rstrip("/") != "/v1/traces":
                raise _Refused(404, "only /v1/traces is served")
            client = self._client(request)
            if client is None:
                raise _Refused(401, "a valid bearer token is required")
            body = read_body(request.rfile, request.headers, self.max_body_bytes)
            body = inflate(body, request.headers.get("Content-Encoding") or "", self.max_body_bytes)
            content_type = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            try:
                spans = self._decode(body, content_type)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError) as exc:
                raise _Refused(400, f"not an OTLP trace request: {exc}") from None
        except _Refused as refused:
            self._error(f"OTLP request refused ({refused.status}): {refused.reason}")
            request.close_connection = True  # the body may be unread: the connection cannot be reused
            request.send_error(refused.status, _printable(refused.reason))
            return
        self.receive(spans, client)
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

    def receive(self, spans: list[Span], client: str = ANONYMOUS) -> None:
        """Buffer spans (what a request carried) under their conversations, as posted by ``client``."""
        now = time.monotonic()
        with self._lock:
            self.spans_received += len(spans)
            for key, own in group_sessions(spans).items():
                if key.startswith("conversation:"):
                    for trace in {s.trace_id for s in own}:
                        self._trace_keys[(client, trace)] = key
                        early = self._conversations.pop((client, f"trace:{trace}"), None)  # spans before the id
                        if early is not None:
                            self._conversations.setdefault((client, key), _Conversation()).spans.update(early.spans)
                else:
                    key = self._trace_keys.get((client, key.removeprefix("trace:")), key)
                if self._openers.setdefault(key, client) != client:
                    self.foreign_spans += len(own)
                    log.warning("OTLP spans of another client's conversation kept apart (%d)", len(own))
                conversation = self._conversations.setdefault((client, key), _Conversation())
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
            try:
                self.flush()
            except Exception as exc:  # nothing a conversation holds may stop the flusher
                self._error(f"OTLP flush failed: {type(exc).__name__}: {exc}")

    def flush(self, everything: bool = False) -> int:
        """Send every conversation that looks finished (all of them with ``everything``); how many were sent."""
        now = time.monotonic()
        ready: list[tuple[tuple[str, str], list[Span]]] = []
        with self._lock:
            # openers first: another client's spans under a conversation go out only after the opener's session
            items = sorted(self._conversations.items(), key=lambda kv: self._openers.get(kv[0][1]) != kv[0][0])
            for (client, key), conversation in items:
                opener = self._openers.get(key, client)
                opened = self._conversations.get((opener, key))
                waits = client != opener and opened is not None and opened.sent_at is None
                quiet = now - conversation.last_seen
                due = quiet >= (self.settle_s if conversation.root_ended else self.idle_s)
                if conversation.dirty and (everything or due) and not waits:
                    conversation.dirty, conversation.sent_at = False, now
                    ready.append(((client, key), list(conversation.spans.values())))
                elif not conversation.dirty and conversation.sent_at and now - conversation.sent_at > self.retain_s:
                    del self._conversations[(client, key)]
                    if client == opener:
                        self._openers.pop(key, None)
        for (client, key), spans in ready:
            self._send(key, spans, client)
        return len(ready)

    def _send(self, key: str, spans: list[Span], client: str = ANONYMOUS) -> None:
        spans.sort(key=lambda s: (s.start_us if s.start_us is not None else 0, s.span_id))
        digest = hashlib.sha256(f"otlp/{key}".encode()).hexdigest()
        source = SourceFile(OTLP_SOURCE, digest, None, key)
        try:
            session = convert_spans(source, key, spans)
        except ImportFormatError as exc:
            self._error(f"OTLP conversation {key!r} not imported: {exc.reason}")
            return
        except Exception as exc:  # a conversation the mapping cannot take is set aside, the others go on
            self._error(f"OTLP conversation {key!r} not imported: {type(exc).__name__}: {exc}")
            return
        for event in session.events:  # the credential that posted the spans: the identity admission checks
            event["extra"] = {**(event.get("extra") or {}), "otlp_client": client}
        try:
            self.send(session)
        except Exception as exc:  # the sink failed (Kafka, a printer): said, and the next conversation goes on
            self._error(f"OTLP conversation {key!r} not sent: {type(exc).__name__}: {exc}")
            return
        self.sessions_sent += 1
