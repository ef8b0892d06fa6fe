"""Process, port and readiness helpers of the real Kafka broker (``kafka_server``)."""

from __future__ import annotations

import base64
import os
import socket
import struct
import uuid
from pathlib import Path

# Small helpers


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct free TCP ports on 127.0.0.1."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def port_accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def random_cluster_id() -> str:
    """Return a Kafka ``Uuid`` string (22 url-safe base64 chars, no padding)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):  # Kafka's Uuid.randomUuid() avoids these too
            return text


def read_properties(path: Path) -> dict[str, str]:
    props: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip()
    return props


def tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def pid_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def probe_api_versions(port: int, timeout: float) -> bool:
    """Send a raw ``ApiVersions`` v0 request; True if the broker answers OK."""
    client_id = b"trajlake-probe"
    body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = sock.recv(10)
    except OSError:
        return False
    if len(header) < 10:
        return False
    correlation_id, error_code = struct.unpack(">ih", header[4:10])
    return bool(correlation_id == 7 and error_code == 0)


def probe_metadata(bootstrap: str, timeout: float) -> bool:
    """Ask for cluster metadata; True once at least one broker is listed."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:  # pragma: no cover - fallback when the client is absent
        return probe_api_versions(int(bootstrap.rpartition(":")[2]), timeout)
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.connection.setup.timeout.ms": max(1000, int(timeout * 1000)),
            "log_level": 0,
        },
        logger=NullLogger(),
    )
    try:
        metadata = admin.list_topics(timeout=timeout)
    except Exception:  # any failure just means "not ready yet"
        return False
    return bool(metadata.brokers)


class NullLogger:
    """Swallows librdkafka log lines emitted while the broker is still down."""

    def log(self, *_args: object, **_kwargs: object) -> None:
        """Discard one log record."""
