"""In-sandbox command executor (runs with the sandbox's own ``python3 -I -S``; stdlib only).

Kept to cheap imports (no json, subprocess or hashlib) because its start-up is on the critical
path of sandbox creation. Framing, both directions over stdin/stdout:

- request: ``b"<len cmd> <len stdin> <timeout s or -1>\\n"`` + command bytes + stdin bytes;
- reply: one header line of space-separated fields (see ``FIELDS``) + failure reason + output.

The command runs as ``/bin/sh -c CMD`` in ``/workspace``, in its own session, with stdout and
stderr to a file in the private ``/tmp``; the reply carries the first ``TL_OUTPUT_LIMIT`` bytes,
the full size and sha256, the exit code, the duration, and cumulative telemetry of everything
run so far (CPU time, peak RSS, block writes, processes started in this PID namespace).
"""

from __future__ import annotations

import os
import resource
import sys
import time

try:
    from _sha256 import sha256
except ImportError:  # pragma: no cover - other builds
    from hashlib import sha256

OUTPUT_LIMIT = int(os.environ.get("TL_OUTPUT_LIMIT", "16384"))
OUT_PATH = "/tmp/.tl_exec_out"
IN_PATH = "/tmp/.tl_exec_in"
FIELDS = (
    "exit_code",
    "duration_ms",
    "output_bytes",
    "truncated",
    "cpu_s",
    "maxrss_kb",
    "oublock",
    "procs",
    "sha256",
    "reason_len",
    "output_len",
)


def last_pid() -> int:
    """The last PID allocated in this PID namespace (= processes started; PIDs start at 1)."""
    try:
        with open("/proc/sys/kernel/ns_last_pid") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 0


def telemetry() -> list[str]:
    """Cumulative (cpu_s, maxrss_kb, oublock, procs) of everything run so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [
        f"{usage.ru_utime + usage.ru_stime:.6f}",
        str(usage.ru_maxrss),
        str(usage.ru_oublock),
        str(last_pid()),
    ]


def _spawn(cmd: bytes) -> int:
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setsid()
            stdin = os.open(IN_PATH, os.O_RDONLY)
            out = os.open(OUT_PATH, os.O_WRONLY)
            os.dup2(stdin, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.chdir("/workspace")
            os.execv("/bin/sh", ["/bin/sh", "-c", cmd])
        finally:
            os._exit(127)
    return pid


def run(cmd: bytes, stdin: bytes, timeout: float) -> bytes:
    """Run one command; the framed reply."""
    start = time.monotonic()
    with open(IN_PATH, "wb") as handle:
        handle.write(stdin)
    open(OUT_PATH, "wb").close()
    reason = b""
    try:
        pid = _spawn(cmd)
    except OSError as exc:
        code, pid = 126, 0
        reason = f"exec failed: {exc}".encode()
    if pid:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG if timeout >= 0 else 0)
            if done:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                break
            if time.monotonic() - start > timeout:
                try:
                    os.killpg(pid, 9)
                except OSError:
                    pass
                os.waitpid(pid, 0)
                code, reason = 124, b"command timeout"
                break
            time.sleep(0.005)
    digest = sha256()
    with open(OUT_PATH, "rb") as out:
        head = out.read(OUTPUT_LIMIT)
        digest.update(head)
        for chunk in iter(lambda: out.read(1 << 20), b""):
            digest.update(chunk)
        size = out.tell()
    header = [
        str(code),
        f"{(time.monotonic() - start) * 1000:.3f}",
        str(size),
        str(int(size > OUTPUT_LIMIT)),
        *telemetry(),
        digest.hexdigest(),
        str(len(reason)),
        str(len(head)),
    ]
    return " ".join(header).encode() + b"\n" + reason + head


def main() -> None:
    """Serve requests until stdin closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(("READY " + " ".join(telemetry()) + "\n").encode())
    stdout.flush()
    while True:
        line = stdin.readline()
        if not line:
            return
        n_cmd, n_in, timeout = line.split()
        cmd = stdin.read(int(n_cmd))
        data = stdin.read(int(n_in))
        stdout.write(run(cmd, data, float(timeout)))
        stdout.flush()


if __name__ == "__main__":
    main()
