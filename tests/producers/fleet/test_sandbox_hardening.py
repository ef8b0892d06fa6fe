"""The host side of a sandbox against a hostile sandbox: links, FIFOs, /proc, uids, escaped children, any tool's egress.

Every probe runs in a real bubblewrap sandbox and failed on the code before the hardening.
"""

import hashlib
import os
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import pytest

from producers.errors import SandboxError
from producers.fleet.evaluator import collect_deliverable
from producers.fleet.sandbox import EXEC_FIELDS, ImageStore, Limits, Sandbox, bwrap_available
from producers.fleet.sandbox.files import read_regular
from producers.fleet.sandbox.host import drops_privileges
from producers.fleet.tasks import make_task

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the host hands out uids and taps namespaces only as root")


@pytest.fixture
def image(tmp_path) -> Path:
    return ImageStore(tmp_path / "images").ensure("trajlake/test", "1.0.0")


@pytest.fixture
def box(tmp_path, image):
    sandbox = Sandbox("hard", tmp_path / "sb", image, {"keep.txt": "pristine\n"}, Limits())
    yield sandbox
    sandbox.stop()
    sandbox.cleanup()


def _bounded(fn, seconds: float = 10.0, unblock: Path | None = None):
    """``fn()`` or a test failure after ``seconds`` (a writer then releases a FIFO the host blocked on)."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn)
    try:
        return future.result(seconds)
    except FutureTimeout:
        if unblock is not None:
            fd = os.open(unblock, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        pytest.fail(f"the host blocked for more than {seconds} s on what the sandbox left")
    finally:
        pool.shutdown(wait=False)


# ------------------------------------------------------------------ links and FIFOs


def test_links_to_host_files_are_never_hashed_or_read(tmp_path, box):
    host_secret = tmp_path / "host-only-secret.txt"
    host_secret.write_text("host secret 5be2\n")
    digest = hashlib.sha256(host_secret.read_bytes()).hexdigest()
    before = box.snapshot()
    box.run(f"ln -s {host_secret} s1; ln -s /etc/shadow s2; mkdir d; ln -s {tmp_path} d/up; ln -s {tmp_path} up")
    changes = {c.path: c for c in box.diff(before, box.snapshot())}
    assert {"s1", "s2", "d/up", "up"} <= set(changes)  # recorded as entries ...
    assert all(c.sha256 is None for p, c in changes.items() if p != "d")  # ... never hashed through
    assert digest not in {c.sha256 for c in changes.values()}
    assert not any(p.startswith(("up/", "d/up/")) for p in changes)  # linked directories are not walked
    assert read_regular(box.workspace, "s1") is None and read_regular(box.workspace, "up/host-only-secret.txt") is None


def test_fifo_in_the_workspace_does_not_block_snapshot_or_diff(box):
    before = box.snapshot()
    box.run("mkfifo pipe1 && rm keep.txt && ln -s pipe1 keep.txt")
    changes = _bounded(lambda: box.diff(before, box.snapshot()), unblock=box.workspace / "pipe1")
    assert {c.path: c.sha256 for c in changes if c.path in ("pipe1", "keep.txt")} == {"pipe1": None, "keep.txt": None}
    assert box.run("echo still-serving").output == "still-serving\n"


def test_deliverable_collection_reads_only_regular_files(tmp_path, box):
    task = make_task("bugfix.range_sum", 4)
    (deliverable,) = task.deliverables
    host_secret = tmp_path / "host-secret.py"
    host_secret.write_text("STOLEN = 1\n")
    for rel, text in task.files.items():
        (box.workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (box.workspace / rel).write_text(text)
    # the deliverable is a link to a host file; a pristine test is a link to a FIFO; a FIFO of its own
    box.run(f"rm {deliverable} && ln -s {host_secret} {deliverable}; mkfifo .q; rm tests/test_visible.py;"
            " ln -s ../.q tests/test_visible.py; mkfifo stray")  # fmt: skip
    got, ignored = _bounded(lambda: collect_deliverable(task, box.workspace), unblock=box.workspace / ".q")
    assert got == {}  # the link is not the agent's file: nothing of the host's reaches the evaluator
    assert {"tests/test_visible.py", ".q", "stray"} <= set(ignored)


def test_oversized_files_are_capped(box):
    box.run("head -c 3000000 /dev/zero > big.bin")
    assert read_regular(box.workspace, "big.bin", limit=1 << 20) is None
    assert len(read_regular(box.workspace, "big.bin", limit=4 << 20) or b"") == 3_000_000


# ------------------------------------------------------------------ the executor's channel


def test_commands_cannot_forge_the_executors_reply(box):
    fake = dict.fromkeys(EXEC_FIELDS, "0")
    fake.update(sha256="0" * 64, output_len="6", nonce="0")
    legacy = " ".join(v for k, v in fake.items() if k != "nonce")  # the reply format before the nonce
    current = " ".join(fake.values())
    for target in ("/proc/$PPID/fd/1", "/proc/1/fd/1"):
        forged = box.run(f"printf '{legacy}\\nFORGED{current}\\nFORGED' > {target}; echo exit=$?")
        assert "FORGED" != forged.output and "exit=" in forged.output, target
        assert forged.output.strip() != "exit=0", f"{target} was writable"
    for word in ("one", "two", "three"):  # still in step: every reply is its own command's
        assert box.run(f"echo {word}").output == f"{word}\n"
    assert "Permission denied" in box.run("cat /proc/1/environ; cat /proc/1/mem").output


def test_a_reply_that_does_not_answer_the_request_is_refused(box):
    box.proc.stdin.write(b"0 0 -1 somebodyelse\n")  # a request the host did not make: its reply is stray
    box.proc.stdin.flush()
    with pytest.raises(SandboxError, match="does not answer"):
        box.run("echo mine")


# ------------------------------------------------------------------ uids


@pytest.mark.skipif(not drops_privileges(), reason="only a root host hands out uids (where unprivileged userns work)")
def test_sandbox_processes_run_as_an_unprivileged_host_uid(tmp_path, image, box):
    init = Path(f"/proc/{box.proc.pid}/task/{box.proc.pid}/children").read_text().split()[0]
    uids = {int(x) for x in Path(f"/proc/{init}/status").read_text().split("Uid:")[1].split("\n")[0].split()}
    assert uids and 0 not in uids and uids == {box.uid}
    box.run("echo mine > made.txt")
    assert (box.workspace / "made.txt").stat().st_uid == box.uid
    other = Sandbox("other", tmp_path / "sb", image, {}, Limits())
    try:
        assert other.uid != box.uid  # one uid per live sandbox: RLIMIT_NPROC counts one sandbox
    finally:
        other.stop()
        other.cleanup()


def test_rlimit_nproc_applies_inside(box):
    result = box.run(
        "prlimit --nproc=4 sh -c 'for i in 1 2 3 4 5 6 7 8; do sleep 2 & done; wait' 2>&1; echo done", timeout=20
    )
    assert "fork" in result.output.lower() or "resource temporarily unavailable" in result.output.lower(), result.output


# ------------------------------------------------------------------ timeouts


def test_timeout_kills_setsid_nohup_and_double_forked_children(box):
    assert box.run("sleep 303 >/dev/null 2>&1 &").exit_code == 0  # an earlier command's server: spared
    timed = box.run(
        "setsid sleep 300 >/dev/null 2>&1 & nohup sleep 301 >/dev/null 2>&1 & (sleep 302 >/dev/null 2>&1 &); sleep 100",
        timeout=1.0,
    )
    assert timed.exit_code == 124
    left = box.run("ps -eo args | grep '^sleep 30' || true").output.split("\n")
    assert sorted(line for line in left if line) == ["sleep 303"]


# ------------------------------------------------------------------ egress of any tool


@root_only
@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl (Debian package `curl`)")
def test_every_tools_network_attempt_is_recorded(tmp_path, image):
    sandbox = Sandbox("egress", tmp_path / "sb", image, {}, Limits(), allowlist=("rates.internal:80",),
                      services={"rates.internal:80": {"/r": '{"ok": 1}'}})  # fmt: skip
    try:
        probes = [
            "curl -s -m 3 http://example.com:8080/x",
            "python3 -I -c \"import socket; socket.create_connection(('example.org', 443), timeout=3)\"",
            "bash -c 'echo hi > /dev/tcp/203.0.113.5/81'",
            "python3 -S -c \"import socket; socket.socket(type=socket.SOCK_DGRAM).sendto(b'x', ('192.0.2.9', 9999))\"",
        ]
        if shutil.which("nc"):
            probes.append("nc -z -w 3 example.net 82")
        for command in probes:
            sandbox.run(command, timeout=10)
        served = sandbox.run("curl -s -m 3 http://rates.internal/r")
        local = sandbox.run("python3 -S -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
                            " socket.create_connection(s.getsockname()).close()\"")  # fmt: skip
        time.sleep(0.3)
        assert sandbox.gateway.tapped
        seen = {(a.host, a.port, a.allowed, a.protocol) for a in sandbox.gateway.drain()}
        expected = {
            ("example.com", 8080, False, "tcp"),
            ("example.org", 443, False, "tcp"),
            ("203.0.113.5", 81, False, "tcp"),
            ("192.0.2.9", 9999, False, "udp"),
            ("rates.internal", 80, True, "tcp"),
        }
        if shutil.which("nc"):
            expected.add(("example.net", 82, False, "tcp"))
        assert seen == expected  # every tool, once each; loopback traffic is not egress
        assert served.output == '{"ok": 1}' and local.exit_code == 0
    finally:
        sandbox.stop()
        sandbox.cleanup()


def _host_address() -> str:
    """The host's address on its default route (a UDP connect sends nothing), or a documentation address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
        except OSError:
            return "198.51.100.1"
    return "198.51.100.1" if address.startswith("127.") else address


@root_only
@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl (Debian package `curl`)")
def test_the_host_network_stays_unreachable(box):
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    hits: list[object] = []

    def watch() -> None:
        try:
            hits.append(listener.accept())
        except OSError:
            pass

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        addresses = {"10.0.2.2", "172.17.0.1", _host_address()}
        for address in addresses:
            result = box.run(f"curl -s -m 2 http://{address}:{port}/; echo rc=$?")
            assert "rc=0" not in result.output
        assert box.run("tail -n +3 /proc/net/dev | cut -d: -f1").output.split() == ["lo"]
    finally:
        thread.join()
        listener.close()
    assert hits == []
    attempts = {(a.host, a.port) for a in box.gateway.drain()}
    assert {(address, port) for address in addresses} <= attempts
