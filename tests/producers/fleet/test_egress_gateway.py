"""The egress gateway under hostile input: it keeps recording, never crashes and fails closed.

From inside real sandboxes (the wire the sandbox really has: the hook's Unix socket, the
namespace's resolver) and in-process against the host-side gateway and its parsers with the same
bytes. After any message, a later legitimate attempt is recorded; every recorded attempt fits a
``network_request`` event; if the serving loop itself dies, every later attempt is refused and the
session ends flagged.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from producers.fleet import ListSink, run_fleet
from producers.fleet.sandbox import EgressGateway, ImageStore, Limits, Sandbox, bwrap_available
from producers.fleet.sandbox import egress as egress_module
from producers.fleet.sandbox.egress_wire import http_path, parse_dns_query, parse_hook_request, parse_packet
from producers.sdk import SessionEmitter
from schemas.registry import encode_event

local = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the namespace tap needs a root host")

#: Sends each (hex payload, hold) on its own connection to the gateway (``python3 -I -S``: no hook).
SENDER = r"""
import json, socket, sys
held = []
for data, hold in json.loads(sys.stdin.read()):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    try:
        s.connect("/run/tl/egress.sock")
        s.sendall(bytes.fromhex(data))
        if hold:
            held.append(s)
            continue
        s.shutdown(socket.SHUT_WR)
        s.recv(64)
    except OSError:
        pass
    s.close()
print("sent")
"""
#: Sends hostile datagrams to the namespace's resolver (root host: the tap's resolver on 127.0.0.1:53).
DNS_SENDER = r"""
import json, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.2)
for data in json.loads(sys.stdin.read()):
    try:
        s.sendto(bytes.fromhex(data), ("127.0.0.1", 53))
        s.recv(600)
    except OSError:
        pass
