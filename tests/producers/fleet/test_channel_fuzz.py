"""Fuzzers of the sandbox → host channels besides the egress gateway (``test_egress_gateway``).

- the executor's reply: the host-side reader over hostile byte streams in the real framing, and
  commands in one real sandbox that print hostile bytes and exit with any status;
- the evaluator's private result channel: ``judge_case`` over hostile probe output;
- file reads: hostile layer layouts (links out of the layer, loops, FIFOs, sockets, odd names,
  unreadable directories, big files) read by the host's scan, reads, hashes and collections.

Each asserts the host never crashes (only its own documented errors), never reads beyond its
bounds or outside the layer, never passes what it cannot check, and keeps working afterwards.
"""

from __future__ import annotations

import io
import json
import os
import socket
import threading
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from producers.fleet.evaluator import FRAME_PREFIX, collect_changes, judge_case
from producers.fleet.planted import planted_in_layer
from producers.fleet.sandbox import EXEC_FIELDS, CommandResult, ImageStore, Limits, Sandbox, bwrap_available
from producers.fleet.sandbox.exec_wire import (
    INT32,
    MAX_HEADER_BYTES,
    MAX_OUTPUT_BYTES,
    MAX_REASON_BYTES,
    ExecChannelBroken,
    read_reply,
)
from producers.fleet.sandbox.files import read_regular, scan_layer, sha256_regular
from producers.fleet.tasks import HiddenCase, make_task

local = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable")

# ------------------------------------------------------------------ the executor's reply

VALID = {
    "nonce": b"0123456789abcdef",
    "exit_code": b"0",
    "duration_ms": b"1.500",
    "output_bytes": b"3",
    "truncated": b"0",
    "cpu_s": b"0.010000",
    "maxrss_kb": b"9000",
    "oublock": b"0",
    "procs": b"3",
    "sha256": b"a" * 64,
    "reason_len": b"0",
    "output_len": b"3",
}
numbers = st.one_of(
    st.integers(-(1 << 70), 1 << 70).map(lambda n: str(n).encode()),
    st.sampled_from([b"nan", b"inf", b"-inf", b"1e400", b"-0", b"0x10", b"", b"1_0", b"\xff"]),
    st.floats(allow_nan=True).map(lambda f: repr(f).encode()),
)


@st.composite
def replies(draw) -> bytes:
    fields = dict(VALID)
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=4, unique=True)):
        fields[name] = draw(st.one_of(numbers, st.binary(max_size=80)))
    parts = [fields[name] for name in EXEC_FIELDS]
    if draw(st.booleans()):
        parts = draw(st.permutations(parts)) + draw(st.lists(st.binary(max_size=8), max_size=2))
    header = b" ".join(parts) + draw(st.sampled_from([b"\n", b"", b"\r\n", b" \n"]))
    return header + draw(st.binary(max_size=300))


@pytest.mark.fuzz
@hsettings(deadline=None)
@given(data=st.one_of(replies(), st.binary(max_size=2000)))
def test_fuzz_the_executor_reply_reader(data):
    stream = io.BytesIO(data)
    try:
        reply = read_reply(stream, EXEC_FIELDS)
    except ExecChannelBroken:
        reply = None
    else:
        if reply is not None:  # what a reply says fits the event schema and its own bounds
            assert -INT32 <= reply.exit_code < INT32 and reply.output_bytes >= 0
            assert len(reply.reason) <= MAX_REASON_BYTES and len(reply.output) <= MAX_OUTPUT_BYTES
            assert all(v == v and v != float("inf") for v in reply.telemetry.values())
            assert len(reply.sha256) == 64
    # the host never read past one header line and the lengths the bounds allow
    assert stream.tell() <= MAX_HEADER_BYTES + 1 + MAX_REASON_BYTES + MAX_OUTPUT_BYTES


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    image = ImageStore(tmp_path_factory.mktemp("images")).ensure("trajlake/test", "1.0.0")
    sandbox = Sandbox("channel-fuzz", tmp_path_factory.mktemp("sb"), image, {}, Limits(timeout_s=600))
    yield sandbox
    sandbox.stop()
    sandbox.cleanup()


@local
@pytest.mark.fuzz
@hsettings(deadline=None)
@given(output=st.binary(max_size=3000), status=st.integers(0, 255))
def test_fuzz_command_output_from_inside_a_sandbox(box, output, status):
    """Whatever a command prints (fake headers, NULs, newlines, invalid UTF-8), the host reads it as output."""
    result: CommandResult = box.run(f"cat; exit {status}", stdin=output.decode("latin-1"))
    expected = output.decode("latin-1").encode("utf-8")  # the command's stdin was the text, UTF-8 encoded
    assert result.exit_code == status
    assert result.output == expected[:16384].decode("utf-8", "replace")
    assert result.output_bytes == len(expected)
    assert box.run("echo ok").output == "ok\n"  # and the channel is still in step


# ------------------------------------------------------------------ the evaluator's result channel

NONCE = "feedc0ffee00"
CASE = HiddenCase("test_hidden_1", "call", {"module": "m", "func": "f", "args": [1]}, [1, 2])


def _frame(nonce: str, body: object) -> str:
    return f"{FRAME_PREFIX}{nonce} {json.dumps(body) if not isinstance(body, str) else body}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
