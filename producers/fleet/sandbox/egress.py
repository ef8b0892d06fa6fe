"""The per-sandbox egress gateway: records every network attempt of any tool, allows only the allowlist.

Two ways in, one record (``NetworkAttempt``):

1. The Python hook. Every Python process in the sandbox loads the image's ``sitecustomize.py``,
   which reports each connection to the gateway's private Unix socket before making it; the
   gateway answers ALLOW (the socket becomes the tunnel to the internal service) or DENY. This
   sees host names as the code wrote them, but only for Python that loads ``sitecustomize``
   (not ``python3 -I``/``-S``, not curl, nc, bash's ``/dev/tcp``...).

2. The namespace tap (``attach``), below every language runtime. The sandbox has its own network
   namespace with nothing but ``lo``, so the kernel refuses outside connections, but it did so
   without telling anyone (``ENETUNREACH``). When the host is root, the gateway enters that
   namespace once at start-up and makes it a closed world whose only endpoint is the gateway:

   - every address is local (``local 0.0.0.0/0`` and ``local ::/0`` routes on ``lo``, set over
     netlink: the sandbox itself has no ``CAP_NET_ADMIN``), so a connection to anywhere becomes
     a packet on ``lo`` instead of an unreachable route, and stays inside the namespace;
   - a packet socket on ``lo`` (a classic BPF filter keeps only outgoing TCP SYNs and UDP
     datagrams) records every TCP connection attempt and every UDP flow to a non-loopback
     address, whatever made it; connections to ports nobody listens on are refused at once;
   - a resolver on ``127.0.0.1:53`` (where glibc looks without ``/etc/resolv.conf``) answers
     every name with an address of its own from ``198.18.0.0/15`` (benchmarking range, never
     routed) and maps it back, so an attempt is recorded with the host name the tool asked for;
   - one listener per allowlisted ``host:port``, on that host's address, serves the internal
     services to every tool, keeping the allowlist semantics: ``host:port`` on the allowlist is
     served; anything else is refused and recorded as denied.

   Loopback traffic (a server the agent started and talks to) is not egress and is not recorded.
   Name lookups alone are answered inside the namespace and are not attempts.

Why not the alternatives: routing to a real gateway needs a veth pair and a bridge per sandbox
(setup cost on the critical path, and the host's network would be one hop away); ``iptables``/
``nft`` redirection needs tools and netfilter modules this host does not have; intercepting
``connect(2)`` with a seccomp user-notification filter needs a supervisor thread per sandbox
reading the target's memory, and misses nothing the tap does not also see. A non-root host cannot
enter the namespace: there only the Python hook records (and the kernel still refuses).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from producers.fleet.sandbox.egress_wire import (
    MAX_HTTP_HEAD_BYTES,
    MAX_REQUEST_BYTES,
    TCP,
    clean_host,
    http_path,
    parse_dns_query,
    parse_hook_request,
    parse_packet,
)
from producers.fleet.sandbox.host import enter_netns

ETH_P_ALL = 0x0003
SOL_PACKET, PACKET_STATISTICS = 263, 6
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
RTM_NEWROUTE = 24
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 1, 4, 0x200, 0x400
RT_TABLE_LOCAL, RTPROT_BOOT, RT_SCOPE_HOST, RTN_LOCAL = 255, 3, 254, 2
RTA_OIF = 4
#: Addresses the resolver hands out (RFC 2544 benchmarking range: never routed anywhere).
FAKE_NET = ipaddress.ip_network("198.18.0.0/15")
DENIED = "denied: not on the egress allowlist"
#: Attempts kept per sandbox; beyond, only counted (``EgressGateway.dropped``).
MAX_ATTEMPTS = 10_000
#: Names the resolver gives addresses of their own; beyond, every new name shares ``OVERFLOW_ADDRESS``.
MAX_NAMES = 4096
OVERFLOW_ADDRESS = str(FAKE_NET[-2])
OVERFLOW_NAME = "(names beyond the resolver's limit)"
#: Flows remembered to record a retransmitted SYN or a UDP flow once.
MAX_FLOWS = 10_000
#: Connections served at once per sandbox (a new one closes the oldest) and how long each may take.
MAX_CONNECTIONS = 64
CONNECTION_TIMEOUT_S = 5.0


@dataclass
class NetworkAttempt:
    """One egress attempt seen by the gateway."""

    ts_us: int
    host: str
    port: int
    allowed: bool
    bytes_sent: int = 0
    error: str | None = None
    protocol: str = "tcp"


def _bpf_filter() -> bytes:
    """Outgoing IPv4/IPv6 TCP SYNs (no ACK) and UDP datagrams, first 128 bytes; everything else dropped."""
    # (code, jt label, jf label, k); labels resolve to relative jumps
    ld_pkttype, ldb, ldb_ind, ldx_msh, and_k, jeq, ret = 0x20, 0x30, 0x50, 0xB1, 0x54, 0x15, 0x06
    prog: list[tuple[int, str | None, str | None, int, str | None]] = [
        (ld_pkttype, None, None, 0xFFFFF004, None),  # SKF_AD_OFF + SKF_AD_PKTTYPE
        (jeq, None, "drop", PACKET_OUTGOING, None),
        (ldb, None, None, 0, None),
        (and_k, None, None, 0xF0, None),
        (jeq, "v4", None, 0x40, None),
        (jeq, "v6", "drop", 0x60, None),
        (ldb, None, None, 9, "v4"),
        (jeq, "accept", None, 17, None),
        (jeq, None, "drop", 6, None),
        (ldx_msh, None, None, 0, None),
        (ldb_ind, None, None, 13, None),
        (and_k, None, None, 0x12, None),
        (jeq, "accept", "drop", 0x02, None),
        (ldb, None, None, 6, "v6"),
        (jeq, "accept", None, 17, None),
        (jeq, None, "drop", 6, None),
        (ldb, None, None, 53, None),
        (and_k, None, None, 0x12, None),
        (jeq, "accept", "drop", 0x02, None),
        (ret, None, None, 128, "accept"),
        (ret, None, None, 0, "drop"),
    ]
    labels = {label: i for i, (_, _, _, _, label) in enumerate(prog) if label}
    out = b""
    for i, (code, jt, jf, k, _) in enumerate(prog):
        rel_t = labels[jt] - i - 1 if jt else 0
        rel_f = labels[jf] - i - 1 if jf else 0
        out += struct.pack("HBBI", code, rel_t, rel_f, k)
    return out


def _add_local_route(family: int) -> None:
    """``ip route add local <any>/0 dev lo table local`` in the current network namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl:  # NETLINK_ROUTE
        nl.bind((0, 0))
        rtmsg = struct.pack("BBBBBBBBI", family, 0, 0, 0, RT_TABLE_LOCAL, RTPROT_BOOT, RT_SCOPE_HOST, RTN_LOCAL, 0)
        attr = struct.pack("HHI", 8, RTA_OIF, socket.if_nametoindex("lo"))
        body = rtmsg + attr
        flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        nl.send(struct.pack("IHHII", 16 + len(body), RTM_NEWROUTE, flags, 1, 0) + body)
        reply = nl.recv(4096)
        error = struct.unpack_from("i", reply, 16)[0] if len(reply) >= 20 else 0
        if error:
            raise OSError(-error, f"netlink RTM_NEWROUTE: {os.strerror(-error)}")


