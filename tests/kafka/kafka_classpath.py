"""The real Kafka broker's classpath: built once from Maven Central (``pom.xml`` beside this file)
into a cache directory, and the JVM's class-data-sharing archive kept beside it."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Final

POM_PATH: Final[Path] = Path(__file__).resolve().with_name("pom.xml")
"""The Maven project that lists the broker's runtime classpath."""


_POM_NS: Final[dict[str, str]] = {"m": "http://maven.apache.org/POM/4.0.0"}


_STAMP_NAME: Final[str] = "classpath.sha256"


class KafkaServerError(RuntimeError):
    """Raised when the classpath cannot be built or the broker fails to run."""


# Classpath (Maven) handling


def kafka_version(pom: Path = POM_PATH) -> str:
    """Return the Kafka version pinned in ``pom.xml``.

    Args:
        pom: Path to the Maven project listing the classpath.

    Returns:
        The value of the ``kafka.version`` property, e.g. ``"4.4.0"``.

    Raises:
        KafkaServerError: If the property is missing.
    """
    root = ET.parse(pom).getroot()
    node = root.find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not (node.text or "").strip():
        raise KafkaServerError(f"no <kafka.version> property in {pom}")
    return (node.text or "").strip()


def cache_dir(pom: Path = POM_PATH) -> Path:
    """Return the directory that caches the broker classpath.

    Args:
        pom: Path to the Maven project listing the classpath.

    Returns:
        ``$TRAJLAKE_KAFKA_CACHE`` if set, else
        ``~/.cache/trajlake/kafka-<version>``.
    """
    override = os.environ.get("TRAJLAKE_KAFKA_CACHE")
    if override:
        return Path(override).expanduser().resolve()
    return Path.home() / ".cache" / "trajlake" / f"kafka-{kafka_version(pom)}"


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def which_or_env(env_name: str, default: str) -> str:
    explicit = os.environ.get(env_name)
    if explicit:
        return explicit
    if default == "java":
        java_home = os.environ.get("JAVA_HOME")
        if java_home and (Path(java_home) / "bin" / "java").is_file():
            return str(Path(java_home) / "bin" / "java")
    found = shutil.which(default)
    if found is None:
        raise KafkaServerError(f"{default!r} not found on PATH (set {env_name})")
    return found


def ensure_classpath(*, force: bool = False, pom: Path = POM_PATH, quiet: bool = True) -> Path:
    """Build the broker classpath with Maven once and cache it.

    The cache is keyed by the SHA-256 of ``pom.xml``: editing the pom causes a
    rebuild, otherwise an existing cache is reused immediately. Concurrent
    callers are serialised with a file lock.

    Args:
        force: Rebuild even if a matching cache exists.
        pom: Path to the Maven project listing the classpath.
        quiet: Pass ``-q`` to Maven.

    Returns:
        The directory holding the jars (use ``<dir>/*`` as the classpath).

    Raises:
        KafkaServerError: If Maven fails or produces no Kafka jar.
    """
    root = cache_dir(pom)
    lib = root / "lib"
    stamp = root / _STAMP_NAME
    digest = _pom_digest(pom)
    if not force and _cache_valid(lib, stamp, digest):
        return lib
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _cache_valid(lib, stamp, digest):
            return lib
        tmp = root / f"lib.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            which_or_env("TRAJLAKE_KAFKA_MVN", "mvn"),
            "-B",
            *(["-q"] if quiet else []),
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-Dkafka.lib.dir={tmp}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
            shutil.rmtree(tmp, ignore_errors=True)
            output = (result.stdout + result.stderr)[-4000:]
            raise KafkaServerError(
                f"maven failed to build the Kafka classpath (exit {result.returncode}): {' '.join(cmd)}\n{output}"
            )
        stamp.unlink(missing_ok=True)
        shutil.rmtree(lib, ignore_errors=True)
        for stale in root.glob("*.jsa*"):  # class archives of the old classpath
            stale.unlink(missing_ok=True)
        tmp.rename(lib)
        stamp.write_text(digest + "\n")
    return lib


def cds_archive(java: str) -> Path | None:
    """Return the AppCDS archive path for ``java``, or None if CDS is disabled."""
    if os.environ.get("TRAJLAKE_KAFKA_CDS", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    real = os.path.realpath(java)
    try:
        mtime = Path(real).stat().st_mtime_ns
    except OSError:
        mtime = 0
    key = hashlib.sha256(f"{real}:{mtime}".encode()).hexdigest()[:12]
    return cache_dir() / f"kafka-{key}.jsa"


def _cache_valid(lib: Path, stamp: Path, digest: str) -> bool:
    try:
        return stamp.read_text().strip() == digest and any(lib.glob("kafka_2.13-*.jar"))
    except OSError:
        return False
