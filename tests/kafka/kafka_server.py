"""Real single-node Apache Kafka broker (KRaft, combined mode) for integration tests.

The broker is assembled from Maven Central artifacts (see ``pom.xml`` beside
this file): ``mvn dependency:copy-dependencies`` copies the runtime classpath of
``org.apache.kafka:kafka_2.13`` into a cache directory once, and every later
start reuses it. The server runs as a plain ``java`` subprocess of
``kafka.Kafka`` with a ``server.properties`` written into a caller-chosen data
directory, which also holds the persistent log dir, so a broker can be stopped
and restarted on the same ports without losing data.

Only the standard library is needed, except for the readiness probe, which uses
``confluent_kafka.admin.AdminClient`` when it is importable (a raw Kafka
``ApiVersions`` request over a socket is used otherwise).

Typical use::

    with KafkaServer(tmp_path / "kafka") as kafka:
        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        ...
        kafka.stop()
        time.sleep(10)
        kafka.start()  # same ports, same data

Command line::

    python tests/kafka/kafka_server.py build
    python tests/kafka/kafka_server.py run --dir DIR     # blocks until Ctrl-C
    python tests/kafka/kafka_server.py start --dir DIR   # detached, pid file
    python tests/kafka/kafka_server.py stop --dir DIR

Environment:
    TRAJLAKE_KAFKA_CACHE: directory holding the cached classpath (default
        ``~/.cache/trajlake/kafka-<version>``).
    TRAJLAKE_KAFKA_JAVA: java executable (default: ``$JAVA_HOME/bin/java``,
        else ``java`` on ``PATH``).
    TRAJLAKE_KAFKA_MVN: maven executable (default: ``mvn`` on ``PATH``).
    TRAJLAKE_KAFKA_CDS: set to ``0`` to disable the AppCDS class archive.

Start-up speed: the JVM runs with C1 only (``-XX:TieredStopAtLevel=1``), a
small heap and an application class-data-sharing archive. The archive is
written into the cache directory by the first broker that is stopped cleanly
(that first ``stop()`` takes ~7 s longer) and makes later starts ~1.5 s faster.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Final

__all__ = [
    "KafkaServer",
    "KafkaServerError",
    "cache_dir",
    "ensure_classpath",
    "kafka_version",
    "main",
]

POM_PATH: Final[Path] = Path(__file__).resolve().with_name("pom.xml")
"""The Maven project that lists the broker's runtime classpath."""

DEFAULT_START_TIMEOUT: Final[float] = 90.0
"""Seconds ``start()`` waits for the broker to answer a metadata request."""

DEFAULT_STOP_TIMEOUT: Final[float] = 30.0
"""Seconds ``stop()`` waits after SIGTERM before sending SIGKILL."""

DEFAULT_HEAP: Final[str] = "512m"
"""Maximum JVM heap of the broker (``-Xmx``)."""

NODE_ID: Final[int] = 1

_POM_NS: Final[dict[str, str]] = {"m": "http://maven.apache.org/POM/4.0.0"}
_STAMP_NAME: Final[str] = "classpath.sha256"
_PROPERTIES_NAME: Final[str] = "server.properties"
_LOG4J_NAME: Final[str] = "log4j2.properties"
_PID_NAME: Final[str] = "kafka.pid"
_OUT_NAME: Final[str] = "kafka.out"
_LOG_DIR_NAME: Final[str] = "kraft-logs"
_APP_LOG_DIR_NAME: Final[str] = "logs"


class KafkaServerError(RuntimeError):
    """Raised when the classpath cannot be built or the broker fails to run."""


# --------------------------------------------------------------------------
# Classpath (Maven) handling
# --------------------------------------------------------------------------


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


def _which_or_env(env_name: str, default: str) -> str:
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
            _which_or_env("TRAJLAKE_KAFKA_MVN", "mvn"),
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


