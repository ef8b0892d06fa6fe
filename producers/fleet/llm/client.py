"""A small OpenAI-compatible client on ``http.client`` (keep-alive, retries by cause).

One client per session, one persistent connection. Transient failures (HTTP 429, 5xx, a
timeout, a dropped connection) are retried with exponential backoff (``Retry-After`` honoured up
to the cap); every failed try is reported to ``on_failure`` so the session records it. Other
4xx answers and undecodable bodies are not retried; 401, 403 and 404 (a wrong key, model name or
path) raise :class:`~producers.errors.ModelConfigError`, which no rerun fixes.

Paths: ``complete`` posts to ``{endpoint}/chat/completions``; ``post`` takes a path under the
endpoint (``/completions``) or, starting with ``//``, under the server's root (the endpoint
without its trailing ``/v1``: vLLM's ``/tokenize``, SGLang's ``/generate``, llama.cpp's
``/completion``).
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from producers.errors import ModelAPIError, ModelConfigError

TRANSIENT_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
#: answers that mean the request is misconfigured (key, model name, endpoint path), not that the server is busy
CONFIG_STATUS = frozenset({401, 403, 404})


@dataclass
class Try:
    """One HTTP exchange: the decoded body (on success), status, error and wall time."""

    body: dict[str, Any] | None
    status: int | None
    error: str | None
    latency_ms: float
    retry_after_s: float | None = None
    headers: dict[str, str] | None = None

    @property
    def transient(self) -> bool:
        """Worth retrying: a 429/5xx answer, or no answer at all (timeout, connection)."""
        return self.error is not None and (self.status is None or self.status in TRANSIENT_STATUS)


class _Connection(http.client.HTTPConnection):
    """HTTP/1.1 with TCP_NODELAY: a request is one write, but a small one must not wait for an ACK."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _TLSConnection(http.client.HTTPSConnection):
    """HTTPS with TCP_NODELAY."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ChatClient:
    """POST ``{endpoint}/chat/completions``.

    Args:
        endpoint: base URL, e.g. ``http://127.0.0.1:8000/v1``.
        api_key: sent as ``Authorization: Bearer``; ``None`` sends none.
        timeout_s: per-request socket timeout.
        max_retries: retries of a transient failure (so ``max_retries + 1`` tries at most).
        backoff_s: first backoff; doubled per retry with ±25 % jitter, capped at ``backoff_cap_s``.
        backoff_cap_s: longest wait between tries.

    Raises:
        ModelAPIError: an endpoint that is not an http(s) URL.
    """

    def __init__(
        self,
        endpoint: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        backoff_cap_s: float = 8.0,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ModelAPIError(f"model endpoint must be an http(s) URL, got {endpoint!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base = parts.path.rstrip("/")
        self._root = self._base[: -len("/v1")] if self._base.endswith("/v1") else self._base
        self._path = self._base + "/chat/completions"
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.backoff_cap_s = backoff_cap_s
        self._conn: http.client.HTTPConnection | None = None
        self._rng = random.Random()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = _TLSConnection if self._https else _Connection
            self._conn = cls(self._host, self._port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def url_path(self, path: str) -> str:
        """The request path of ``path``: under the endpoint, or under the server root when it starts with ``//``."""
        return self._root + path[1:] if path.startswith("//") else self._base + path

    def try_once(self, body: bytes, timeout: float | None = None, path: str | None = None, chat: bool = True) -> Try:
        """One POST; never raises for HTTP or network failures (they are in the ``Try``).

        Args:
            body: the JSON body.
            timeout: socket timeout (default ``timeout_s``).
            path: the request path (default the chat-completions path).
            chat: the answer must have ``choices`` (an OpenAI completion); else any JSON object does.
        """
        started = time.perf_counter()
        conn = self._connection(timeout if timeout is not None else self.timeout_s)
        try:
            conn.request("POST", path or self._path, body=body, headers=self._headers)
            response = conn.getresponse()
            data = response.read()
        except TimeoutError as exc:
            self.close()
            return Try(None, None, f"timeout: {exc}", (time.perf_counter() - started) * 1000)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            error = f"connection error: {type(exc).__name__}: {exc}"
            return Try(None, None, error, (time.perf_counter() - started) * 1000)
        latency = (time.perf_counter() - started) * 1000
        if response.will_close:
            self.close()
        if response.status != 200:
            retry_after = response.getheader("Retry-After")
            try:
                wait = float(retry_after) if retry_after else None
            except ValueError:
                wait = None
            text = data[:300].decode(errors="replace")
            return Try(None, response.status, f"HTTP {response.status}: {text}", latency, wait)
        try:
            decoded = json.loads(data)
        except ValueError as exc:
            return Try(None, response.status, f"undecodable response body: {exc}", latency)
        if not isinstance(decoded, dict) or (chat and not decoded.get("choices")):
            return Try(None, response.status, "response has no choices" if chat else "response is no object", latency)
        return Try(decoded, response.status, None, latency, headers=dict(response.getheaders()))

    def complete(
        self,
        request: Mapping[str, Any],
        on_failure: Callable[[Try, int], None] | None = None,
        deadline_s: Callable[[], float | None] | None = None,
    ) -> tuple[Try, int]:
        """POST a chat completion with retries; returns the successful try and its index.

        Args:
            request: the JSON body.
            on_failure: called with each failed try and its index (0-based).
            deadline_s: seconds left in the session (``None``: no deadline); bounds timeouts and waits.

        Raises:
            ModelConfigError: 401, 403 or 404 (the key, the model name or the path is wrong).
            ModelAPIError: another non-transient failure, or transient ones past ``max_retries``.
        """
        return self.post("/chat/completions", request, on_failure, deadline_s, chat=True)

    def post(
        self,
        path: str,
        request: Mapping[str, Any],
        on_failure: Callable[[Try, int], None] | None = None,
        deadline_s: Callable[[], float | None] | None = None,
        *,
        chat: bool = False,
    ) -> tuple[Try, int]:
        """POST ``request`` to ``path`` (see :meth:`url_path`) with retries by cause.

        Raises:
            ModelConfigError: 401, 403 or 404.
            ModelAPIError: another non-transient failure, or transient ones past ``max_retries``.
        """
        body = json.dumps(request, separators=(",", ":")).encode()
        url_path = self.url_path(path)
        for index in range(self.max_retries + 1):
            left = deadline_s() if deadline_s is not None else None
            timeout = self.timeout_s if left is None else max(0.05, min(self.timeout_s, left))
            attempt = self.try_once(body, timeout, url_path, chat)
            if attempt.error is None:
                return attempt, index
            if on_failure is not None:
                on_failure(attempt, index)
            if attempt.status in CONFIG_STATUS:
                hint = "check the model name, key and endpoint"
                raise ModelConfigError(f"model API {url_path}: {attempt.error} ({hint})")
            if not attempt.transient or index == self.max_retries:
                raise ModelAPIError(f"model API: {attempt.error} (try {index + 1} of {self.max_retries + 1})")
            wait = min(self.backoff_cap_s, self.backoff_s * 2**index) * self._rng.uniform(0.75, 1.25)
            if attempt.retry_after_s is not None:
                wait = min(self.backoff_cap_s, max(wait, attempt.retry_after_s))
            if left is not None:
                wait = min(wait, max(0.0, left))
            time.sleep(wait)
        raise ModelAPIError("model API: no try made")  # unreachable: the loop returns or raises
