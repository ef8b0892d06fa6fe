"""What a sandbox is given and what it gives back: its limits, a command's result, scans and changes of its layer."""

from __future__ import annotations

from dataclasses import dataclass, field

#: What hashing one changed file costs at least, in bytes of ``Limits.hash_bytes`` (an empty file is still an open).
HASH_MIN_COST = 4096


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox, and what the host spends reading it.

    Attributes:
        cpu_cores / memory_bytes / pids: cgroup limits (where the cgroup filesystem is writable).
        cpu_seconds / file_size_bytes / open_files: rlimits of every process in the sandbox.
        timeout_s: the reaper's wall-clock deadline.
        disk_bytes / disk_inodes: the writable layer's quota (``quota``), enforced as ``disk_quota`` says.
        disk_quota: ``auto`` (the strongest this host can run), ``loop``, ``tmpfs``, ``accounting`` or ``off``.
        tmp_bytes: size of the sandbox's private ``/tmp`` (a tmpfs).
        scan_entries / scan_seconds: bounds of one scan of the writable layer (the per-command snapshot).
        hash_bytes: bytes of changed files hashed per command (beyond, a change has no sha256).
    """

    cpu_cores: float = 1.0
    memory_bytes: int = 1 << 30
    pids: int = 64
    cpu_seconds: int = 120
    file_size_bytes: int = 64 << 20
    open_files: int = 256
    timeout_s: float = 20.0
    disk_bytes: int = 256 << 20
    disk_inodes: int = 32_768
    disk_quota: str = "auto"
    tmp_bytes: int = 64 << 20
    scan_entries: int = 20_000
    scan_seconds: float = 0.5
    hash_bytes: int = 64 << 20


@dataclass
class Snapshot:
    """(size, mtime_ns) of the writable layer's non-directory entries, as one bounded scan saw them.

    Attributes:
        entries: relative path → (size, mtime_ns).
        complete: every entry was seen (else the scan stopped at ``stopped_by``: ``entries`` or ``time``).
        stopped_by: the bound that stopped an incomplete scan.
        bytes: bytes the entries seen occupy; inodes: entries seen, directories included.
    """

    entries: dict[str, tuple[int, int]]
    complete: bool = True
    stopped_by: str | None = None
    bytes: int = 0
    inodes: int = 0


@dataclass
class CommandResult:
    """What one command in a sandbox produced."""

    output: str
    exit_code: int | None
    duration_ms: float
    output_bytes: int
    truncated: bool = False
    sha256: str = ""
    failure_reason: str | None = None
    telemetry: dict[str, float] = field(default_factory=dict)


@dataclass
class FileChange:
    """One change in the writable layer between two snapshots."""

    op: str
    path: str
    size_bytes: int
    sha256: str | None


@dataclass
class LayerDiff:
    """The changes between two snapshots.

    Attributes:
        changes: creates and writes of entries the second scan saw; deletions only when both scans were complete.
        complete: both scans were complete.
    """

    changes: list[FileChange]
    complete: bool = True