def _is_loopback(addr: str) -> bool:
    return ipaddress.ip_address(addr).is_loopback


@dataclass
class _Connection:
    """A connection the gateway serves: the hook's request line first (Unix socket), then HTTP."""

    sock: socket.socket
    opened: float
    awaiting_request: bool  # the Python hook's request line is still to come
    buffer: bytearray = field(default_factory=bytearray)
    host: str = ""
    port: int = 0
    attempt: NetworkAttempt | None = None


class EgressGateway:
    """Per-sandbox egress gateway: a private Unix socket for the Python hook, and (``attach``) a tap.

    The gateway records every attempt, answers ALLOW for ``host:port`` on the allowlist and then
    serves the internal service behind it (HTTP/1.0, canned bodies), or DENY.

    What the sandbox sends is hostile (``egress_wire``). One thread serves every socket without
    blocking: each connection is read as its bytes arrive and answered when complete, so a
    connection that sends nothing, or slowly, delays no other; at most ``MAX_CONNECTIONS`` are
    open at once (a new one closes the oldest) and each has ``CONNECTION_TIMEOUT_S``. A message
    that is not a request is dropped and counted (``malformed``); an error in one handler drops
    that one message (``errors``). Should the thread ever stop other than by ``close``, the
    gateway fails closed: every socket is closed (the hook's connections are refused, so Python
    is denied; the tap's listeners and resolver are gone, so the kernel refuses everything else)
    and ``failed`` says why; the fleet then ends the session and flags it.

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
        self.tapped = False
        self.dropped = 0  # attempts beyond MAX_ATTEMPTS: counted, not kept
        self.malformed = 0  # messages that were no request (dropped)
        self.errors = 0  # messages whose handling failed (dropped)
        self.evicted = 0  # connections closed to make room for a new one (before their request was read)
        self._tap: socket.socket | None = None
        self._tap_drops = 0
        self.failed: str | None = None  # why the gateway stopped serving (it failed closed), or None
        self._drained = 0
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}  # fake address -> name
        self._addresses: dict[str, str] = {}  # name -> fake address
        self._flows: dict[tuple[str, int, str, int], NetworkAttempt] = {}
        self._connections: dict[int, _Connection] = {}  # file descriptor -> connection
        self._selector = selectors.DefaultSelector()
        self._sockets: list[socket.socket] = []
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
        self._sock.listen(64)
        self._add(self._sock, self._accept_unix)
        self._wake_r, self._wake_w = socket.socketpair()  # ``close`` wakes the loop at once
        self._add(self._wake_r, self._drain_wake)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"egress-{path.parent.parent.name}", daemon=True)
        self._thread.start()

    def _add(self, sock: socket.socket, handler: Callable[[socket.socket], None]) -> None:
        sock.setblocking(False)
        self._sockets.append(sock)
        self._selector.register(sock, selectors.EVENT_READ, handler)

    @staticmethod
    def _drain_wake(sock: socket.socket) -> None:
        try:
            sock.recv(64)
        except OSError:
            pass

    # ------------------------------------------------------------------ the namespace tap

    def attach(self, pid: int) -> bool:
        """Make the network namespace of ``pid`` (the sandbox's init) a closed world recorded by this gateway.

        Args:
            pid: a process inside the sandbox.

        Returns:
            Whether the tap is in place (needs root; otherwise only the Python hook records).
        """
        if os.geteuid() != 0:
            return False
        try:
            created = enter_netns(pid, self._setup_namespace)
        except OSError:
            return False
        if self._closed.is_set() or self.failed is not None:  # closed (or failed) meanwhile
            for sock, _ in created:
                sock.close()
            return False
        for sock, handler in created:
            self._add(sock, handler)
        self._tap = created[0][0]
        self.tapped = True
        return True

    def _setup_namespace(self) -> list[tuple[socket.socket, Callable[[socket.socket], None]]]:
        """Runs inside the sandbox's network namespace (see the module docstring)."""
        _add_local_route(socket.AF_INET)
        try:
            _add_local_route(socket.AF_INET6)
        except OSError:  # no IPv6 in this kernel: nothing to route
            pass
        tap = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        program = _bpf_filter()
        buffer = ctypes.create_string_buffer(program)
        fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buffer))
        tap.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        tap.bind(("lo", ETH_P_ALL))
        created: list[tuple[socket.socket, Callable[[socket.socket], None]]] = [(tap, self._on_packet)]
        dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dns.bind(("127.0.0.1", 53))
        created.append((dns, self._on_dns))
        for entry in sorted(self.allowlist):
            # on the allowlisted host's own address: any other destination on that port is refused
            host, port = entry.rsplit(":", 1)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self._fake_address(host.lower()), int(port)))
            listener.listen(16)
            created.append((listener, self._accept_tcp))
        return created

    def _record(self, attempt: NetworkAttempt) -> NetworkAttempt:
        with self._lock:
            if len(self.attempts) < MAX_ATTEMPTS:
                self.attempts.append(attempt)
            else:  # a flood of attempts must not exhaust the host: counted, not kept
                self.dropped += 1
        return attempt

    def _on_packet(self, sock: socket.socket) -> None:
        try:
            packet = sock.recv(256)
        except BlockingIOError:
            return
        parsed = parse_packet(packet)
        if parsed is None:
            return
        src, sport, dst, dport, proto = parsed
        if _is_loopback(dst):
            return
        flow = (src, sport, dst, dport)
        protocol = "tcp" if proto == TCP else "udp"
        with self._lock:
            if flow in self._flows:  # a retransmitted SYN, the next datagram of a UDP flow
                return
        host = self._names.get(dst, dst)
        allowed = protocol == "tcp" and f"{host}:{dport}" in self.allowlist
        error = None if allowed else DENIED
        now = time.time_ns() // 1000
        attempt = NetworkAttempt(now, clean_host(host), dport, allowed, error=error, protocol=protocol)
        with self._lock:
            if len(self._flows) > MAX_FLOWS:
                self._flows.clear()
            self._flows[flow] = attempt
        self._record(attempt)

    def _on_dns(self, sock: socket.socket) -> None:
        try:
            query, peer = sock.recvfrom(512)
        except BlockingIOError:
            return
        parsed = parse_dns_query(query)
        if parsed is None:
            self.malformed += 1
            return
        query_id, name, qtype, end = parsed
        answers = b""
        if qtype == 1:  # A
            address = "127.0.0.1" if name in ("localhost", "sandbox") else self._fake_address(name)
            answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(address)
        # a response with recursion desired and available, one question, the answer if any
        head = struct.pack("!HHHHHH", query_id, 0x8180, 1, 1 if answers else 0, 0, 0)
        try:
            sock.sendto(head + query[12:end] + answers, peer)
        except OSError:
            pass

    def _fake_address(self, name: str) -> str:
        """The fake address of ``name``: its own while fewer than ``MAX_NAMES`` are mapped, else a shared one."""
        with self._lock:
            address = self._addresses.get(name)
            if address is None:
                if len(self._addresses) >= MAX_NAMES:
                    # a sandbox resolving endless names must not grow the host's tables: the rest share one
                    # address whose attempts are still recorded (denied, under the overflow's name)
                    self._names.setdefault(OVERFLOW_ADDRESS, OVERFLOW_NAME)
                    return OVERFLOW_ADDRESS
                address = str(FAKE_NET[1 + len(self._addresses)])
                self._addresses[name] = address
                self._names[address] = name
            return address

    def _accept_tcp(self, listener: socket.socket) -> None:
        try:
            conn, peer = listener.accept()
        except BlockingIOError:
            return
        dst, dport = conn.getsockname()[:2]
        host = self._names.get(dst, dst)
        if f"{host}:{dport}" not in self.allowlist:
            conn.close()  # recorded as denied by the tap; no service
            return
        with self._lock:
            attempt = self._flows.get((peer[0], peer[1], dst, dport))
        connection = _Connection(conn, time.monotonic(), False, host=host, port=dport, attempt=attempt)
        self._open(connection)

    # ------------------------------------------------------------------ serving

    def _serve(self) -> None:
        try:
            while not self._closed.is_set():
                self._serve_once()
        except BaseException as exc:  # the loop itself broke: fail closed, never serve blind
            self._fail_closed(f"{type(exc).__name__}: {exc}"[:500])
        else:
            return
        finally:
            if not self._closed.is_set() and self.failed is None:
                self._fail_closed("the serving thread stopped")

    def _serve_once(self) -> None:
        """One round: every socket that is ready, then connections past their time."""
        try:
            events = self._selector.select(0.2)
        except (OSError, ValueError):
            if self._closed.is_set():
                return
            raise
        for key, _ in events:
            handler = key.data
            try:
                handler(key.fileobj)
            except Exception:  # one message's handling failed: drop that message, keep serving
                self.errors += 1
                fd = key.fd
                if fd in self._connections:
                    self._close_connection(self._connections[fd])
        deadline = time.monotonic() - CONNECTION_TIMEOUT_S
        for connection in [c for c in self._connections.values() if c.opened < deadline]:
            self._close_connection(connection)

    def _open(self, connection: _Connection) -> None:
        if len(self._connections) >= MAX_CONNECTIONS:  # the oldest makes room: a held connection blinds nothing
            self._close_connection(min(self._connections.values(), key=lambda c: c.opened))
            self.evicted += 1
        connection.sock.setblocking(False)
        self._connections[connection.sock.fileno()] = connection
        self._selector.register(connection.sock, selectors.EVENT_READ, self._on_connection)
        self._on_connection(connection.sock)  # the request is usually there already

    def _close_connection(self, connection: _Connection) -> None:
        fd = connection.sock.fileno()
        if fd >= 0:
            self._connections.pop(fd, None)
            try:
                self._selector.unregister(connection.sock)
            except (KeyError, ValueError):
                pass
        connection.sock.close()

    def _accept_unix(self, sock: socket.socket) -> None:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return
        self._open(_Connection(conn, time.monotonic(), True))

    def _on_connection(self, sock: socket.socket) -> None:
        connection = self._connections.get(sock.fileno())
        if connection is None:
            return
        try:
            chunk = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            self._close_connection(connection)
            return
        if not chunk:
            self._close_connection(connection)
            return
        connection.buffer += chunk
        if connection.awaiting_request:
            if b"\n" not in connection.buffer:
                if len(connection.buffer) > MAX_REQUEST_BYTES:
                    self.malformed += 1
                    self._close_connection(connection)
                return
            line, _, rest = bytes(connection.buffer).partition(b"\n")
            if not self._answer_request(connection, line):
                self._close_connection(connection)
                return
            connection.awaiting_request = False
            connection.buffer = bytearray(rest)
        if b"\r\n\r\n" in connection.buffer or len(connection.buffer) >= MAX_HTTP_HEAD_BYTES:
            self._answer_http(connection)
            self._close_connection(connection)

    def _answer_request(self, connection: _Connection, line: bytes) -> bool:
        """Record the hook's request and answer it; whether the connection goes on as the tunnel."""
        parsed = parse_hook_request(line)
        if parsed is None:
            self.malformed += 1
            return False
        host, port = parsed
        allowed = f"{host}:{port}" in self.allowlist
        attempt = self._record(NetworkAttempt(time.time_ns() // 1000, host, port, allowed))
        if not allowed:
            attempt.error = DENIED
            self._send(connection, b"DENY\n")
            return False
        connection.host, connection.port, connection.attempt = host, port, attempt
        return self._send(connection, b"ALLOW\n")

    def _answer_http(self, connection: _Connection) -> None:
        head = bytes(connection.buffer[:MAX_HTTP_HEAD_BYTES])
        if connection.attempt is not None:
            connection.attempt.bytes_sent = len(head)
        body = self.services.get(f"{connection.host}:{connection.port}", {}).get(http_path(head))
        status = "200 OK" if body is not None else "404 Not Found"
        data = (body if body is not None else "not found\n").encode()
        header = f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        self._send(connection, header.encode() + data)

    @staticmethod
    def _send(connection: _Connection, data: bytes) -> bool:
        """Send a short answer without blocking the loop; whether all of it went."""
        try:
            return connection.sock.send(data) == len(data)
        except OSError:  # the peer is gone or does not read: its loss
            return False

    def _fail_closed(self, reason: str) -> None:
        """Stop serving for good: close every socket, so every later attempt is refused."""
        self.failed = self.failed or reason
        for connection in list(self._connections.values()):
            try:
                connection.sock.close()
            except OSError:
                pass
        self._connections.clear()
        for sock in self._sockets:
            try:
                sock.close()
            except OSError:
                pass

    def drain(self) -> list[NetworkAttempt]:
        """Attempts not returned by a previous ``drain``."""
        with self._lock:
            new = self.attempts[self._drained :]
            self._drained = len(self.attempts)
        return new

    def tap_drops(self) -> int:
        """Packets the kernel dropped before the tap read them (a flood faster than the gateway): attempts unseen."""
        tap = self._tap
        if tap is not None and tap.fileno() >= 0:
            try:  # PACKET_STATISTICS: (packets, drops) since the last read, then reset
                _, drops = struct.unpack("II", tap.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
                self._tap_drops += drops
            except OSError:
                pass
        return self._tap_drops

    @property
    def alive(self) -> bool:
        """Whether the gateway still serves (neither closed nor failed)."""
        return self.failed is None and self._thread.is_alive()

    def close(self) -> None:
        """Stop serving."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(2)
        self.tap_drops()  # the tap's last figure, before its socket goes
        self._wake_w.close()
        for connection in list(self._connections.values()):
            connection.sock.close()
        self._connections.clear()
        for sock in self._sockets:
            sock.close()
        self._selector.close()
