"""The per-sandbox egress gateway: records every connection attempt, allows only the allowlist."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class NetworkAttempt:
    """One egress attempt seen by the gateway."""

    ts_us: int
    host: str
    port: int
    allowed: bool
    bytes_sent: int = 0
    error: str | None = None


class EgressGateway:
    """Per-sandbox egress gateway on a private Unix socket.

    Every connection attempt the sandbox's Python makes is reported here first (see the image's
    ``sitecustomize.py``); the gateway records it, answers ALLOW for ``host:port`` on the
    allowlist and then serves the internal service behind it (HTTP/1.0, canned bodies), or DENY.

    Args:
        path: socket path (inside the sandbox's ``run/`` directory).
        allowlist: ``host:port`` entries.
        services: ``host:port`` → {HTTP path → body}.
    """

    def __init__(self, path: Path, allowlist: tuple[str, ...], services: dict[str, dict[str, str]]) -> None:
        self.path = path
        self.allowlist = set(allowlist)
        self.services = services
        self.attempts: list[NetworkAttempt] = []
        self._drained = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if len(str(path).encode()) < 100:
            self._sock.bind(str(path))
        else:  # AF_UNIX paths are limited to 108 bytes: bind through a directory descriptor
            dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                self._sock.bind(f"/proc/self/fd/{dir_fd}/{path.name}")
            finally:
                os.close(dir_fd)
        os.chmod(path, 0o666)
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"egress-{path.parent.parent.name}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    self._handle(conn)
                except (OSError, ValueError, KeyError):
                    pass

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        raw = b""
        while not raw.endswith(b"\n") and len(raw) < 4096:
            chunk = conn.recv(1024)
            if not chunk:
                return
            raw += chunk
        request = json.loads(raw)
        host, port = str(request["host"]), int(request["port"])
        attempt = NetworkAttempt(time.time_ns() // 1000, host[:255], port, f"{host}:{port}" in self.allowlist)
        with self._lock:
            self.attempts.append(attempt)
        if not attempt.allowed:
            attempt.error = "denied: not on the egress allowlist"
            conn.sendall(b"DENY\n")
            return
        conn.sendall(b"ALLOW\n")
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        attempt.bytes_sent = len(head)
        parts = head.split(b" ", 2)
        path = parts[1].decode(errors="replace") if len(parts) > 1 else "/"
        body = self.services.get(f"{host}:{port}", {}).get(path)
        status = "200 OK" if body is not None else "404 Not Found"
        data = (body if body is not None else "not found\n").encode()
        conn.sendall(
            f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )

    def drain(self) -> list[NetworkAttempt]:
        """Attempts not returned by a previous ``drain``."""
        with self._lock:
            new = self.attempts[self._drained :]
            self._drained = len(self.attempts)
        return new

    def close(self) -> None:
        """Stop serving."""
        self._closed.set()
        self._sock.close()
        self._thread.join(2)
