"""One bubblewrap sandbox: the ``bwrap`` command line, the executor protocol, workspace snapshots, kill.

See the package docstring for the layout and the limits; what a sandbox is given and gives back
(``Limits``, ``CommandResult``, ``Snapshot``, ``FileChange``, ``LayerDiff``) is in ``records``.
"""

from __future__ import annotations

import ast
import os
import resource
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from secrets import token_hex
from typing import IO

from common import pyast
from producers.errors import BubblewrapMissing, SandboxError, SandboxKilled
from producers.fleet.sandbox.cgroups import Cgroup
from producers.fleet.sandbox.egress import EgressGateway
from producers.fleet.sandbox.exec_wire import ExecChannelBroken, read_reply
from producers.fleet.sandbox.files import scan_layer, sha256_regular
from producers.fleet.sandbox.host import UIDS, StageMounts, drops_privileges, launch_preexec
from producers.fleet.sandbox.quota import DiskUsage, WorkspaceQuota, mark_owner
from producers.fleet.sandbox.records import (
    HASH_MIN_COST,
    CommandResult,
    FileChange,
    LayerDiff,
    Limits,
    Snapshot,
)

BWRAP_PACKAGE = "bubblewrap"


def _literal_of(script: Path, name: str) -> tuple[str, ...]:
    """The literal tuple assigned to ``name`` at the top level of ``script`` (read, never executed)."""
    for node in pyast.parse(script.read_text(), str(script)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = pyast.literal_eval(node.value)
            if isinstance(value, tuple) and all(isinstance(item, str) for item in value):
                return value
    raise SandboxError(f"{script}: no tuple of names assigned to {name}")


#: Fields of the executor's reply header, in order. The executor (``image/tl_exec.py``) runs inside the
#: sandbox under its own interpreter and cannot import this package, so its ``FIELDS`` is the one
#: definition and the host reads it from the script's source.
EXEC_FIELDS: tuple[str, ...] = _literal_of(Path(__file__).resolve().parents[1] / "image" / "tl_exec.py", "FIELDS")
SANDBOX_UID = 1000


def find_bwrap() -> str:
    """Path of ``bwrap``.

    Raises:
        BubblewrapMissing: not installed, with the package to install.
    """
    path = shutil.which("bwrap")
    if path is None:
        raise BubblewrapMissing(
            f"bubblewrap is not installed: the local sandbox fleet needs `bwrap` "
            f"(install the Debian/Ubuntu package `{BWRAP_PACKAGE}`: apt-get install {BWRAP_PACKAGE}); "
            "or run the synthetic fleet (--backend synthetic)"
        )
    return path


def bwrap_available() -> bool:
    """Whether ``bwrap`` is installed and can create a sandbox here."""
    try:
        bwrap = find_bwrap()
    except BubblewrapMissing:
        return False
    done = subprocess.run(
        [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "/bin/true"],
        capture_output=True,
        timeout=20,
    )
    return done.returncode == 0


def _host_root_binds() -> list[str]:
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib64", "lib32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    for name in (
        "ld.so.cache",
        "ld.so.conf",
        "localtime",
        "alternatives",
        "passwd",
        "group",
        "nsswitch.conf",
    ):
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _bwrap_args(bwrap: str, limits: Limits, mounts: list[tuple[str, Path, str]]) -> list[str]:
    """The ``bwrap`` command line: every namespace unshared, the executor as pid 1 under the sandbox uid, the
    host's read-only root parts, bounded tmpfs for ``/dev/shm`` and ``/tmp``, then ``mounts``."""
    args = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        "--as-pid-1",  # the executor is init: no bwrap reaper holding its pipes in the sandbox
        "--hostname",
        "sandbox",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        *_host_root_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # bwrap's /dev is a writable tmpfs as large as the host allows: shared memory gets a bounded
        # tmpfs of its own and the rest of /dev is read-only (device nodes still work)
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--size",
        str(limits.tmp_bytes),
        "--tmpfs",
        "/tmp",
    ]
    for kind, src, dst in mounts:
        args += [kind, str(src), dst]
    args += ["--chdir", "/workspace", "/usr/bin/python3", "-I", "-S", "/opt/tl/bin/tl_exec.py"]
    return args


