"""A disk quota per sandbox: its writable layer on a filesystem of its own, limited in bytes and inodes.

A sandbox writes only to its writable layer (``/workspace``) and its private ``/tmp``. Unlimited,
one sandbox filled the host's disk (2.4 GB in 35 s) and a quarter of a million empty files made
every scan of its layer slow. So the layer is its own filesystem, in order of strength:

- ``loop`` (root host with loop devices): a sparse image file of ``disk_bytes`` formatted ext4
  (no journal, ``disk_inodes`` inodes, no reserved blocks) and mounted on the layer through a loop
  device set to clear itself on unmount. Writes past the size or the inode count fail with
  ``ENOSPC`` inside the sandbox; the host's disk holds at most the image, its filesystem holds
  one file instead of the sandbox's entries. About 35 ms per sandbox (``mkfs.ext4`` most of it).
- ``tmpfs`` (root host without loop devices, or ``e2fsprogs`` missing): a ``tmpfs`` mounted on the
  layer with ``size`` and ``nr_inodes``; the same hard limits, kept in memory (charged to the
  sandbox's memory cgroup where there is one) instead of on disk.
- ``accounting`` (a host that is not root: it cannot mount): the layer stays a host directory;
  after every command the host sums what the layer holds (the bounded scan of ``files``) and ends
  the session when it holds more than ``disk_bytes`` or ``disk_inodes`` entries. A single command
  can still write up to ``RLIMIT_FSIZE`` per file before it is caught: a limit after the fact.

``/tmp`` in the sandbox is a ``tmpfs`` of ``tmp_bytes`` in every mode (``bwrap --size``).
``exceeded`` says whether the layer is full (less than ``FULL_MARGIN`` of the bytes, or of the
inodes, left: the sandbox tried to go past its quota); the fleet then ends the session as
``failed`` with ``exit_reason`` ``disk_quota``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import shutil
import struct
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from producers.errors import SandboxError

QUOTA_MODES = ("auto", "loop", "tmpfs", "accounting", "off")
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4
#: A layer with less than this share of its bytes or inodes left is full (the sandbox hit its quota).
FULL_MARGIN = 0.01
LOOP_ATTEMPTS = 32
_LOOP_LOCK = threading.Lock()  # this process's sandboxes take free devices one at a time
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class DiskUsage:
    """What a sandbox's writable layer holds."""

    bytes_used: int
    inodes_used: int
    bytes_limit: int
    inodes_limit: int

    @property
    def full(self) -> bool:
        """Whether less than ``FULL_MARGIN`` of the bytes or of the inodes is left."""
        return (
            self.bytes_limit - self.bytes_used < self.bytes_limit * FULL_MARGIN
            or self.inodes_limit - self.inodes_used < self.inodes_limit * FULL_MARGIN
        )


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


@functools.cache
def loop_available() -> bool:
    """Whether this host can give a sandbox a loop-mounted ext4 layer (root, loop control, ``mkfs.ext4``)."""
    return os.geteuid() == 0 and os.path.exists("/dev/loop-control") and shutil.which("mkfs.ext4") is not None


def resolve_mode(mode: str) -> str:
    """The quota mode this host can run for ``mode`` (``auto``: the strongest available).

    Raises:
        SandboxError: an unknown mode, or one this host cannot run (``loop``/``tmpfs`` without root).
    """
    if mode not in QUOTA_MODES:
        raise SandboxError(f"unknown disk quota mode {mode!r}; choose one of {', '.join(QUOTA_MODES)}")
    if mode == "auto":
        if os.geteuid() != 0:
            return "accounting"
        return "loop" if loop_available() else "tmpfs"
    if mode in ("loop", "tmpfs") and os.geteuid() != 0:
        raise SandboxError(f"disk quota mode {mode!r} mounts a filesystem and needs a root host")
    if mode == "loop" and not loop_available():
        raise SandboxError("disk quota mode 'loop' needs /dev/loop-control and mkfs.ext4 (Debian package e2fsprogs)")
    return mode


