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
import json
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from producers.fleet.sandbox.host import enter_netns

ETH_P_ALL = 0x0003
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


class EgressGateway:
    """Per-sandbox egress gateway: a private Unix socket for the Python hook, and (``attach``) a tap.

    The gateway records every attempt, answers ALLOW for ``host:port`` on the allowlist and then
    serves the internal service behind it (HTTP/1.0, canned bodies), or DENY.

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
        self.dropped = 0
        self._drained = 0
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}  # fake address -> name
        self._addresses: dict[str, str] = {}  # name -> fake address
        self._flows: dict[tuple[str, int, str, int], NetworkAttempt] = {}
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
        self._sock.listen(16)
        self._add(self._sock, self._accept_unix)
        self._wake_r, self._wake_w = socket.socketpair()  # ``close`` wakes the loop at once
        self._add(self._wake_r, lambda sock: None)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"egress-{path.parent.parent.name}", daemon=True)
        self._thread.start()

    def _add(self, sock: socket.socket, handler: Callable[[socket.socket], None]) -> None:
        sock.setblocking(False)
        self._sockets.append(sock)
        self._selector.register(sock, selectors.EVENT_READ, handler)

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
        for sock, handler in created:
            self._add(sock, handler)
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
        if not packet:
            return
        version = packet[0] >> 4
        if version == 4 and len(packet) >= 20:
            header, proto = (packet[0] & 0x0F) * 4, packet[9]
            src, dst = socket.inet_ntop(socket.AF_INET, packet[12:16]), socket.inet_ntop(socket.AF_INET, packet[16:20])
        elif version == 6 and len(packet) >= 40:
            header, proto = 40, packet[6]
            src, dst = socket.inet_ntop(socket.AF_INET6, packet[8:24]), socket.inet_ntop(socket.AF_INET6, packet[24:40])
        else:
            return
        if len(packet) < header + 4 or _is_loopback(dst):
            return
        sport, dport = struct.unpack_from("!HH", packet, header)
        flow = (src, sport, dst, dport)
        protocol = "tcp" if proto == 6 else "udp"
        with self._lock:
            if flow in self._flows:  # a retransmitted SYN, the next datagram of a UDP flow
                return
        host = self._names.get(dst, dst)
        allowed = protocol == "tcp" and f"{host}:{dport}" in self.allowlist
        attempt = NetworkAttempt(
            time.time_ns() // 1000, host[:255], dport, allowed, error=None if allowed else DENIED, protocol=protocol
        )
        with self._lock:
            if len(self._flows) > 10_000:
                self._flows.clear()
            self._flows[flow] = attempt
        self._record(attempt)

    def _on_dns(self, sock: socket.socket) -> None:
        try:
            query, peer = sock.recvfrom(512)
        except BlockingIOError:
            return
        if len(query) < 17:
            return
        labels: list[str] = []
        pos = 12
        while pos < len(query) and query[pos] and len(labels) < 64:
            length = query[pos]
            labels.append(query[pos + 1 : pos + 1 + length].decode("ascii", "replace"))
            pos += 1 + length
        end = pos + 5
        if end > len(query):
            return
        qtype = struct.unpack_from("!H", query, pos + 1)[0]
        name = ".".join(labels).lower().rstrip(".")
        answers = b""
        if qtype == 1:  # A
            address = "127.0.0.1" if name in ("localhost", "sandbox") else self._fake_address(name)
            answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton(address)
        # a response with recursion desired and available, one question, the answer if any
        head = struct.pack("!HHHHHH", struct.unpack_from("!H", query)[0], 0x8180, 1, 1 if answers else 0, 0, 0)
        try:
            sock.sendto(head + query[12:end] + answers, peer)
        except OSError:
            pass

    def _fake_address(self, name: str) -> str:
        with self._lock:
            address = self._addresses.get(name)
            if address is None:
                address = str(FAKE_NET[1 + len(self._addresses) % (FAKE_NET.num_addresses - 2)])
                self._addresses[name] = address
                self._names[address] = name
            return address

    def _accept_tcp(self, listener: socket.socket) -> None:
        try:
            conn, peer = listener.accept()
        except BlockingIOError:
            return
        with conn:
            conn.setblocking(True)
            conn.settimeout(5)
            dst, dport = conn.getsockname()[:2]
            host = self._names.get(dst, dst)
            with self._lock:
                attempt = self._flows.get((peer[0], peer[1], dst, dport))
            if f"{host}:{dport}" not in self.allowlist:
                return  # recorded as denied by the tap; no service
            try:
                self._serve_http(conn, host, dport, attempt)
            except (OSError, ValueError):
                pass

    # ------------------------------------------------------------------ the Python hook

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                events = self._selector.select(0.2)
            except (OSError, ValueError):
                return
            for key, _ in events:
                try:
                    key.data(key.fileobj)
                except (OSError, ValueError, KeyError):
                    pass

    def _accept_unix(self, sock: socket.socket) -> None:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return
        with conn:
            conn.setblocking(True)
            self._handle(conn)

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
        attempt = self._record(
            NetworkAttempt(time.time_ns() // 1000, host[:255], port, f"{host}:{port}" in self.allowlist)
        )
        if not attempt.allowed:
            attempt.error = DENIED
            conn.sendall(b"DENY\n")
            return
        conn.sendall(b"ALLOW\n")
        self._serve_http(conn, host, port, attempt)

    def _serve_http(self, conn: socket.socket, host: str, port: int, attempt: NetworkAttempt | None) -> None:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        if attempt is not None:
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
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(2)
        self._wake_w.close()
        for sock in self._sockets:
            sock.close()
        self._selector.close()
