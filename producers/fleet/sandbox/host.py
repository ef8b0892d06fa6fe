"""Host-side privileges of a sandbox launch: its own unprivileged uid, the launch itself, its network namespace.

An unprivileged host uid per sandbox. ``bwrap`` maps exactly one uid: its caller's. Launched by
root, every sandbox process was host root inside a user namespace (uid map ``1000 0 1``): files
it wrote were root's, and ``RLIMIT_NPROC`` does not apply to root. So when the host is root,
the launch drops to a uid of its own before ``exec``-ing ``bwrap`` (uid map ``1000 <uid> 1``,
one uid per live sandbox from ``UidPool``, so ``RLIMIT_NPROC`` counts one sandbox's processes).
``bwrap`` then resolves its bind sources with that uid's permissions, and a state directory under
``/root`` or pytest's ``0700`` temporary root is not traversable for it; so each source is first
bind-mounted by the host below a staging directory (``StageMounts``: ``STAGE/<pid>-<sandbox>/N``,
the per-sandbox directory owned by the sandbox's uid, mode ``0500``: no other host user can
traverse it) and unmounted at cleanup. The launch stays a ``vfork``-able exec chain (``sh``
joins the cgroup as root, ``setpriv`` drops the uid, ``prlimit`` sets the rlimits, ``bwrap``):
a ``preexec_fn`` would make Python ``fork`` the whole host process (~20 ms for a 200 MB host on
this machine), used only where ``setpriv`` or ``prlimit`` is missing. A non-root host keeps its
own uid (``bwrap`` maps it; it is unprivileged already); so does a root host where an
unprivileged uid may not create user namespaces (``drops_privileges`` probes once).

``enter_netns`` runs a function with the calling thread inside another network namespace (to
create the egress gateway's sockets and routes there; see ``egress``).
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from producers.errors import SandboxError

CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MNT_DETACH = 2
#: First host uid handed to sandboxes, far above any real account and any subuid range in use.
UID_BASE = 2_000_000_000
UIDS_PER_PROCESS = 1024
T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class UidPool:
    """Host uids for live sandboxes: distinct within this process and (by pid) from other processes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[int] = []
        self._next = 0
        self._pid = -1

    def acquire(self) -> int:
        """A uid no live sandbox of this process has.

        Raises:
            SandboxError: more than ``UIDS_PER_PROCESS`` sandboxes at once.
        """
        with self._lock:
            if self._pid != os.getpid():  # a forked child gets a range of its own
                self._pid, self._free, self._next = os.getpid(), [], 0
            if self._free:
                return self._free.pop()
            if self._next >= UIDS_PER_PROCESS:
                raise SandboxError(f"more than {UIDS_PER_PROCESS} live sandboxes in one process")
            self._next += 1
            return UID_BASE + (os.getpid() % 2_000_000) * UIDS_PER_PROCESS + self._next - 1

    def release(self, uid: int) -> None:
        """Give a uid back once no process of its sandbox is left."""
        with self._lock:
            if self._pid == os.getpid():
                self._free.append(uid)


UIDS = UidPool()