def _attach_loop(image: Path) -> tuple[str, int]:
    """A free loop device backed by ``image`` and an open descriptor of it.

    The device clears itself when its last user goes: the caller mounts it before closing the
    descriptor. Another thread or process may take the free device first (``EBUSY``): then the
    next free one is tried.

    Raises:
        OSError: no loop device could be set up.
    """
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        info = bytearray(232)  # struct loop_info64; lo_flags at offset 52
        struct.pack_into("I", info, 52, LO_FLAGS_AUTOCLEAR)
        config = struct.pack("II", backing, 0) + bytes(info) + bytes(64)
        for _ in range(LOOP_ATTEMPTS):
            with _LOOP_LOCK:
                control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
                try:
                    number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
                finally:
                    os.close(control)
                device = f"/dev/loop{number}"
                loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.ioctl(loop, LOOP_CONFIGURE, config)
                except OSError as exc:
                    os.close(loop)
                    if exc.errno == errno.EBUSY:  # taken by another process between the two calls
                        continue
                    raise
                return device, loop
        raise OSError(errno.EBUSY, f"no free loop device after {LOOP_ATTEMPTS} attempts")
    finally:
        os.close(backing)


class WorkspaceQuota:
    """The quota of one sandbox's writable layer (see the module docstring).

    Args:
        layer: the writable layer's directory (created here; empty).
        image: where a ``loop`` mode's image file goes (beside the layer, never inside it).
        bytes_limit: bytes the layer may hold.
        inodes_limit: files, directories and links the layer may hold.
        mode: one of ``QUOTA_MODES``.

    Raises:
        SandboxError: the mode cannot run here, or the filesystem could not be made or mounted.
    """

    def __init__(self, layer: Path, image: Path, bytes_limit: int, inodes_limit: int, mode: str = "auto") -> None:
        self.layer = layer
        self.image = image
        self.bytes_limit = bytes_limit
        self.inodes_limit = inodes_limit
        self.mode = resolve_mode(mode)
        self.mounted = False
        layer.mkdir(parents=True, exist_ok=True)
        try:
            if self.mode == "loop":
                self._mount_loop()
            elif self.mode == "tmpfs":
                options = f"size={bytes_limit},nr_inodes={inodes_limit},mode=0755".encode()
                _check(_libc.mount(b"tmpfs", os.fsencode(layer), b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount")
                self.mounted = True
        except (OSError, subprocess.SubprocessError) as exc:
            self.release()
            raise SandboxError(f"cannot give {layer} its {self.mode} quota: {exc}") from exc

    def _mount_loop(self) -> None:
        with open(self.image, "wb") as handle:
            handle.truncate(self.bytes_limit)  # sparse: the host's disk holds what the sandbox writes
        # no journal (a throwaway filesystem), no reserved blocks, the inode count is the quota's
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", "-N", str(self.inodes_limit), "-O", "^has_journal", str(self.image)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        device, loop = _attach_loop(self.image)
        try:
            _check(_libc.mount(device.encode(), os.fsencode(self.layer), b"ext4", MS_NOSUID | MS_NODEV, None), "mount")
        finally:
            os.close(loop)  # the mount holds the device now; unmounted, it clears itself
        self.mounted = True
        (self.layer / "lost+found").rmdir()  # the agent's workspace starts empty

    def usage(self, entries: int | None = None, entry_bytes: int | None = None) -> DiskUsage:
        """What the layer holds: from its filesystem when mounted, else from the scan's figures.

        Args:
            entries: entries a scan of the layer counted (``accounting`` mode).
            entry_bytes: bytes those entries hold (``accounting`` mode).
        """
        if self.mounted:
            st = os.statvfs(self.layer)
            bytes_used = (st.f_blocks - st.f_bfree) * st.f_frsize
            # ext4 holds back some blocks for itself: what the sandbox can still write is f_bavail
            bytes_left = st.f_bavail * st.f_frsize
            return DiskUsage(bytes_used, st.f_files - st.f_ffree, bytes_used + bytes_left, st.f_files)
        return DiskUsage(entry_bytes or 0, entries or 0, self.bytes_limit, self.inodes_limit)

    def release(self) -> None:
        """Unmount the layer (its files go with it) and remove the image; safe to call twice."""
        if self.mounted:
            _libc.umount2(os.fsencode(self.layer), MNT_DETACH)  # the loop device clears itself
            self.mounted = False
        try:
            self.image.unlink()
        except FileNotFoundError:
            pass


OWNER_FILE = "owner"


def mark_owner(sandbox_dir: Path) -> None:
    """Record this process as the owner of a sandbox directory (``sweep_stale`` removes it once the process is gone)."""
    (sandbox_dir / OWNER_FILE).write_text(str(os.getpid()))


def sweep_stale(root: Path) -> int:
    """Unmount and remove sandbox directories under ``root`` whose owning process is gone (a crashed host).

    Returns:
        How many were removed.
    """
    removed = 0
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        try:
            pid = int((entry / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        layer = entry / "workspace"
        if os.path.ismount(layer):
            _libc.umount2(os.fsencode(layer), MNT_DETACH)
        shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    return removed
