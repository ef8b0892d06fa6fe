"""In-sandbox command executor (runs with the sandbox's own ``python3 -I -S``; stdlib only).

Kept to cheap imports (no json, subprocess or hashlib) because its start-up is on the critical
path of sandbox creation. Framing, both directions over stdin/stdout:

- request: ``b"<len cmd> <len stdin> <timeout s or -1> <nonce>\\n"`` + command bytes + stdin bytes;
- reply: one header line of space-separated fields (see ``FIELDS``; the first echoes the request's
  nonce) + failure reason + output.

The command runs as ``/bin/sh -c CMD`` in ``/workspace``, in its own session, with stdin and
stdout+stderr on anonymous in-memory files (``memfd``: no path a later process could open); the
reply carries the first ``TL_OUTPUT_LIMIT`` bytes, the full size and sha256, the exit code, the
duration, and cumulative telemetry of everything run so far (CPU time, peak RSS, block writes,
processes started in this PID namespace).

The commands cannot address the executor. It runs as the PID namespace's init (``bwrap
--as-pid-1``: no other process of the sandbox holds the host's pipes) and makes itself
non-dumpable right after its greeting, so ``/proc/1/fd``, ``/proc/1/mem`` and ``ptrace`` are
refused to the commands although they share its uid (the kernel then requires ``CAP_SYS_PTRACE``,
which no process in the sandbox has); SIGINT, the only signal Python would act on, is ignored.
The host also checks the nonce of every reply. As init it reaps orphans. At a command's timeout
it kills the command's process group and then every process of the sandbox started since the
command started, i.e. with a PID at least the command's (``setsid``, ``nohup`` and double-forked
children included; processes left by earlier commands are spared, unless they forked during this
command).
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time

try:
    from _sha256 import sha256
except ImportError:  # pragma: no cover - other builds
    from hashlib import sha256

OUTPUT_LIMIT = int(os.environ.get("TL_OUTPUT_LIMIT", "16384"))
PR_SET_DUMPABLE = 4
FIELDS = (
    "nonce",
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


def harden() -> bool:
    """Make this process non-dumpable (its /proc entries and memory closed to its own uid).

    ``prctl`` through ``_ctypes`` alone: the ``ctypes`` package costs several milliseconds more to import.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import _ctypes

        class Int(_ctypes._SimpleCData):
            _type_ = "i"

        class Func(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = Int

        class Libc:
            _handle = _ctypes.dlopen(None, 2)  # RTLD_NOW: this process's own libc

        return Func(("prctl", Libc()))(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError, TypeError):  # pragma: no cover - no ctypes in this image
        return False


def start_time(pid: int, live: bool = True) -> int:
    """Start time of a process in clock ticks since boot (``/proc/PID/stat`` field 22).

    -1 when it is gone, or (``live``) a zombie.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b") ", 1)[1].split()
    except (OSError, IndexError):
        return -1
    return -1 if live and fields[0] in (b"Z", b"X") else int(fields[19])


def kill_since(pid: int, born: int) -> None:
    """SIGKILL the command's process group and every live process started since ``born`` (but this one)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if born < 0:
        return
    me = os.getpid()
    for _ in range(50):  # processes forking while they are being killed: until none is left
        # PIDs of a namespace are handed out in increasing order: a process started since the command has a
        # PID >= the command's (its start time, in 10 ms ticks, only guards against a PID wrap-around)
        victims = [
            int(e)
            for e in os.listdir("/proc")
            if e.isdigit() and int(e) >= pid and int(e) != me and start_time(int(e)) >= born
        ]
        if not victims:
            return
        for victim in victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except OSError:
                pass


def reap() -> None:
    """Collect exited orphans (this process is the sandbox's init)."""
    while True:
        try:
            done, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not done:
            return


def _spawn(cmd: bytes, stdin_fd: int, out_fd: int) -> int:
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setsid()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.dup2(stdin_fd, 0)
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
            os.chdir("/workspace")
            os.execv("/bin/sh", ["/bin/sh", "-c", cmd])
        finally:
            os._exit(127)
    return pid


def _wait(pid: int, start: float, timeout: float) -> tuple[int, bytes]:
    """Wait for the command (reaping orphans meanwhile); kill it and its kin at the timeout."""
    born = start_time(pid, live=False)  # the child is ours and not yet reaped: its entry is there
    while True:
        try:
            done, status = os.waitpid(-1, os.WNOHANG if timeout >= 0 else 0)
        except ChildProcessError:  # pragma: no cover - the command is our child
            return 126, b"lost the command"
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return (128 - code if code < 0 else code), b""
        if done:
            continue  # an orphan
        if time.monotonic() - start > timeout:
            kill_since(pid, born)
            os.waitpid(pid, 0)
            reap()
            return 124, b"command timeout"
        time.sleep(0.005)


def run(cmd: bytes, stdin: bytes, timeout: float, nonce: bytes) -> bytes:
    """Run one command; the framed reply."""
    start = time.monotonic()
    reap()
    writer = os.memfd_create("tl_exec_in", os.MFD_CLOEXEC)
    view = memoryview(stdin)
    while view:
        view = view[os.write(writer, view) :]
    stdin_fd = os.open(f"/proc/self/fd/{writer}", os.O_RDONLY | os.O_CLOEXEC)  # read-only for the command
    os.close(writer)
    out_fd = os.memfd_create("tl_exec_out", os.MFD_CLOEXEC)
    reason = b""
    try:
        try:
            pid = _spawn(cmd, stdin_fd, out_fd)
        except OSError as exc:
            code, pid = 126, 0
            reason = f"exec failed: {exc}".encode()
        finally:
            os.close(stdin_fd)
        if pid:
            code, reason = _wait(pid, start, timeout)
        digest = sha256()
        head = os.pread(out_fd, OUTPUT_LIMIT, 0)
        digest.update(head)
        size = len(head)
        while True:
            chunk = os.pread(out_fd, 1 << 20, size)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
    finally:
        os.close(out_fd)
    header = [
        nonce.decode(),
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
    harden()  # before the first request is read: no command runs while this process is dumpable
    while True:
        line = stdin.readline()
        if not line:
            return
        n_cmd, n_in, timeout, nonce = line.split()
        cmd = stdin.read(int(n_cmd))
        data = stdin.read(int(n_in))
        stdout.write(run(cmd, data, float(timeout), nonce))
        stdout.flush()


if __name__ == "__main__":
    main()