def _sandbox_env(env: dict[str, str] | None) -> dict[str, str]:
    """The executor's environment: a fixed base, then the task's configuration ``env``."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/workspace",
        "LANG": "C.UTF-8",
        "PYTHONPATH": "/opt/tl/py",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TL_SECRETS_FILE": "/run/secrets/task.env",
        "TL_EGRESS_SOCKET": "/run/tl/egress.sock",
        **(env or {}),
    }


class Sandbox:
    """One live sandbox: a ``bwrap`` process running the image's command executor.

    Args:
        sandbox_id: unique id (also the directory name).
        root: parent directory of sandbox directories.
        image: the read-only image directory (``ImageStore.ensure``).
        files: initial workspace files (relative path → text).
        limits: resource limits.
        env: per-task configuration (``TL_*``) set in the sandbox's environment.
        secrets: per-task secrets, written to a private read-only file ``/run/secrets/task.env``.
        allowlist: egress ``host:port`` entries; empty means no egress at all.
        services: internal services behind the allowlist.
        ro_binds: extra (host path, sandbox path) read-only mounts (the evaluator's hidden tests).
    """

    def __init__(
        self,
        sandbox_id: str,
        root: Path,
        image: Path,
        files: dict[str, str],
        limits: Limits,
        env: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        allowlist: tuple[str, ...] = (),
        services: dict[str, dict[str, str]] | None = None,
        ro_binds: tuple[tuple[Path, str], ...] = (),
    ) -> None:
        self.sandbox_id = sandbox_id
        self.dir = root / sandbox_id
        self.workspace = self.dir / "workspace"
        self.image = image
        self.limits = limits
        self.created_at = time.monotonic()
        self.reaped = False
        self.killed = False
        self.last_telemetry: dict[str, float] = {}
        self.ready_ms = 0.0
        self.first_command_ms: float | None = None
        self._pidns: str | None = None
        self._io_lock = threading.Lock()
        self._claimed = False
        bwrap = find_bwrap()
        self._make_layer(files, secrets)
        self.gateway = EgressGateway(self.dir / "run" / "egress.sock", allowlist, services or {})
        self.cgroup = Cgroup(f"{os.getpid()}-{sandbox_id}", limits.pids, limits.memory_bytes, limits.cpu_cores)
        mounts = self._stage_mounts(image, ro_binds)
        args, preexec = self._launch_chain(_bwrap_args(bwrap, limits, mounts))
        self._start(args, preexec, _sandbox_env(env))

    def _make_layer(self, files: dict[str, str], secrets: dict[str, str] | None) -> None:
        """The sandbox's directory: its writable layer (a quota-limited filesystem holding ``files``), the
        ``run/`` directory of the egress socket and the private secrets file, all given to the sandbox's uid
        when it has one of its own."""
        limits = self.limits
        self.dir.mkdir(parents=True)
        mark_owner(self.dir)
        try:  # the writable layer is a filesystem of its own, limited in bytes and inodes (``quota``)
            self.quota = WorkspaceQuota(
                self.workspace, self.dir / "disk.img", limits.disk_bytes, limits.disk_inodes, limits.disk_quota
            )
        except SandboxError:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.uid: int | None = UIDS.acquire() if drops_privileges() else None
        for rel, text in files.items():
            path = self.workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        # explicit modes: the CLI and the Dagster resource run with umask 0o077, and the sandbox's own
        # uid must still reach the egress socket in ``run/`` (``/run/tl``)
        (self.dir / "run").mkdir()
        os.chmod(self.dir / "run", 0o755)
        (self.dir / "secrets").mkdir(mode=0o700)
        secret_file = self.dir / "secrets" / "task.env"
        secret_file.write_text("".join(f"{k}={v}\n" for k, v in (secrets or {}).items()))
        secret_file.chmod(0o400)
        if self.uid is not None:
            os.chown(secret_file, self.uid, self.uid)
            os.chown(self.dir / "secrets", self.uid, self.uid)
            self._chown_workspace()

    def _stage_mounts(self, image: Path, ro_binds: tuple[tuple[Path, str], ...]) -> list[tuple[str, Path, str]]:
        """The sandbox's mounts (kind, host source, sandbox path); with a uid of its own, each source is
        staged where that uid can reach it (see ``host``)."""
        mounts: list[tuple[str, Path, str]] = [
            ("--ro-bind", image, "/opt/tl"),
            ("--bind", self.workspace, "/workspace"),
            ("--ro-bind", self.dir / "run", "/run/tl"),
            ("--ro-bind", self.dir / "secrets", "/run/secrets"),
            *(("--ro-bind", host_path, target) for host_path, target in ro_binds),
        ]
        self._stage: StageMounts | None = None
        if self.uid is not None:  # bind sources reachable for the sandbox's uid (see ``host``)
            try:
                self._stage = StageMounts(f"{os.getpid()}-{self.sandbox_id}", self.uid)
                mounts = [(kind, self._stage.bind(Path(src)), dst) for kind, src, dst in mounts]
                self._stage.seal()
            except (SandboxError, OSError):
                self._teardown()
                raise
        return mounts

    def _launch_chain(self, args: list[str]) -> tuple[list[str], Callable[[], None] | None]:
        """How the host starts ``args`` inside the sandbox's cgroup, with its uid and resource limits: an exec
        chain the host can vfork (no ``preexec``) when ``prlimit`` (and ``setpriv`` for a uid) exist, else
        ``args`` as they are with a ``preexec`` function."""
        limits = self.limits
        rlimits = [
            (resource.RLIMIT_CPU, limits.cpu_seconds, "--cpu"),
            (resource.RLIMIT_AS, limits.memory_bytes, "--as"),
            (resource.RLIMIT_NPROC, limits.pids, "--nproc"),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes, "--fsize"),
            (resource.RLIMIT_NOFILE, limits.open_files, "--nofile"),
        ]
        setpriv, prlimit = shutil.which("setpriv"), shutil.which("prlimit")
        if prlimit and (setpriv or self.uid is None):
            # an exec chain the host can vfork: sh joins the cgroup (as root), setpriv drops the uid, prlimit limits
            chain: list[str] = []
            if self.uid is not None and setpriv:
                chain += [setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--"]
            chain += [prlimit, *(f"{flag}={value}" for _, value, flag in rlimits), "--", *args]
            script = "".join(f"echo $$ > {shlex.quote(str(p))} && " for p in self.cgroup.procs_files())
            return ["/bin/sh", "-c", script + 'exec "$@"', "sandbox", *chain], None
        return args, launch_preexec(self.cgroup.procs_files(), [(k, v) for k, v, _ in rlimits], self.uid)

    def _start(self, args: list[str], preexec: Callable[[], None] | None, sandbox_env: dict[str, str]) -> None:
        """Start the sandbox, wait for its executor's greeting, and set up the egress tap.

        Raises:
            SandboxError: bwrap cannot start, or the executor did not greet as expected (the sandbox is
                killed and cleaned up).
        """
        sandbox_id = self.sandbox_id
        try:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=sandbox_env,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._teardown()
            raise SandboxError(f"cannot start bwrap: {exc}") from exc
        self._stdin, self._stdout, self._stderr = _pipes(self.proc)
        hello = self._stdout.readline()
        if not hello:
            err = self._stderr.read().decode(errors="replace")[-500:]
            self.kill()
            self.cleanup()
            raise SandboxError(f"sandbox {sandbox_id} failed to start: {err.strip()}")
        if not hello.startswith(b"READY"):
            self.kill()
            self.cleanup()
            raise SandboxError(f"sandbox {sandbox_id}: unexpected executor greeting {hello[:80]!r}")
        self.last_telemetry = dict(
            zip(("cpu_s", "maxrss_kb", "oublock", "procs"), map(float, hello.split()[1:]), strict=False)
        )
        init = _child_of(self.proc.pid)
        self._pidns = _namespace(init, "pid")
        # The egress tap is set up while the executor hardens itself and the caller prepares the
        # session; the first command waits for it (``run``), so no command runs untapped.
        self._tap: threading.Thread | None = None
        if init is not None:
            self._tap = threading.Thread(target=self.gateway.attach, args=(init,), name=f"tap-{sandbox_id}")
            self._tap.start()
        self.ready_ms = (time.monotonic() - self.created_at) * 1000

    def _chown_workspace(self) -> None:
        """Give the workspace to the sandbox's uid (files the host put there: task files, a git repository).

        Done at creation and once more before the first command (the host may add files in between);
        never after a command ran (``lchown`` only, but the layer is the sandbox's from then on).
        """
        if self.uid is None:
            return
        uid = self.uid
        os.chown(self.workspace, uid, uid)
        for _, dirnames, filenames, dir_fd in os.fwalk(self.workspace):
            for name in dirnames + filenames:
                try:
                    os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    pass

    # ------------------------------------------------------------------ commands

    def run(self, command: str, stdin: str = "", timeout: float | None = None) -> CommandResult:
        """Run ``command`` with ``/bin/sh -c`` in ``/workspace``.

        Raises:
            SandboxKilled: the sandbox died (reaped at its deadline) before answering.
            ExecChannelBroken: the executor's channel gave something that is no reply to this
                request; the sandbox is killed.
        """
        cmd, data = command.encode(), stdin.encode()
        nonce = token_hex(8)
        request = f"{len(cmd)} {len(data)} {timeout if timeout is not None else -1} {nonce}\n".encode() + cmd + data
        with self._io_lock:
            if self._tap is not None:
                self._tap.join()
                self._tap = None
            if not self._claimed:
                self._claimed = True
                self._chown_workspace()
            try:
                self._stdin.write(request)
                self._stdin.flush()
                reply = read_reply(self._stdout, EXEC_FIELDS)
            except ExecChannelBroken:
                # not a reply: the channel is out of step; nothing read from it is trusted
                self.kill()
                raise
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise SandboxKilled(f"sandbox {self.sandbox_id} is gone: {exc}") from exc
        if reply is None or self.killed:
            # ``killed`` is set before the first SIGKILL: a reply that raced the kill (the command
            # died first and the executor answered before it died too) is not a command result.
            raise SandboxKilled(f"sandbox {self.sandbox_id} is gone" + (" (reaped)" if self.reaped else ""))
        if reply.nonce != nonce:
            # not the executor's answer to this request: the channel is out of step; nothing read from it is trusted
            self.kill()
            raise ExecChannelBroken(f"sandbox {self.sandbox_id}: a reply that does not answer the request (forged?)")
        if self.first_command_ms is None:
            self.first_command_ms = (time.monotonic() - self.created_at) * 1000
        self.last_telemetry = reply.telemetry
        return CommandResult(
            output=reply.output.decode("utf-8", "replace"),
            exit_code=reply.exit_code,
            duration_ms=reply.duration_ms,
            output_bytes=reply.output_bytes,
            truncated=reply.truncated,
            sha256=reply.sha256,
            failure_reason=reply.reason.decode("utf-8", "replace") or None,
            telemetry=dict(reply.telemetry),
        )

    @property
    def alive(self) -> bool:
        """Whether the bwrap process is still running."""
        return self.proc.poll() is None

    # ------------------------------------------------------------------ workspace

    def snapshot(self, first: Iterable[str] = ()) -> Snapshot:
        """(size, mtime_ns) of the writable layer's non-directory entries (``lstat``; links not followed).

        Bounded by ``Limits.scan_entries`` and ``Limits.scan_seconds``: a layer with more entries is
        seen in part (``Snapshot.complete`` false), at a bounded cost to the host per command; the
        paths in ``first`` (the task's own files) are always looked at.
        """
        limits = self.limits
        scan = scan_layer(self.workspace, limit=limits.scan_entries, seconds=limits.scan_seconds, first=first)
        entries = {rel: (st.st_size, st.st_mtime_ns) for rel, st in scan.entries.items()}
        return Snapshot(entries, scan.complete, scan.stopped_by, scan.bytes, scan.inodes)

    def changes(self, before: Snapshot, after: Snapshot) -> LayerDiff:
        """Changes between two snapshots, not yet hashed (``hash_changes`` hashes the ones that are reported).

        Entries only one incomplete scan saw are not reported as deleted (the other scan may have
        stopped before them).
        """
        found = [
            FileChange("create" if rel not in before.entries else "write", rel, meta[0], None)
            for rel, meta in sorted(after.entries.items())
            if before.entries.get(rel) != meta
        ]
        complete = before.complete and after.complete
        if complete:
            found += [FileChange("delete", rel, 0, None) for rel in sorted(set(before.entries) - set(after.entries))]
        return LayerDiff(found, complete)

    def hash_changes(self, changes: list[FileChange]) -> int:
        """Fill in the sha256 of changed regular files, at most ``Limits.hash_bytes`` of them; how many were left.

        Each file costs its size and at least one page of the budget (opening a file is work too).
        """
        budget = self.limits.hash_bytes
        left = 0
        for change in changes:
            if change.op == "delete":
                continue
            cost = max(change.size_bytes, HASH_MIN_COST)
            if cost > budget:
                left += 1
                continue
            budget -= cost
            change.sha256 = self._sha(change.path)
        return left

    def diff(self, before: Snapshot, after: Snapshot) -> list[FileChange]:
        """Changes between two snapshots with the new content's sha256 (``None`` unless a regular file)."""
        found = self.changes(before, after).changes
        self.hash_changes(found)
        return found

    def _sha(self, rel: str) -> str | None:
        # never through a link, never blocking on a FIFO, never more than a file may hold
        return sha256_regular(self.workspace, rel, self.limits.file_size_bytes)

    def disk_usage(self) -> DiskUsage | None:
        """What the writable layer holds against its quota (``None``: quota off).

        A mounted layer asks its filesystem; in ``accounting`` mode a scan bounded by the inode quota sums it.
        """
        if self.quota.mode == "off":
            return None
        if self.quota.mounted:
            return self.quota.usage()
        scan = scan_layer(self.workspace, limit=self.limits.disk_inodes + 1, seconds=self.limits.scan_seconds)
        return self.quota.usage(scan.inodes, scan.bytes)

    # ------------------------------------------------------------------ teardown

    def stats(self) -> dict[str, float]:
        """Resource telemetry: cgroup figures where available, else the executor's."""
        out = {
            "cpu_seconds": float(self.last_telemetry.get("cpu_s", 0.0)),
            "peak_memory_bytes": float(self.last_telemetry.get("maxrss_kb", 0)) * 1024,
            "processes_started": float(self.last_telemetry.get("procs", 0)),
        }
        cg = self.cgroup.stats()
        if "cpu_ns" in cg:
            out["cpu_seconds"] = cg["cpu_ns"] / 1e9
        if "memory_peak" in cg:
            out["peak_memory_bytes"] = float(cg["memory_peak"])
        if "memory" in cg:
            out["memory_bytes"] = float(cg["memory"])
        if "pids" in cg:
            out["processes"] = float(cg["pids"])
        return out

    def kill(self, reaped: bool = False) -> None:
        """SIGKILL everything in the sandbox: process group, cgroup members, PID namespace."""
        self.reaped = self.reaped or reaped
        self.killed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, AttributeError):
            pass
        self.cgroup.kill()
        for pid in _pids_in_namespace(self._pidns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(5)
        except (subprocess.TimeoutExpired, AttributeError):
            pass

    def survivors(self) -> int:
        """Processes of this sandbox still alive (0 after a successful kill)."""
        deadline = time.monotonic() + 2.0
        while True:
            alive = set(_pids_in_namespace(self._pidns)) | {p for p in self.cgroup.pids() if not _is_zombie(str(p))}
            if hasattr(self, "proc") and self.proc.poll() is None:
                alive.add(self.proc.pid)
            if not alive or time.monotonic() > deadline:
                return len(alive)
            time.sleep(0.02)

    def stop(self) -> None:
        """End the sandbox normally (close the executor's stdin, then make sure)."""
        try:
            self._stdin.close()
            self.proc.wait(2)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        self.kill()

    def cleanup(self) -> None:
        """Remove the writable layer, the gateway and the cgroup."""
        self._teardown()

    def _teardown(self) -> None:
        tap = getattr(self, "_tap", None)
        if tap is not None:
            tap.join()
        uid = getattr(self, "uid", None)
        if uid is not None and not _pids_in_namespace(self._pidns):
            UIDS.release(uid)
            self.uid = None
        stage = getattr(self, "_stage", None)
        if stage is not None:
            stage.release()
            self._stage = None
        if hasattr(self, "gateway"):
            self.gateway.close()
        if hasattr(self, "cgroup"):
            self.cgroup.remove()
        for stream in ("stdin", "stdout", "stderr"):
            handle = getattr(getattr(self, "proc", None), stream, None)
            if handle is not None:
                try:
                    handle.close()
                except OSError:
                    pass
        quota = getattr(self, "quota", None)
        if quota is not None:
            quota.release()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pipes(proc: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes], IO[bytes]]:
    """The stdin, stdout and stderr of a process started with all three as pipes.

    Raises:
        SandboxError: one of them is missing.
    """
    if proc.stdin is None or proc.stdout is None or proc.stderr is None:
        raise SandboxError("bwrap started without its stdin/stdout/stderr pipes")
    return proc.stdin, proc.stdout, proc.stderr


def _child_of(pid: int) -> int | None:
    """bwrap's first child: the sandbox's init (the executor)."""
    for _ in range(50):
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return None
        if children:
            return int(children[0])
        time.sleep(0.002)
    return None


def _namespace(pid: int | None, kind: str) -> str | None:
    if pid is None:
        return None
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _is_zombie(pid: str) -> bool:
    """Dead but not yet waited for (an orphan waits for the host's init): not a survivor."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(") ", 1)[1][:1] in ("Z", "X")
    except OSError:
        return True


def _pids_in_namespace(namespace: str | None) -> list[int]:
    if namespace is None:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace and not _is_zombie(entry):
                    found.append(int(entry))
            except OSError:
                continue
    return found


__all__ = [
    "BWRAP_PACKAGE",
    "EXEC_FIELDS",
    "SANDBOX_UID",
    "CommandResult",
    "FileChange",
    "LayerDiff",
    "Limits",
    "Sandbox",
    "Snapshot",
    "bwrap_available",
    "find_bwrap",
]