frames = st.one_of(
    st.builds(
        lambda nonce, frame, test_id, value, extra: _frame(
            nonce, {"frame": frame, "id": test_id, "value": value, "status": "returned", **extra}
        ),
        st.sampled_from([NONCE, "0000", ""]),
        st.sampled_from(["result", "ready", "audit", "other"]),
        st.sampled_from([CASE.test_id, "test_hidden_2", ""]),
        st.one_of(json_values, st.just([1, 2])),
        st.dictionaries(st.sampled_from(["patched", "kind", "pid", "own_pid", "output_head"]), json_values, max_size=3),
    ),
    st.builds(_frame, st.sampled_from([NONCE, "x"]), st.text(max_size=60)),
    st.text(max_size=80),
    st.just('TL_RESULT {"passed": 9}'),
)


@pytest.mark.fuzz
@hsettings(deadline=None)
@given(lines=st.lists(frames, max_size=12), exit_code=st.one_of(st.none(), st.integers(-9, 255)))
# found by this fuzzer: another case's id with this case's expected value was recorded as this case's pass
@example(lines=[_frame(NONCE, {"frame": "result", "id": "test_hidden_2", "value": [1, 2], "status": "returned"})],
         exit_code=None)  # fmt: skip
def test_fuzz_the_evaluators_result_channel(lines, exit_code):
    run = CommandResult("\n".join(lines), exit_code, 1.0, 0)
    record, evidence, reported = judge_case(CASE, NONCE, run)
    json.dumps([record, evidence])  # what goes into the evaluation event is plain JSON
    assert all({"kind", "test_id", "detail"} <= set(item) for item in evidence)
    if record["outcome"] == "passed":
        # a pass needs this case's result frame, with this nonce and id, holding the expected value
        assert any(_passing(line) for line in lines), lines


def _passing(line: str) -> bool:
    parts = line.split(" ", 2)
    if len(parts) != 3 or f"{parts[0]} " != FRAME_PREFIX or parts[1] != NONCE:
        return False
    try:
        frame = json.loads(parts[2])
    except ValueError:
        return False
    return (
        isinstance(frame, dict)
        and frame.get("frame") == "result"
        and frame.get("id") == CASE.test_id
        and frame.get("value") == CASE.expected
    )


# ------------------------------------------------------------------ file reads

SECRET = "host-only-4a7f9c"


def _guarded(fn, *args, seconds: float = 10.0):
    """Run ``fn`` in a thread; fail when it blocks (a FIFO opened for reading waits for a writer)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__} blocked"
    return out[0] if out else None


entries = st.lists(
    st.tuples(
        st.lists(st.sampled_from(["a", "tests", "deep", "é", "new\nline", ".git", "x" * 60]), max_size=3),
        st.sampled_from(["clamp.py", "conftest.py", "tests/test_visible.py", "f.pth", "big", "s", "sitecustomize.py"]),
        st.sampled_from(["file", "link_secret", "link_root", "link_loop", "link_dangling", "fifo", "socket", "dir000"]),
        st.binary(max_size=200),
    ),
    max_size=12,
)


def _build(root: Path, layout, outside: Path, sockets: list) -> None:
    for parents, name, kind, content in layout:
        directory = root.joinpath(*parents)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            continue
        path = directory / name
        if path.exists() or path.is_symlink():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            path.write_bytes(content * (2000 if name == "big" else 1))
        elif kind == "link_secret":
            path.symlink_to(outside / "secret.txt")
        elif kind == "link_root":
            path.symlink_to("/")
        elif kind == "link_loop":
            path.symlink_to(path.name)
        elif kind == "link_dangling":
            path.symlink_to("/nonexistent/x")
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket" and len(str(path)) < 100:
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(path))
            sockets.append(server)
        elif kind == "dir000":
            path.mkdir()
            (path / "inside.py").write_text("import sys\nsys.exit = None\n")
            path.chmod(0)


@pytest.mark.fuzz
@hsettings(deadline=None)
@given(layout=entries)
def test_fuzz_the_hosts_reads_of_a_layer(tmp_path_factory, layout):
    base = tmp_path_factory.mktemp("layer")
    root, outside = base / "workspace", base / "host"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    root.mkdir()
    sockets: list = []
    _build(root, layout, outside, sockets)
    try:
        scan = _guarded(scan_layer, root, (), 50, 5.0)
        assert len(scan.entries) <= 50
        for rel in scan.entries:
            data = _guarded(read_regular, root, rel)
            assert data is None or SECRET.encode() not in data
            _guarded(sha256_regular, root, rel, 1 << 20)
        task = make_task("bugfix.clamp", 1)
        deliverable, ignored, total = _guarded(collect_changes, task, root)
        assert all(SECRET not in text for text in deliverable.values()) and total >= len(ignored)
        found = _guarded(planted_in_layer, root, deliverable, ignored, ["tests/test_visible.py"])
        json.dumps(found)
    finally:
        for server in sockets:
            server.close()
        for dirpath, dirnames, _ in os.walk(base):
            for name in dirnames:
                full = Path(dirpath) / name
                if not full.is_symlink():
                    full.chmod(0o755)
