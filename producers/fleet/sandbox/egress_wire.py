"""What the egress gateway reads from a sandbox, parsed without trusting a byte of it.

Everything here comes from inside the sandbox: the Python hook's request line on the gateway's
Unix socket, DNS queries to the namespace's resolver, packets the tap sees, HTTP request heads
on an allowlisted service. Each parser returns ``None`` for anything it cannot use (the gateway
drops the message and counts it) and never raises; what it does return fits the event schema
(ports in 0..65535, host names valid UTF-8 and at most ``MAX_HOST_CHARS`` long).
"""

from __future__ import annotations

import json
import socket
import struct

#: Longest request line of the Python hook (a JSON object with a host name and a port).
MAX_REQUEST_BYTES = 4096
#: Longest HTTP request head an allowlisted service reads.
MAX_HTTP_HEAD_BYTES = 65536
#: Host names are cut to this many characters (DNS names are at most 253).
MAX_HOST_CHARS = 255
#: Labels of a DNS name read at most (a name has at most 127).
MAX_DNS_LABELS = 64
TCP, UDP = 6, 17


def clean_host(host: str) -> str:
    """``host`` as valid UTF-8 text of at most ``MAX_HOST_CHARS`` characters (lone surrogates replaced)."""
    return host[:MAX_HOST_CHARS].encode("utf-8", "replace").decode("utf-8")


def parse_hook_request(line: bytes) -> tuple[str, int] | None:
    """(host, port) of the Python hook's request line, or ``None`` when it is not one.

    A request is one JSON object with a non-empty string ``host`` and an integer ``port`` in
    0..65535 (other keys are ignored).
    """
    if len(line) > MAX_REQUEST_BYTES:
        return None
    try:
        request = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, invalid UTF-8, nested too deep
        return None
    if not isinstance(request, dict):
        return None
    host, port = request.get("host"), request.get("port")
    if not isinstance(host, str) or not host or type(port) is not int or not 0 <= port <= 65535:
        return None
    return clean_host(host), port


def parse_dns_query(query: bytes) -> tuple[int, str, int, int] | None:
    """(query id, lower-case name, query type, end of the question) of a DNS query, or ``None``.

    Only the first question is read; a compression pointer or a label running past the end makes
    the query unusable.
    """
    if len(query) < 17:
        return None
    labels: list[str] = []
    pos = 12
    while pos < len(query) and query[pos]:
        length = query[pos]
        if length > 63 or pos + 1 + length > len(query) or len(labels) >= MAX_DNS_LABELS:
            return None
        labels.append(query[pos + 1 : pos + 1 + length].decode("ascii", "replace"))
        pos += 1 + length
    end = pos + 5
    if end > len(query):
        return None
    qtype = struct.unpack_from("!H", query, pos + 1)[0]
    name = clean_host(".".join(labels).lower().rstrip("."))
    return struct.unpack_from("!H", query)[0], name, qtype, end


def parse_packet(packet: bytes) -> tuple[str, int, str, int, int] | None:
    """(source, source port, destination, destination port, IP protocol) of an IPv4/IPv6 TCP or UDP packet."""
    if not packet:
        return None
    version = packet[0] >> 4
    if version == 4 and len(packet) >= 20:
        header, proto = (packet[0] & 0x0F) * 4, packet[9]
        if header < 20:
            return None
        src, dst = socket.inet_ntop(socket.AF_INET, packet[12:16]), socket.inet_ntop(socket.AF_INET, packet[16:20])
    elif version == 6 and len(packet) >= 40:
        header, proto = 40, packet[6]
        src, dst = socket.inet_ntop(socket.AF_INET6, packet[8:24]), socket.inet_ntop(socket.AF_INET6, packet[24:40])
    else:
        return None
    if proto not in (TCP, UDP) or len(packet) < header + 4:
        return None
    sport, dport = struct.unpack_from("!HH", packet, header)
    return src, sport, dst, dport, proto


def http_path(head: bytes) -> str:
    """The request path of an HTTP request head (``/`` when there is none)."""
    parts = head.split(b" ", 2)
    return parts[1].decode("utf-8", "replace") if len(parts) > 1 else "/"
