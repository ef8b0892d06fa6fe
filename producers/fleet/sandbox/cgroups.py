"""Per-sandbox cgroups (v1 or v2): pids/memory/CPU limits, usage figures, kill of every member."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


class Cgroup:
    """A per-sandbox cgroup (v1 or v2) when the cgroup filesystem is writable; inert otherwise."""

    V1 = ("pids", "memory", "cpu", "cpuacct")

    def __init__(self, name: str, pids: int, memory_bytes: int, cpu_cores: float) -> None:
        self.dirs: dict[str, Path] = {}
        self.v2 = False
        base = Path("/sys/fs/cgroup")
        try:
            if (base / "cgroup.controllers").exists():
                self.v2 = True
                parent = base / "trajlake"
                parent.mkdir(exist_ok=True)
                for node in (base, parent):
                    try:
                        (node / "cgroup.subtree_control").write_text("+pids +memory +cpu")
                    except OSError:
                        pass
                path = parent / name
                path.mkdir()
                self.dirs["v2"] = path
                self._try(path / "pids.max", str(pids))
                self._try(path / "memory.max", str(memory_bytes))
                self._try(path / "cpu.max", f"{int(cpu_cores * 100_000)} 100000")
            else:
                for controller in self.V1:
                    root = base / controller
                    if not root.is_dir() or not os.access(root, os.W_OK):
                        continue
                    path = root / "trajlake" / name
                    path.mkdir(parents=True)
                    self.dirs[controller] = path
                if "pids" in self.dirs:
                    self._try(self.dirs["pids"] / "pids.max", str(pids))
                if "memory" in self.dirs:
                    self._try(self.dirs["memory"] / "memory.limit_in_bytes", str(memory_bytes))
                if "cpu" in self.dirs:
                    self._try(self.dirs["cpu"] / "cpu.cfs_period_us", "100000")
                    self._try(self.dirs["cpu"] / "cpu.cfs_quota_us", str(int(cpu_cores * 100_000)))
        except OSError:
            self.remove()
            self.dirs = {}

    @staticmethod
    def _try(path: Path, value: str) -> None:
        try:
            path.write_text(value)
        except OSError:
            pass

    @property
    def active(self) -> bool:
        """Whether any controller is in use."""
        return bool(self.dirs)

    def procs_files(self) -> list[Path]:
        """``cgroup.procs`` of every directory (a process joins by writing its pid to each)."""
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def pids(self) -> set[int]:
        """Processes currently in the cgroup."""
        found: set[int] = set()
        for path in self.procs_files():
            try:
                found.update(int(x) for x in path.read_text().split())
            except OSError:
                pass
        return found

    def _read(self, controller: str, name: str) -> int | None:
        path = self.dirs.get(controller)
        if path is None:
            return None
        try:
            text = (path / name).read_text()
        except OSError:
            return None
        if name == "cpu.stat":
            for line in text.splitlines():
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) * 1000
            return None
        return int(text.split()[0]) if text.strip().isdigit() else None

    def stats(self) -> dict[str, int]:
        """CPU time (ns), memory now and peak (bytes), processes now (what the kernel exposes)."""
        if self.v2:
            keys = {
                "cpu_ns": ("v2", "cpu.stat"),
                "memory": ("v2", "memory.current"),
                "memory_peak": ("v2", "memory.peak"),
                "pids": ("v2", "pids.current"),
            }
        else:
            keys = {
                "cpu_ns": ("cpuacct", "cpuacct.usage"),
                "memory": ("memory", "memory.usage_in_bytes"),
                "memory_peak": ("memory", "memory.max_usage_in_bytes"),
                "pids": ("pids", "pids.current"),
            }
        out = {}
        for key, (controller, name) in keys.items():
            value = self._read(controller, name)
            if value is not None:
                out[key] = value
        return out

    def kill(self) -> None:
        """SIGKILL every member."""
        if self.v2 and "v2" in self.dirs:
            self._try(self.dirs["v2"] / "cgroup.kill", "1")
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        """Remove the cgroup directories (once empty)."""
        for path in self.dirs.values():
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
