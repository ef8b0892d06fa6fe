"""Bubblewrap sandboxes: read-only image layers, private writable layers, limits, egress, reaper.

Layout of one sandbox (host side, under ``<root>/<sandbox_id>/``)::

    workspace/   private writable layer  → /workspace (rw)
    run/         egress gateway socket   → /run/tl (ro)
    secrets/     per-task secret file    → /run/secrets (ro)

plus the task type's image (``ImageStore``, one read-only directory per pinned version, shared by
every sandbox) at ``/opt/tl`` and the host's ``/usr`` (with ``/bin``, ``/lib``… as on the host)
read-only. Nothing else of the host is visible; ``/tmp`` is a private tmpfs of ``Limits.tmp_bytes``,
and the writable layer is a filesystem of its own with a byte and inode quota (``quota``). Namespaces: user,
pid, net, ipc, uts, cgroup (``--unshare-all``); the sandbox has no network interface but loopback,
and (root host) every address it tries is recorded by the egress gateway's tap (``egress``).
Processes run as an unprivileged host uid of their own (root host; ``host``), with the command
executor as the PID namespace's non-dumpable init (``image/tl_exec.py``). Limits: cgroup (v1 or
v2, when writable) pids/memory/CPU quota, plus rlimits (CPU seconds, address space, processes,
file size, open files). A command's timeout kills everything it started. The ``Reaper`` kills a
sandbox at its wall-clock deadline, independent of the agent: SIGKILL to the process group and
every cgroup member; ``--die-with-parent`` and the PID namespace take the rest down, and the
kill is verified (no process left in the sandbox's PID namespace). The host reads what a sandbox
leaves only as regular files, never through links, never blocking (``files``).

Modules: ``images`` (``ImageStore``), ``cgroups`` (``Cgroup``), ``egress`` (``EgressGateway``),
``egress_wire`` (parsing what the sandbox sends the gateway), ``bwrap`` (``Sandbox``, ``Limits``,
``find_bwrap``), ``reaper`` (``Reaper``), ``files`` (reading a sandbox's layer, bounded), ``quota``
(the writable layer's disk quota), ``host`` (uids, the launch, entering the sandbox's network
namespace).
"""

from __future__ import annotations

from producers.errors import BubblewrapMissing, ImageConflict, SandboxError, SandboxKilled
from producers.fleet.sandbox.bwrap import (
    BWRAP_PACKAGE,
    EXEC_FIELDS,
    SANDBOX_UID,
    CommandResult,
    FileChange,
    LayerDiff,
    Limits,
    Sandbox,
    Snapshot,
    bwrap_available,
    find_bwrap,
)
from producers.fleet.sandbox.cgroups import Cgroup
from producers.fleet.sandbox.egress import EgressGateway, NetworkAttempt
from producers.fleet.sandbox.files import layer_entries, read_regular, read_text_regular, sha256_regular
from producers.fleet.sandbox.images import ImageStore, image_tools
from producers.fleet.sandbox.quota import QUOTA_MODES, DiskUsage, WorkspaceQuota
from producers.fleet.sandbox.reaper import Reaper

__all__ = [
    "BWRAP_PACKAGE",
    "QUOTA_MODES",
    "EXEC_FIELDS",
    "SANDBOX_UID",
    "BubblewrapMissing",
    "Cgroup",
    "CommandResult",
    "DiskUsage",
    "EgressGateway",
    "FileChange",
    "ImageConflict",
    "ImageStore",
    "LayerDiff",
    "Limits",
    "NetworkAttempt",
    "Reaper",
    "Sandbox",
    "SandboxError",
    "SandboxKilled",
    "Snapshot",
    "WorkspaceQuota",
    "bwrap_available",
    "find_bwrap",
    "image_tools",
    "layer_entries",
    "read_regular",
    "read_text_regular",
    "sha256_regular",
]