def _cds_archive(java: str) -> Path | None:
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


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct free TCP ports on 127.0.0.1."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _port_accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def _random_cluster_id() -> str:
    """Return a Kafka ``Uuid`` string (22 url-safe base64 chars, no padding)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):  # Kafka's Uuid.randomUuid() avoids these too
            return text


def _read_properties(path: Path) -> dict[str, str]:
    props: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip()
    return props


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def _pid_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _probe_api_versions(port: int, timeout: float) -> bool:
    """Send a raw ``ApiVersions`` v0 request; True if the broker answers OK."""
    client_id = b"trajlake-probe"
    body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = sock.recv(10)
    except OSError:
        return False
    if len(header) < 10:
        return False
    correlation_id, error_code = struct.unpack(">ih", header[4:10])
    return bool(correlation_id == 7 and error_code == 0)


def _probe_metadata(bootstrap: str, timeout: float) -> bool:
    """Ask for cluster metadata; True once at least one broker is listed."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:  # pragma: no cover - fallback when the client is absent
        return _probe_api_versions(int(bootstrap.rpartition(":")[2]), timeout)
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.connection.setup.timeout.ms": max(1000, int(timeout * 1000)),
            "log_level": 0,
        },
        logger=_NullLogger(),
    )
    try:
        metadata = admin.list_topics(timeout=timeout)
    except Exception:  # any failure just means "not ready yet"
        return False
    return bool(metadata.brokers)


class _NullLogger:
    """Swallows librdkafka log lines emitted while the broker is still down."""

    def log(self, *_args: object, **_kwargs: object) -> None:
        """Discard one log record."""


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


