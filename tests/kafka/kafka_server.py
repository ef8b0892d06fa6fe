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

Command line: ``kafka_cli.py`` beside this file (``scripts/kafka.sh``). The classpath is
built by ``kafka_classpath``, the process and readiness helpers are in ``kafka_process``;
this module re-exports what the test fixtures use.

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

import contextlib
import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from kafka_classpath import KafkaServerError, cache_dir, cds_archive, ensure_classpath, kafka_version, which_or_env
from kafka_process import (
    free_ports,
    pid_alive,
    pid_cmdline,
    port_accepts,
    port_in_use,
    probe_metadata,
    random_cluster_id,
    read_properties,
    tail,
)

__all__ = [
    "KafkaServer",
    "KafkaServerError",
    "cache_dir",
    "ensure_classpath",
    "kafka_version",
]


DEFAULT_START_TIMEOUT: Final[float] = 90.0
"""Seconds ``start()`` waits for the broker to answer a metadata request."""

DEFAULT_STOP_TIMEOUT: Final[float] = 30.0
"""Seconds ``stop()`` waits after SIGTERM before sending SIGKILL."""

DEFAULT_HEAP: Final[str] = "512m"
"""Maximum JVM heap of the broker (``-Xmx``)."""

NODE_ID: Final[int] = 1


_PROPERTIES_NAME: Final[str] = "server.properties"


_LOG4J_NAME: Final[str] = "log4j2.properties"


_PID_NAME: Final[str] = "kafka.pid"


_OUT_NAME: Final[str] = "kafka.out"


_LOG_DIR_NAME: Final[str] = "kraft-logs"


_APP_LOG_DIR_NAME: Final[str] = "logs"


# The server


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
        free = iter(free_ports(2))
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
        return read_properties(meta).get("cluster.id")

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
            text = tail(path, lines)
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
            if port_in_use(port):
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
        props = read_properties(self.properties_file)
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
        java = which_or_env("TRAJLAKE_KAFKA_JAVA", "java")
        cds: list[str] = []
        archive = cds_archive(java)
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
        cluster_id = random_cluster_id()
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
            if port_accepts(self.broker_port) and probe_metadata(self.bootstrap, min(5.0, max(0.5, remaining))):
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
        archive = cds_archive(which_or_env("TRAJLAKE_KAFKA_JAVA", "java"))
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
        if not pid_alive(pid):
            return None
        cmdline = pid_cmdline(pid)
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
            if not pid_alive(pid):
                return True
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            time.sleep(0.05)
        return False


# CLI