@functools.cache
def drops_privileges() -> bool:
    """Whether sandboxes get their own unprivileged uid: the host is root and such a uid may create namespaces.

    Checked once per process with a throw-away ``bwrap`` (some distributions forbid unprivileged user
    namespaces; there the sandbox keeps the caller's uid mapping, as before).
    """
    bwrap = shutil.which("bwrap")
    if os.geteuid() != 0 or bwrap is None:
        return False
    probe_uid = UID_BASE - 1
    try:
        done = subprocess.run(
            [bwrap, "--unshare-all", "--ro-bind", "/", "/", "--uid", "1000", "/bin/true"],
            user=probe_uid,
            group=probe_uid,
            extra_groups=[],
            capture_output=True,
            timeout=20,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def stage_dir() -> Path:
    """The root-owned staging directory for bind sources (created once; stale stages of dead processes removed).

    Raises:
        SandboxError: it exists but is not a root-owned directory writable only by root.
    """
    base = Path("/run") if Path("/run").is_dir() else Path(tempfile.gettempdir())
    path = base / "trajlake-sandbox-stage"
    try:
        path.mkdir(mode=0o711, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise SandboxError(f"cannot create the sandbox staging directory {path}: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SandboxError(f"{path} is not a root-owned directory writable only by root; remove it")
    if stat.S_IMODE(st.st_mode) != 0o711:  # made under a narrower umask (the CLI's is 0o077): sandbox uids traverse it
        os.chmod(path, 0o711)
    for entry in path.iterdir():  # a host process that died without cleaning up
        pid = entry.name.split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove_stage(entry)
    return path


def _remove_stage(path: Path) -> None:
    for target in sorted(path.iterdir()) if path.is_dir() else ():
        _libc.umount2(os.fsencode(target), MNT_DETACH)
        try:
            if target.is_dir():
                target.rmdir()
            else:
                target.unlink()
        except OSError:
            pass
    try:
        path.rmdir()
    except OSError:
        pass


class StageMounts:
    """One sandbox's bind sources, re-mounted where the sandbox's uid can reach them (see the module docstring).

    Args:
        name: unique per live sandbox on this host (``<pid>-<sandbox id>``).
        uid: the sandbox's uid (owner of the stage directory).

    Raises:
        SandboxError: the staging directory is unusable.
    """

    def __init__(self, name: str, uid: int) -> None:
        self.path = stage_dir() / name
        self.uid = uid
        try:
            self.path.mkdir(mode=0o700)
        except OSError as exc:
            raise SandboxError(f"cannot create the sandbox stage {self.path}: {exc}") from exc
        self._count = 0

    def bind(self, source: Path) -> Path:
        """Bind-mount ``source`` into the stage; the path to give ``bwrap``.

        Raises:
            SandboxError: the mount failed.
        """
        target = self.path / str(self._count)
        self._count += 1
        try:
            if source.is_dir():
                target.mkdir(mode=0o755)
            else:
                target.touch(mode=0o644)
            _check(_libc.mount(os.fsencode(source), os.fsencode(target), None, MS_BIND | MS_REC, None), "bind")
        except OSError as exc:
            raise SandboxError(f"cannot stage {source} for the sandbox: {exc}") from exc
        return target

    def seal(self) -> None:
        """Hand the stage directory to the sandbox's uid alone (``0500``)."""
        os.chown(self.path, self.uid, self.uid)
        os.chmod(self.path, 0o500)

    def release(self) -> None:
        """Unmount and remove the stage."""
        _remove_stage(self.path)


def launch_preexec(
    cgroup_procs: Sequence[Path], rlimits: Sequence[tuple[int, int]], uid: int | None
) -> Callable[[], None]:
    """The ``preexec_fn`` of a sandbox launch where ``setpriv`` or ``prlimit`` is missing (forks the host: slower).

    Args:
        cgroup_procs: ``cgroup.procs`` files to join.
        rlimits: (resource, limit) pairs, set as soft and hard limits.
        uid: the unprivileged uid (and gid) to become; ``None`` keeps the caller's.
    """
    procs = [os.fsencode(p) for p in cgroup_procs]

    def apply() -> None:
        me = str(os.getpid()).encode()
        for path in procs:
            try:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, me)
                finally:
                    os.close(fd)
            except OSError:
                pass
        for kind, limit in rlimits:
            resource.setrlimit(kind, (limit, limit))
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)

    return apply


@contextmanager
def _in_netns(pid: int) -> Iterator[None]:
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(target, CLONE_NEWNET), "setns(net)")
        finally:
            os.close(target)
        try:
            yield
        finally:
            _check(_libc.setns(own, CLONE_NEWNET), "setns(back)")
    finally:
        os.close(own)


def enter_netns(pid: int, fn: Callable[[], T]) -> T:
    """Run ``fn`` with this thread in the network namespace of process ``pid`` (needs root).

    Sockets created by ``fn`` stay in that namespace; the thread returns to its own afterwards.

    Raises:
        OSError: the namespace cannot be entered.
    """
    with _in_netns(pid):
        return fn()