class KafkaServer:
    """A single-node KRaft Kafka broker+controller running as a ``java`` subprocess.

    Everything lives under ``data_dir``: ``server.properties``,
    ``log4j2.properties``, the persistent Kafka log dir (``kraft-logs/``), the
    broker's own log files (``logs/server.log``), the JVM's stdout/stderr
    (``kafka.out``) and a pid file (``kafka.pid``). Ports are chosen once, when
    the directory is first used, and reused on every restart; re-opening an
    existing data dir picks up its ports and cluster id.

    Attributes:
        data_dir: Absolute path of the data directory.
        broker_port: Port of the PLAINTEXT client listener on 127.0.0.1.
        controller_port: Port of the KRaft controller listener on 127.0.0.1.
        heap: Maximum JVM heap (``-Xmx`` value).
        start_timeout: Default seconds ``start()`` waits for readiness.
        stop_timeout: Default seconds ``stop()`` waits before SIGKILL.
        extra_properties: Additional/overriding broker properties.
        jvm_args: Additional JVM arguments appended after the defaults.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        broker_port: int | None = None,
        controller_port: int | None = None,
        heap: str = DEFAULT_HEAP,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        extra_properties: Mapping[str, str] | None = None,
        jvm_args: Sequence[str] = (),
    ) -> None:
        """Prepare (but do not start) a broker in ``data_dir``.

        Args:
            data_dir: Directory for config, data and logs; created if missing.
                If it already holds a ``server.properties`` from an earlier
                run, its ports are reused.
            broker_port: Client port; default: the existing one or a free one.
            controller_port: Controller port; default: the existing one or a
                free one.
            heap: Maximum JVM heap, e.g. ``"512m"``.
            start_timeout: Default readiness timeout of ``start()`` in seconds.
            stop_timeout: Default SIGTERM grace period of ``stop()`` in seconds.
            extra_properties: Broker properties added to (or overriding) the
                generated ``server.properties``.
            jvm_args: Extra JVM options, appended after the defaults.
        """
        self.data_dir: Path = Path(data_dir).expanduser().resolve()
        self.heap = heap
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.extra_properties: dict[str, str] = dict(extra_properties or {})
        self.jvm_args: list[str] = list(jvm_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

        existing = self._existing_ports()
        free = iter(_free_ports(2))
        self.broker_port: int = broker_port or (existing[0] if existing else next(free))
        self.controller_port: int = controller_port or (existing[1] if existing else next(free))
        if self.broker_port == self.controller_port:
            raise ValueError("broker_port and controller_port must differ")

    # ---- paths and simple properties -------------------------------------

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` value, ``"127.0.0.1:PORT"``."""
        return f"127.0.0.1:{self.broker_port}"

    @property
    def properties_file(self) -> Path:
        """Path of the generated ``server.properties``."""
        return self.data_dir / _PROPERTIES_NAME

    @property
    def log_dir(self) -> Path:
        """The persistent Kafka data (``log.dirs``) directory."""
        return self.data_dir / _LOG_DIR_NAME

    @property
    def log_file(self) -> Path:
        """File receiving the JVM's stdout and stderr."""
        return self.data_dir / _OUT_NAME

    @property
    def server_log(self) -> Path:
        """The broker's log4j ``server.log``."""
        return self.data_dir / _APP_LOG_DIR_NAME / "server.log"

    @property
    def pid_file(self) -> Path:
        """File holding the pid of the running broker."""
        return self.data_dir / _PID_NAME

    @property
    def pid(self) -> int | None:
        """Pid of the running broker (from this object or the pid file), else None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        return self._pid_from_file()

    @property
    def cluster_id(self) -> str | None:
        """The cluster id stored in ``meta.properties``, or None if unformatted."""
        meta = self.log_dir / "meta.properties"
        if not meta.is_file():
            return None
        return _read_properties(meta).get("cluster.id")

    def is_running(self) -> bool:
        """Return True if the broker process is alive."""
        return self.pid is not None

    def log_tail(self, lines: int = 60) -> str:
        """Return the last lines of ``kafka.out`` and ``logs/server.log``.

        Args:
            lines: How many lines of each file to return.

        Returns:
            A printable excerpt for error messages.
        """
        parts = []
        for path in (self.log_file, self.server_log):
            text = _tail(path, lines)
            if text:
                parts.append(f"----- {path} (last {lines} lines) -----\n{text}")
        return "\n".join(parts) or "(no log output)"

    # ---- lifecycle --------------------------------------------------------

    def start(self, timeout: float | None = None) -> KafkaServer:
        """Start the broker and wait until it serves metadata requests.

        Builds/reuses the cached classpath, writes the configuration, formats
        the storage on first use, launches ``java kafka.Kafka`` and waits until
        the client port accepts connections and a metadata request succeeds.
        A stale broker left running on this data dir (per the pid file) is
        stopped first. Calling ``start()`` on a running server is a no-op.

        Args:
            timeout: Readiness timeout in seconds (default ``start_timeout``).

        Returns:
            self, for chaining.

        Raises:
            KafkaServerError: If a port is taken, formatting fails, the JVM
                exits, or the broker is not ready in time. The message contains
                the tail of the broker's logs.
        """
        if self._proc is not None and self._proc.poll() is None:
            return self
        timeout = self.start_timeout if timeout is None else timeout
        stale = self._pid_from_file()
        if stale is not None:
            self._publish_cds(clean=self._terminate_pid(stale, self.stop_timeout))
        lib = ensure_classpath()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        (self.data_dir / _APP_LOG_DIR_NAME).mkdir(exist_ok=True)
        for port in (self.broker_port, self.controller_port):
            if _port_in_use(port):
                raise KafkaServerError(
                    f"port 127.0.0.1:{port} is already in use; cannot start Kafka in {self.data_dir}"
                )
        self._write_config()
        if self.cluster_id is None:
            self._format_storage(lib)

        cmd = [*self._java_command(lib, dump_cds=True), "kafka.Kafka", str(self.properties_file)]
        self._out = self.log_file.open("ab")
        self._out.write(f"\n===== starting Kafka at {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode())
        self._out.flush()
        self._proc = subprocess.Popen(
            cmd,
            cwd=self.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid_file.write_text(f"{self._proc.pid}\n")
        try:
            self._wait_ready(timeout)
        except BaseException:
            self._kill_own(5.0)
            self._publish_cds(clean=False)
            raise
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the broker: SIGTERM, then SIGKILL if it has not exited in time.

        Works both for a broker started by this object and for one found via
        the pid file (e.g. started by ``kafka_server.py start``). Data and
        ports are kept, so ``start()`` can resume later. No-op if not running.

        Args:
            timeout: Seconds to wait after SIGTERM (default ``stop_timeout``).
        """
        timeout = self.stop_timeout if timeout is None else timeout
        clean = True
        if self._proc is not None:
            clean = self._kill_own(timeout)
        else:
            pid = self._pid_from_file()
            if pid is not None:
                clean = self._terminate_pid(pid, timeout)
        self.pid_file.unlink(missing_ok=True)
        self._publish_cds(clean=clean)

    def restart(self, downtime: float = 0.0, timeout: float | None = None) -> KafkaServer:
        """Stop the broker, optionally stay down, and start it on the same ports and data.

        Args:
            downtime: Seconds to sleep between stop and start.
            timeout: Readiness timeout for the start (default ``start_timeout``).

        Returns:
            self, for chaining.
        """
        self.stop()
        if downtime > 0:
            time.sleep(downtime)
        return self.start(timeout)

    def __enter__(self) -> KafkaServer:
        """Start the broker (if not running) and return it."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the broker."""
        self.stop()

    def __repr__(self) -> str:
        """Return a debug representation."""
        state = "running" if self.is_running() else "stopped"
        return f"KafkaServer({str(self.data_dir)!r}, bootstrap={self.bootstrap!r}, {state})"

    # ---- internals ---------------------------------------------------------

    def _existing_ports(self) -> tuple[int, int] | None:
        if not self.properties_file.is_file():
            return None
        props = _read_properties(self.properties_file)
        ports: dict[str, int] = {}
        for listener in props.get("listeners", "").split(","):
            name, _, address = listener.partition("://")
            port = address.rpartition(":")[2]
            if port.isdigit():
                ports[name.strip()] = int(port)
        if "PLAINTEXT" in ports and "CONTROLLER" in ports:
            return ports["PLAINTEXT"], ports["CONTROLLER"]
        return None

    def _properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "8",
            "default.replication.factor": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            # Fewer internal partitions -> the group coordinator loads faster.
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "8",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Default is 128 MiB allocated at start-up; plenty for tests.
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "2",
        }
        props.update(self.extra_properties)
        return props

    def _write_config(self) -> None:
        lines = [
            f"# generated by {Path(__file__).name}; rewritten on every start",
            *(f"{k}={v}" for k, v in self._properties().items()),
        ]
        self.properties_file.write_text("\n".join(lines) + "\n")
        app_logs = self.data_dir / _APP_LOG_DIR_NAME
        log4j = f"""\
# generated by {Path(__file__).name}
status = warn
name = trajlake-kafka
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {app_logs / "server.log"}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = warn
rootLogger.level = info
rootLogger.appenderRef.file.ref = FILE
rootLogger.appenderRef.console.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.statechange.name = state.change.logger
logger.statechange.level = warn
"""
        (self.data_dir / _LOG4J_NAME).write_text(log4j)

    def _java_command(self, lib: Path, *, dump_cds: bool = False) -> list[str]:
        java = _which_or_env("TRAJLAKE_KAFKA_JAVA", "java")
        cds: list[str] = []
        archive = _cds_archive(java)
        if archive is not None and archive.is_file():
            cds = [f"-XX:SharedArchiveFile={archive}"]
        elif archive is not None and dump_cds:
            # Written by the JVM when it exits; published by _publish_cds().
            pending = self._cds_pending(archive)
            pending.unlink(missing_ok=True)
            cds = [f"-XX:ArchiveClassesAtExit={pending}"]
        return [
            java,
            f"-Xmx{self.heap}",
            "-Xms64m",
            "-Xss512k",
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            *cds,
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            "-Dlog4j2.configurationFile=" + str(self.data_dir / _LOG4J_NAME),
            "-Dkafka.logs.dir=" + str(self.data_dir / _APP_LOG_DIR_NAME),
            *self.jvm_args,
            "-cp",
            str(lib / "*"),
        ]

    def _format_storage(self, lib: Path) -> None:
        cluster_id = _random_cluster_id()
        cmd = [
            *self._java_command(lib),
            "kafka.tools.StorageTool",
            "format",
            "--config",
            str(self.properties_file),
            "--cluster-id",
            cluster_id,
            "--standalone",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=self.data_dir)
        with self.log_file.open("a") as out:
            out.write(f"===== kafka-storage format (cluster id {cluster_id}) =====\n{result.stdout}{result.stderr}")
        if result.returncode != 0:
            raise KafkaServerError(
                f"kafka-storage format failed (exit {result.returncode}) in {self.data_dir}:\n"
                f"{result.stdout}{result.stderr}"
            )

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise KafkaServerError(
                    f"Kafka exited with code {code} during start-up ({self.data_dir})\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaServerError(
                    f"Kafka at {self.bootstrap} not ready within {timeout:.0f}s ({self.data_dir})\n{self.log_tail()}"
                )
            if _port_accepts(self.broker_port) and _probe_metadata(self.bootstrap, min(5.0, max(0.5, remaining))):
                return
            time.sleep(0.1)

    def _kill_own(self, timeout: float) -> bool:
        """Stop our own subprocess; return False if it had to be SIGKILLed."""
        clean = True
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                clean = False
                proc.kill()
                proc.wait()
        if self._out is not None:
            self._out.close()
            self._out = None
        return clean

    def _cds_pending(self, archive: Path) -> Path:
        tag = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:10]
        return archive.with_name(f"{archive.name}.tmp-{tag}")

    def _publish_cds(self, *, clean: bool) -> None:
        """Move a class archive dumped at JVM exit into place (if complete)."""
        archive = _cds_archive(_which_or_env("TRAJLAKE_KAFKA_JAVA", "java"))
        if archive is None:
            return
        pending = self._cds_pending(archive)
        if not pending.is_file():
            return
        if clean and pending.stat().st_size > 0 and not archive.exists():
            pending.replace(archive)
        else:
            pending.unlink(missing_ok=True)

    def _pid_from_file(self) -> int | None:
        """Return the pid in the pid file if it is a live broker for this data dir."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not _pid_alive(pid):
            return None
        cmdline = _pid_cmdline(pid)
        if cmdline and (str(self.properties_file) not in cmdline or "kafka.Kafka" not in cmdline):
            return None  # pid recycled by an unrelated process
        return pid

    @staticmethod
    def _terminate_pid(pid: int, timeout: float) -> bool:
        """SIGTERM ``pid``, SIGKILL after ``timeout``; return False if killed."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not _pid_alive(pid):
                return True
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while _pid_alive(pid):
            time.sleep(0.05)
        return False


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point.

    Sub-commands: ``build`` (cache the classpath only), ``run --dir D`` (start,
    print the bootstrap address, block until Ctrl-C/SIGTERM, then stop),
    ``start --dir D`` (start detached, write ``D/kafka.pid``, print the
    bootstrap address), ``stop --dir D`` and ``status --dir D``.

    Args:
        argv: Arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(prog="kafka_server.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build and cache the Kafka classpath")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    for name, text in (
        ("run", "start in the foreground; Ctrl-C stops"),
        ("start", "start detached (pid file in DIR)"),
        ("stop", "stop the broker of DIR"),
        ("status", "print bootstrap and state of DIR"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--dir", required=True, type=Path, help="data directory")
        if name in ("run", "start"):
            cmd.add_argument("--timeout", type=float, default=DEFAULT_START_TIMEOUT, help="readiness timeout (s)")
            cmd.add_argument("--port", type=int, default=None, help="broker port (default: free/previous)")
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            print(ensure_classpath(force=args.force))
            return 0
        server = KafkaServer(args.dir, broker_port=getattr(args, "port", None))
        if args.command == "start":
            if not server.is_running():
                server.start(args.timeout)
            print(server.bootstrap, flush=True)
            return 0
        if args.command == "stop":
            server.stop()
            return 0
        if args.command == "status":
            print(f"{server.bootstrap} {'running' if server.is_running() else 'stopped'}")
            return 0 if server.is_running() else 3
        with _sigterm_as_interrupt():
            try:
                server.start(args.timeout)
                print(server.bootstrap, flush=True)
                while server.is_running():
                    time.sleep(0.5)
                print(f"Kafka exited unexpectedly\n{server.log_tail()}", file=sys.stderr)
                return 1
            except KeyboardInterrupt:
                return 0
            finally:
                server.stop()
    except KafkaServerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
