"""A pass-through recording proxy on loopback, for comparing what the fleet recorded with a real server's answers.

Used by the real-server test and ``scripts/measure_token_modes.py``; never by the fleet itself.
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


class RecordingProxy:
    """A pass-through HTTP proxy on loopback that keeps every exchange with a real server, byte for byte.

    Tests put it between the fleet and a real inference server to compare what the fleet recorded
    with what the server answered (``exchanges``: path, request JSON, status, raw response body).

    Args:
        upstream: the real server's base URL (``http://127.0.0.1:8000``, no path).
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.exchanges: list[tuple[str, dict[str, Any], int, bytes]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=3600)
                try:
                    conn.request("POST", self.path, body=raw, headers={"Content-Type": "application/json"})
                    response = conn.getresponse()
                    body, status = response.read(), response.status
                finally:
                    conn.close()
                with lock:
                    outer.exchanges.append((self.path, json.loads(raw or b"{}"), status, body))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="recording-proxy", daemon=True)

    @property
    def url(self) -> str:
        """The proxy's base URL with ``/v1`` (pass as ``--model-endpoint``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
