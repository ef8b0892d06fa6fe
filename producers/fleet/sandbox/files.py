"""Reading what a sandbox left in its writable layer, from the host, without trusting it.

The host reads a sandbox's layer (snapshots and diffs after every command, the deliverable after
the session) with more privilege than the sandbox has, so everything in the layer is hostile:

- a symlink (``ln -s /etc/shadow s1``, or a directory replaced by a link to ``/root``) would make
  the host read, hash or list a host file on the sandbox's behalf: every path component is opened
  with ``O_NOFOLLOW`` relative to its parent's descriptor (``openat``), so a link anywhere in the
  path, or a swap between check and use, fails instead of being followed;
- a FIFO (or a link to one) blocks an ordinary ``open`` for reading until a writer appears, which
  stalled the host after every command: opens are ``O_NONBLOCK`` and only regular files (checked
  with ``fstat`` on the open descriptor) are read;
- a huge or growing file would make the host read without end: reads and hashes stop at a cap.

Directory walks use ``os.fwalk`` (descriptor-based, never follows links) and ``lstat`` only.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

#: Cap on a text file the host reads whole (deliverables, pristine comparisons).
MAX_TEXT_BYTES = 4 << 20
#: Cap on entries listed from one layer (a sandbox creating millions of files must not stall the host).
MAX_ENTRIES = 200_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_regular(root: Path, rel: str) -> int | None:
    """A read-only descriptor of the regular file ``root/rel``, never through a link.

    Args:
        root: the layer's directory (created by the host; trusted).
        rel: a relative path inside it.

    Returns:
        The descriptor (the caller closes it), or ``None`` when ``rel`` escapes ``root``, any
        component is a symlink, or the entry is not a regular file (FIFO, socket, device, dir).
    """
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
        return None
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        handle = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            os.close(handle)
            return None
    except OSError:
        os.close(handle)
        return None
    return handle


def read_regular(root: Path, rel: str, limit: int = MAX_TEXT_BYTES) -> bytes | None:
    """The bytes of the regular file ``root/rel`` (see ``open_regular``).

    Args:
        root: the layer's directory.
        rel: a relative path inside it.
        limit: the largest size read.

    Returns:
        The content, or ``None`` when it is not a regular file reachable without links, or is larger than ``limit``.
    """
    fd = open_regular(root, rel)
    if fd is None:
        return None
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text_regular(root: Path, rel: str, limit: int = MAX_TEXT_BYTES) -> str | None:
    """``read_regular`` decoded as UTF-8 (invalid bytes replaced).

    Args:
        root: the layer's directory.
        rel: a relative path inside it.
        limit: the largest size read.

    Returns:
        The text, or ``None`` (see ``read_regular``).
    """
    data = read_regular(root, rel, limit)
    return None if data is None else data.decode("utf-8", "replace")


def sha256_regular(root: Path, rel: str, limit: int) -> str | None:
    """The sha256 of the regular file ``root/rel``, streamed.

    Args:
        root: the layer's directory.
        rel: a relative path inside it.
        limit: the largest size hashed.

    Returns:
        The hex digest, or ``None`` when not a regular file reachable without links, or larger than ``limit``.
    """
    fd = open_regular(root, rel)
    if fd is None:
        return None
    digest = hashlib.sha256()
    size = 0
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return digest.hexdigest()
            size += len(chunk)
            if size > limit:
                return None
            digest.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass
class LayerScan:
    """What one bounded scan of a layer found.

    Attributes:
        entries: relative POSIX path → ``os.stat_result`` of every non-directory entry seen.
        complete: every entry was seen (else the scan stopped at a bound: ``stopped_by``).
        stopped_by: ``entries`` or ``time`` when incomplete, else ``None``.
        bytes: bytes the entries seen occupy on disk (``st_blocks`` × 512).
        inodes: entries seen, directories included.
    """

    entries: dict[str, os.stat_result] = field(default_factory=dict)
    complete: bool = True
    stopped_by: str | None = None
    bytes: int = 0
    inodes: int = 0


def lstat_in(root: Path, rel: str) -> os.stat_result | None:
    """``lstat`` of ``root/rel`` with every directory on the way opened ``O_NOFOLLOW`` (``None``: absent or unsafe)."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
        return None
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)


def scan_layer(
    root: Path,
    skip: Iterable[str] = (),
    limit: int = MAX_ENTRIES,
    seconds: float | None = None,
    first: Iterable[str] = (),
) -> LayerScan:
    """``lstat`` of every non-directory entry under ``root`` (files, links, FIFOs, sockets), within bounds.

    Links are listed, never followed (a link to a directory is an entry, not a subtree). The scan
    ends after ``limit`` entries or ``seconds`` of wall time, whichever comes first, and says so:
    a sandbox's layer may hold more than the host will look at per command. The paths in ``first``
    are looked at before the walk, so a bound never hides them (the task's own files).

    Args:
        root: the layer's directory.
        skip: top-level names not descended into (``.git``).
        limit: at most this many entries.
        seconds: at most this long (``None``: no time bound).
        first: relative paths looked at first (those that are absent are simply not entries).
    """
    skipped = set(skip)
    scan = LayerScan()
    if not root.is_dir() or root.is_symlink():
        return scan
    deadline = None if seconds is None else time.monotonic() + seconds
    found = scan.entries
    for rel in first:
        st = lstat_in(root, rel)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            found[rel] = st
    seen_first = len(found)
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in skipped]
            filenames = [f for f in filenames if f not in skipped]
        for name in list(dirnames):  # a link to a directory: an entry, and never descended into
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                dirnames.remove(name)
                filenames.append(name)
            else:
                scan.inodes += 1
                scan.bytes += st.st_blocks * 512
        for index, name in enumerate(filenames):
            if index % 256 == 0 and deadline is not None and time.monotonic() > deadline:
                scan.complete, scan.stopped_by = False, "time"
                return scan
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if seen_first and rel in found:
                continue  # looked at first
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            found[rel] = st
            scan.inodes += 1
            scan.bytes += st.st_blocks * 512
            if len(found) >= limit:
                scan.complete, scan.stopped_by = False, "entries"
                return scan
        if deadline is not None and time.monotonic() > deadline:
            scan.complete, scan.stopped_by = False, "time"
            return scan
    return scan


def layer_entries(root: Path, skip: Iterable[str] = (), limit: int = MAX_ENTRIES) -> dict[str, os.stat_result]:
    """``lstat`` of every non-directory entry under ``root``, at most ``limit`` (``scan_layer`` without a time bound).

    Args:
        root: the layer's directory.
        skip: top-level names not descended into (``.git``).
        limit: at most this many entries.

    Returns:
        Relative POSIX path → ``os.stat_result``.
    """
    return scan_layer(root, skip, limit).entries