print("sent")
"""
HOSTILE = [
    b"[]\n",  # a list where an object belongs (TypeError in the old loop)
    b'{"host": "x", "port": 1e400}\n',  # a port of infinity (OverflowError)
    b"[" * 3000 + b"\n",  # nested past the JSON parser's recursion limit
    b'{"host": ["a"], "port": 80}\n',
    b'{"host": "a", "port": 99999999999}\n',  # no Avro int
    b'{"host": "\\ud800evil", "port": 81}\n',  # a lone surrogate: no UTF-8
    b"\xff\xfe\xfd\n",
    b"no newline at all" * 400,
    b"",
]


def legit_attempt(host: str) -> str:
    """A Python connection attempt through the hook (denied: not on the allowlist)."""
    return f"python3 -c \"import urllib.request; urllib.request.urlopen('http://{host}/', timeout=5)\""


def fits_schema(attempt) -> None:
    """The attempt as the fleet emits it encodes (ports, host text): it cannot crash the emitter."""
    events: list[dict] = []
    emitter = SessionEmitter(events.append, task_id="t", task_type="bugfix")
    emitter.emit(
        "network_request",
        {
            "host": attempt.host,
            "port": attempt.port,
            "protocol": attempt.protocol,
            "allowed": attempt.allowed,
            "bytes_sent": attempt.bytes_sent,
            "error": attempt.error,
        },
        "system",
    )
    encode_event(events[0])


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    return ImageStore(tmp_path_factory.mktemp("images")).ensure("trajlake/test", "1.0.0")


@pytest.fixture(scope="module")
def box(tmp_path_factory, image):
    sandbox = Sandbox("egress-fuzz", tmp_path_factory.mktemp("sb"), image, {}, Limits(timeout_s=600))
    yield sandbox
    sandbox.stop()
    sandbox.cleanup()


def _send(box: Sandbox, payloads: list[tuple[bytes, bool]]) -> None:
    stdin = json.dumps([[p.hex(), hold] for p, hold in payloads])
    result = box.run(f"python3 -I -S -c '{SENDER}'", stdin=stdin, timeout=60)
    assert "sent" in result.output, result.output


def _allowed_request(path: Path) -> bytes:
    """The whole reply of the in-process gateway at ``path`` to a request for its allowlisted service."""
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(5)
        client.connect(str(path))
        client.sendall(b'{"host": "allowed.test", "port": 80}\nGET / HTTP/1.0\r\n\r\n')
        reply = b""
        while chunk := client.recv(4096):
            reply += chunk
    return reply


@local
def test_malformed_messages_and_held_connections_do_not_blind_the_gateway(box):
    box.gateway.drain()
    before = box.gateway.malformed
    _send(box, [(payload, False) for payload in HOSTILE] + [(b"", True)] * 100)
    started = time.monotonic()
    denied = box.run(legit_attempt("after-the-flood.test"), timeout=30)
    assert "denied" in denied.output and time.monotonic() - started < 10
    attempts = box.gateway.drain()
    assert ("after-the-flood.test", 80, False) in [(a.host, a.port, a.allowed) for a in attempts]
    for attempt in attempts:
        fits_schema(attempt)
    assert box.gateway.alive and box.gateway.malformed - before >= 6


def test_held_connections_past_the_limit_evict_the_oldest_and_are_counted(tmp_path):
    """More silent connections than the gateway serves at once: the oldest make room, counted.

    In process, so the count does not depend on how fast a loaded host opens connections (inside
    a sandbox the held ones may expire before the limit is reached)."""
    gateway = EgressGateway(tmp_path / "egress.sock", ("allowed.test:80",), {"allowed.test:80": {"/": "ok"}})
    held: list[socket.socket] = []
    try:
        for _ in range(egress_module.MAX_CONNECTIONS + 10):
            client = socket.socket(socket.AF_UNIX)
            client.settimeout(5)
            held.append(client)
            for _ in range(200):  # a full listen backlog refuses a Unix connect (EAGAIN) until the loop accepts
                try:
                    client.connect(str(tmp_path / "egress.sock"))
                    break
                except BlockingIOError:
                    time.sleep(0.01)
            else:
                raise AssertionError("the gateway stopped accepting connections")
        deadline = time.monotonic() + 10
        while gateway.evicted < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gateway.evicted >= 10
        reply = _allowed_request(tmp_path / "egress.sock")  # a real request is still answered
        assert reply.startswith(b"ALLOW\n") and gateway.alive
    finally:
        for client in held:
            client.close()
        gateway.close()


@local
@root_only
def test_hostile_dns_queries_leave_the_resolver_answering(box):
    queries = [b"", b"\x00" * 12, b"\x12\x34" + b"\x01\x00\x00\x01" + b"\x00" * 6 + b"\xc0\x0c\x00\x01\x00\x01"]
    queries += [b"\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"\x3f" + b"a" * 63 + b"\xff" * 40]
    box.run(f"python3 -I -S -c '{DNS_SENDER}'", stdin=json.dumps([q.hex() for q in queries]), timeout=30)
    box.gateway.drain()
    found = box.run("python3 -I -S -c \"import socket; socket.create_connection(('resolved-later.test', 443), 3)\"")
    assert found.exit_code != 0
    time.sleep(0.2)
    assert ("resolved-later.test", 443) in {(a.host, a.port) for a in box.gateway.drain()}
    assert box.gateway.alive


hook_requests = st.one_of(
    st.binary(max_size=600),
    st.builds(
        lambda obj, newline: json.dumps(obj).encode() + (b"\n" if newline else b""),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=40),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
            max_leaves=12,
        )
        | st.fixed_dictionaries(
            {
                "host": st.one_of(st.text(max_size=300), st.integers(), st.none(), st.lists(st.text(), max_size=2)),
                "port": st.one_of(st.integers(), st.floats(), st.text(max_size=6), st.none()),
            }
        ),
        st.booleans(),
    ),
)


@pytest.mark.slow
@local
@pytest.mark.fuzz
@hsettings(deadline=None)
@given(batch=st.lists(st.tuples(hook_requests, st.booleans()), min_size=1, max_size=8))
def test_fuzz_the_hook_socket_from_inside_a_sandbox(box, batch):
    box.gateway.drain()
    stdin = json.dumps([[p.hex(), hold] for p, hold in batch])
    hook = "import socket; socket.create_connection(('still-recorded.test', 80), 3)"
    result = box.run(f"python3 -I -S -c '{SENDER}'; python3 -c \"{hook}\"", stdin=stdin, timeout=60)
    assert "sent" in result.output and "denied" in result.output, result.output
    attempts = box.gateway.drain()
    assert ("still-recorded.test", 80) in {(a.host, a.port) for a in attempts}
    for attempt in attempts:
        fits_schema(attempt)
    assert box.gateway.alive


@pytest.mark.fuzz
@hsettings(deadline=None)
@given(payloads=st.lists(hook_requests, min_size=1, max_size=6))
def test_fuzz_the_host_side_gateway_in_process(tmp_path_factory, payloads):
    run = tmp_path_factory.mktemp("run")
    gateway = EgressGateway(run / "egress.sock", ("allowed.test:80",), {"allowed.test:80": {"/": "ok"}})
    try:
        for payload in payloads:
            with socket.socket(socket.AF_UNIX) as client:
                client.settimeout(2)
                client.connect(str(run / "egress.sock"))
                client.sendall(payload)
                client.shutdown(socket.SHUT_WR)
                try:
                    client.recv(64)
                except OSError:
                    pass
        reply = _allowed_request(run / "egress.sock")
        assert reply.startswith(b"ALLOW\nHTTP/1.0 200 OK") and reply.endswith(b"ok")
        attempts = gateway.drain()
        assert attempts[-1].host == "allowed.test" and attempts[-1].allowed
        for attempt in attempts:
            fits_schema(attempt)
        assert gateway.alive
    finally:
        gateway.close()


@pytest.mark.fuzz
@hsettings(deadline=None)
@given(data=st.binary(max_size=700))
def test_fuzz_the_wire_parsers(data):
    request = parse_hook_request(data)
    if request is not None:
        host, port = request
        assert 0 <= port <= 65535 and host.encode("utf-8") and len(host) <= 255
    query = parse_dns_query(data)
    if query is not None:
        assert query[1].encode("utf-8") is not None and 0 <= query[2] <= 0xFFFF and query[3] <= len(data)
    packet = parse_packet(data)
    if packet is not None:
        assert 0 <= packet[1] <= 0xFFFF and 0 <= packet[3] <= 0xFFFF
    assert isinstance(http_path(data), str)


class _Dies(BaseException):
    """What kills the serving loop in the fail-closed tests (no handler catches it)."""


@pytest.fixture
def lethal(monkeypatch):
    """A gateway whose loop dies on a request for ``die.test`` (an unknown bug, injected)."""
    answer = egress_module.EgressGateway._answer_request

    def answer_or_die(self, connection, line):
        if b"die.test" in line:
            raise _Dies("injected")
        return answer(self, connection, line)

    monkeypatch.setattr(egress_module.EgressGateway, "_answer_request", answer_or_die)


@local
def test_a_dead_gateway_fails_closed(tmp_path, image, lethal):
    sandbox = Sandbox(
        "dies",
        tmp_path / "sb",
        image,
        {},
        Limits(),
        allowlist=("rates.internal:80",),
        services={"rates.internal:80": {"/r": '{"ok": 1}'}},
    )
    try:
        fetch = "import urllib.request; print(urllib.request.urlopen('http://rates.internal/r').read())"
        assert sandbox.run(f'python3 -c "{fetch}"').exit_code == 0
        sandbox.run(legit_attempt("die.test"), timeout=15)
        deadline = time.monotonic() + 5
        while sandbox.gateway.failed is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sandbox.gateway.failed is not None and "injected" in sandbox.gateway.failed
        started = time.monotonic()
        refused = sandbox.run(
            "python3 -c \"import urllib.request; urllib.request.urlopen('http://rates.internal/r', timeout=5)\"",
            timeout=30,
        )
        assert refused.exit_code != 0 and "denied" in refused.output and time.monotonic() - started < 10
        if sandbox.gateway.tapped:  # every other tool: refused by the kernel, nothing listens any more
            raw = sandbox.run(
                "python3 -I -S -c \"import socket; socket.create_connection(('rates.internal', 80), timeout=3)\"",
                timeout=30,
            )
            assert raw.exit_code != 0
            direct = sandbox.run(
                "python3 -I -S -c \"import socket; socket.create_connection(('198.18.0.1', 80), timeout=3)\"",
                timeout=30,
            )
            assert direct.exit_code != 0 and "refused" in direct.output.lower()
    finally:
        sandbox.stop()
        sandbox.cleanup()


def killing_agent(session) -> None:
    """Makes the (injected) bug kill the gateway, then goes on as if nothing happened."""
    session.run(legit_attempt("die.test"))
    session.run("echo still here")


@local
def test_a_session_whose_gateway_died_ends_flagged(settings, lethal):
    sink = ListSink()
    run_fleet(settings, "local", 1, seed=8, sink=sink, agent=f"{__name__}:killing_agent", timeout_s=60)
    end = next(e for e in sink.events if e["event_type"] == "session_end")
    assert (end["payload"]["status"], end["payload"]["exit_reason"]) == ("failed", "egress_monitor_failed")
    assert "injected" in end["extra"]["egress_monitor_failed"]
    notes = [e["payload"] for e in sink.events if e["event_type"] == "annotation"]
    assert any(n["key"] == "egress_monitor_failed" for n in notes)
    # the agent's second command never ran: nothing is started on a sandbox that is no longer monitored
    commands = [e["payload"]["command"] for e in sink.events if e["event_type"] == "agent_action"]
    assert "echo still here" not in commands
