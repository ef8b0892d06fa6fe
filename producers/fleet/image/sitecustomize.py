"""Egress hook loaded by every Python process in a sandbox (``PYTHONPATH=/opt/tl/py``).

The sandbox's network namespace (``--unshare-net``) reaches nothing outside it, regardless of
this file. This hook keeps Python's view of the allowlist at the level of host names: every TCP
connection attempt is first reported to the host's egress gateway over a private Unix socket;
the gateway records it as a ``network_request`` event and answers ALLOW (then the same socket
becomes the tunnel to the allowed service) or DENY. Tools that bypass it (``python3 -I``, curl,
nc, bash's ``/dev/tcp``) are recorded by the gateway's tap on the namespace instead (see
``producers.fleet.sandbox.egress``).
"""

from __future__ import annotations

import errno
import json
import os
import socket

GATEWAY = os.environ.get("TL_EGRESS_SOCKET", "/run/tl/egress.sock")
_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_setsockopt = socket.socket.setsockopt


def _ask(host: str, port: int) -> socket.socket | None:
    """Report an attempt; the tunnel socket when allowed, ``None`` when denied."""
    gateway = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _connect(gateway, GATEWAY)
        gateway.sendall((json.dumps({"host": host, "port": port, "pid": os.getpid()}) + "\n").encode())
        line = b""
        while not line.endswith(b"\n"):
            chunk = gateway.recv(1)
            if not chunk:
                break
            line += chunk
    except OSError:
        gateway.close()
        return None
    if line.strip() == b"ALLOW":
        return gateway
    gateway.close()
    return None


def _denied(host: str, port: int) -> OSError:
    return OSError(errno.ENETUNREACH, f"egress to {host}:{port} denied by sandbox policy")


def create_connection(address: tuple, *args: object, **kwargs: object) -> socket.socket:
    """``socket.create_connection`` through the egress gateway."""
    host, port = str(address[0]), int(address[1])
    tunnel = _ask(host, port)
    if tunnel is None:
        raise _denied(host, port)
    return tunnel


def connect(self: socket.socket, address: object) -> None:
    """``socket.connect`` for IP sockets through the egress gateway."""
    if self.family not in (socket.AF_INET, socket.AF_INET6):
        return _connect(self, address)
    host, port = str(address[0]), int(address[1])  # type: ignore[index]
    tunnel = _ask(host, port)
    if tunnel is None:
        raise _denied(host, port)
    os.dup2(tunnel.fileno(), self.fileno())
    tunnel.close()


def connect_ex(self: socket.socket, address: object) -> int:
    """``socket.connect_ex`` through the egress gateway."""
    try:
        connect(self, address)
    except OSError as exc:
        return exc.errno or errno.ECONNREFUSED
    return 0


def setsockopt(self: socket.socket, level: int, option: int, *value: object) -> None:
    """``socket.setsockopt`` that ignores TCP options on a tunnel (a Unix socket underneath)."""
    try:
        _setsockopt(self, level, option, *value)
    except OSError as exc:
        if level != socket.IPPROTO_TCP or exc.errno not in (errno.EOPNOTSUPP, errno.ENOPROTOOPT):
            raise


socket.create_connection = create_connection
socket.socket.setsockopt = setsockopt  # type: ignore[method-assign]
socket.socket.connect = connect
socket.socket.connect_ex = connect_ex
