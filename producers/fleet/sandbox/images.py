"""Read-only image layers: one immutable directory per (image name, version), shared by every sandbox."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from importlib import resources
from pathlib import Path

from producers.errors import ImageConflict


def image_tools() -> dict[str, bytes]:
    """The files every task image ships: executor, test runner, egress hook."""
    base = resources.files("producers.fleet").joinpath("image")
    return {
        "bin/tl_exec.py": base.joinpath("tl_exec.py").read_bytes(),
        "bin/tl_test.py": base.joinpath("tl_test.py").read_bytes(),
        "py/sitecustomize.py": base.joinpath("sitecustomize.py").read_bytes(),
    }


def _digest(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return digest.hexdigest()


class ImageStore:
    """Read-only image layers, one immutable directory per (image name, version).

    A new version is built beside the old ones, so sandboxes of a task type pinned to the old
    version keep exactly their environment; rebuilding a version with other content is refused.

    Args:
        root: where image directories live.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()

    def path(self, name: str, version: str) -> Path:
        """Directory of one image version."""
        return self.root / name.replace("/", "__") / version

    def ensure(self, name: str, version: str, files: dict[str, bytes] | None = None) -> Path:
        """The image directory, built on first use.

        Raises:
            ImageConflict: the version exists with different content.
        """
        files = dict(image_tools() if files is None else files)
        files["share/IMAGE"] = f"{name}:{version}\n".encode()
        digest = _digest(files)
        target = self.path(name, version)
        with self._lock:
            manifest = target / "MANIFEST.json"
            if manifest.exists():
                found = json.loads(manifest.read_text())["digest"]
                if found != digest:
                    raise ImageConflict(f"image {name}:{version} exists with digest {found[:12]}, not {digest[:12]}")
                return target
            staging = target.with_name(f".{version}.{os.getpid()}.tmp")
            shutil.rmtree(staging, ignore_errors=True)
            for rel, data in files.items():
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                (staging / rel).write_bytes(data)
            (staging / "MANIFEST.json").write_text(json.dumps({"name": name, "version": version, "digest": digest}))
            for path in sorted(staging.rglob("*"), reverse=True):
                path.chmod(0o555 if path.is_dir() else 0o444)
            staging.chmod(0o555)
            staging.rename(target)
            return target
