"""Where an export may write, and how: refused directories, exclusive temporary files renamed into place."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from common.settings import Settings
from pipelines.errors import ExportError

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


def _refused_directory(path: Path, settings: Settings) -> str | None:
    """Why ``path`` (resolved) must not receive an export, or None."""
    text = str(path)
    if text in _SYSTEM_DIRS or any(text == tree or text.startswith(tree + "/") for tree in _SYSTEM_TREES):
        return "a system directory"
    if path == Path.home().resolve():
        return "your home directory itself; choose a directory inside it"
    if path == settings.home_dir.resolve():
        return "TRAJLAKE_HOME itself; choose a directory inside it"
    return None


def _open_out_dir(out_dir: Path | str, settings: Settings) -> tuple[Path, int]:
    """Create (if needed) and open the export directory; returns its resolved path and a descriptor.

    Raises:
        ExportError: a system directory, an existing file, or a directory that cannot be created.
    """
    root = Path(out_dir).expanduser()
    resolved = root.resolve()
    why = _refused_directory(resolved, settings)
    if why:
        raise ExportError(f"refusing to export into {resolved}: {why}")
    if resolved.exists() and not resolved.is_dir():
        raise ExportError(f"--out {root}: exists and is not a directory")
    try:
        resolved.mkdir(mode=0o700, parents=True, exist_ok=True)  # an export is owner-only
        # O_NOFOLLOW: the checked directory itself, not a symlink swapped in since the check
        return resolved, os.open(resolved, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ExportError(f"--out {root}: cannot create or open the directory ({exc.strerror or exc})") from exc


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
