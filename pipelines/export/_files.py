"""Where an export may write, and how: refused directories, exclusive temporary files renamed into place."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.errors import ExportError

if TYPE_CHECKING:
    from warehouse.lakehouse import Locations

#: Directories an export never writes into (exactly these), and trees it never writes under.
_SYSTEM_DIRS = frozenset({"/", "/home", "/root", "/tmp", "/var", "/opt", "/srv", "/mnt", "/media", "/boot"})
_SYSTEM_TREES = (
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/dev",
    "/proc",
    "/sys",
    "/run",
    "/boot",
    "/var/lib",
    "/var/run",
    "/var/log",
)


def safe_path(root: Path, name: str) -> Path:
    """``root/name`` resolved, refusing anything that would land outside ``root``.

    Raises:
        ExportError: ``name`` is absolute, climbs out with ``..``, or follows a symlink outside.
    """
    root = root.resolve()
    candidate = (root / name).resolve()
    if Path(name).is_absolute() or not candidate.is_relative_to(root) or candidate == root:
        raise ExportError(f"refusing to write {name!r}: outside the export directory {root}")
    return candidate


#: A temporary file of :class:`_ExclusiveFile`; one left behind by a killed export is removed by the next.
_TEMPORARY = re.compile(r"\..+\.[0-9a-f]{32}\.tmp")


#: The lakehouse's own output directories: the scheduled exports (``exports/``) and their reports (``reports/``).
OUTPUT_DIRS = ("exports", "reports")


def _refused_directory(path: Path, places: Locations) -> str | None:
    """Why ``path`` (resolved) must not receive an export, or None.

    Refused: system directories and trees; the home directory itself; a new directory directly under
    ``/`` (what a path through a symlink to ``/`` would create); anything inside the lakehouse's own
    directories except under ``OUTPUT_DIRS`` of ``TRAJLAKE_HOME`` (where the scheduled exports and reports go).
    """
    text = str(path)
    if text in _SYSTEM_DIRS or any(text == tree or text.startswith(tree + "/") for tree in _SYSTEM_TREES):
        return "a system directory"
    if path == Path.home().resolve():
        return "your home directory itself; choose a directory inside it"
    if path.parent == Path("/") and not path.exists():
        return "it would create a new top-level directory"
    outputs = [places.home.resolve() / name for name in OUTPUT_DIRS]
    if any(path.is_relative_to(out) and path != out for out in outputs):
        return None
    for place in places.local_directories():
        if path.is_relative_to(place):
            where = outputs[0]
            return f"inside the lakehouse's own directory {place}; choose a directory outside it (or under {where})"
    return None


def _open_out_dir(
    out_dir: Path | str, places: Locations, error: type[Exception] = ExportError, what: str = "export"
) -> tuple[Path, int]:
    """Create (if needed), open and lock an output directory; returns its resolved path and a descriptor.

    The descriptor holds an exclusive ``flock`` until it is closed, so two exports (or reports) into
    one directory take turns; temporary files a killed writer left behind are removed under that lock.

    Args:
        out_dir: the directory asked for.
        places: where the lakehouse is (never written into).
        error: the exception raised (``ExportError``; the report passes ``ReportError``).
        what: the verb of the refusal (``export``, ``write the report``).

    Raises:
        ExportError: (or ``error``) a refused directory, an existing file, a symlink loop, or a directory
            that cannot be created or opened.
    """
    root = Path(out_dir).expanduser()
    try:
        resolved = root.resolve(strict=False)
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before Python 3.13), a bad name
        raise error(f"--out {root}: cannot resolve the path ({exc})") from None
    why = _refused_directory(resolved, places)
    if why:
        raise error(f"refusing to {what} into {resolved}: {why}")
    if resolved.exists() and not resolved.is_dir():
        raise error(f"--out {root}: exists and is not a directory")
    try:
        resolved.mkdir(mode=0o700, parents=True, exist_ok=True)  # an export is owner-only
        # O_NOFOLLOW: the checked directory itself, not a symlink swapped in since the check
        dir_fd = os.open(resolved, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        reason = "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise error(f"--out {root}: cannot create or open the directory ({reason})") from exc
    fcntl.flock(dir_fd, fcntl.LOCK_EX)  # a second export into this directory waits for this one
    _remove_stale_temporaries(dir_fd)
    return resolved, dir_fd


def open_subdirectory(dir_fd: int, name: str) -> int:
    """A directory ``name`` inside ``dir_fd`` (created owner-only), opened without following a link.

    Raises:
        OSError: ``name`` is a symlink (``ELOOP``), a file, or cannot be created.
    """
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _remove_stale_temporaries(dir_fd: int) -> None:
    """Remove temporary files of exports killed mid-write (under the directory's lock: none is live)."""
    for name in os.listdir(dir_fd):
        if _TEMPORARY.fullmatch(name):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass


class _ExclusiveFile:
    """A file written under a unique temporary name in a directory, then renamed to ``name``.

    The temporary file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to the
    directory's descriptor: nothing pre-planted (a symlink, a file of the same name) is
    opened. ``rename`` replaces ``name`` itself, never what a symlink there points to.
    """

    def __init__(self, dir_fd: int, name: str, binary: bool = False) -> None:
        self.dir_fd, self.name = dir_fd, name
        self.tmp_name = f".{name}.{uuid.uuid4().hex}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.tmp_name, flags, 0o600, dir_fd=dir_fd)
        self.handle: Any = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")

    def commit(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self.tmp_name, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)

    def discard(self) -> None:
        self.handle.close()
        try:
            os.unlink(self.tmp_name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass


def _write_file(dir_fd: int, name: str, text: str) -> None:
    out = _ExclusiveFile(dir_fd, name)
    try:
        out.handle.write(text)
        out.commit()
    except BaseException:
        out.discard()
        raise
