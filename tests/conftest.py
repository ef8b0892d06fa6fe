"""Shared fixtures: isolated settings per test; one embedded broker and one real Kafka per test session."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from common.settings import Settings, load_settings

# Fuzzers (tests marked ``fuzz``) leave max_examples to the profile: ``ci`` is bounded and
# derandomized, so a red build reproduces; ``trajlake bench fuzz`` selects ``fuzz``, random and long.
hypothesis_settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("TRAJLAKE_FUZZ_EXAMPLES", "60")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
hypothesis_settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("TRAJLAKE_FUZZ_EXAMPLES", "5000")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
hypothesis_settings.load_profile("ci")


# tests/kafka is a script directory (no __init__.py): import its module as top-level ``kafka_server``.
sys.path.insert(0, str(Path(__file__).resolve().parent / "kafka"))
if TYPE_CHECKING:
    from kafka_server import KafkaServer


@pytest.fixture(autouse=True)
def _owner_only_umask() -> Iterator[None]:
    """Every test under the umask the CLI and the Dagster resource run with (0o077).

    Deterministic whatever ran before (an in-process CLI call sets it for the rest of the process),
    and the one production runs with: a sandbox uid that could not reach a host-made directory under
    it once made an allowlisted service unreachable, and correct deliverables were judged failed.
    """
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of an embedded tansu broker shared by the test session."""
    from common.broker import start_broker, stop_broker

    settings = load_settings(home=tmp_path_factory.mktemp("broker-home"))
    state = start_broker(settings)
    yield state.bootstrap
    stop_broker(settings)


def kafka_unavailable_reason() -> str | None:
    """Why real Apache Kafka cannot run here (no java or mvn), or None when it can."""
    from kafka_server import cache_dir

    if shutil.which("java") is None and not os.environ.get("TRAJLAKE_KAFKA_JAVA"):
        return "real Apache Kafka needs java on PATH (apt-get install default-jre-headless)"
    has_mvn = shutil.which("mvn") is not None or bool(os.environ.get("TRAJLAKE_KAFKA_MVN"))
    if not has_mvn and not (cache_dir() / "lib").is_dir():
        return "real Apache Kafka needs mvn to assemble its classpath once (apt-get install maven)"
    return None


@pytest.fixture(scope="session")
def kafka_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """A real single-node Apache Kafka (KRaft) broker shared by the test session.

    Tests that stop or restart a broker must start their own ``KafkaServer`` instead.
    """
    reason = kafka_unavailable_reason()
    if reason:
        pytest.skip(reason)
    from kafka_server import KafkaServer, ensure_classpath

    ensure_classpath()
    server = KafkaServer(tmp_path_factory.mktemp("kafka"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_kafka(tmp_path: Path) -> Iterator[KafkaServer]:
    """A real Kafka broker of this test alone, which it may stop, restart or kill."""
    reason = kafka_unavailable_reason()
    if reason:
        pytest.skip(reason)
    from kafka_server import KafkaServer, ensure_classpath

    ensure_classpath()
    server = KafkaServer(tmp_path / "kafka")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session", params=["tansu", pytest.param("kafka", marks=pytest.mark.kafka)])
def broker(request: pytest.FixtureRequest) -> str:
    """Bootstrap address of the session broker: the embedded tansu one, then real Apache Kafka.

    Every test using it (directly or via ``kafka_settings``) runs once per broker; the
    servers are session-scoped, so each starts once.
    """
    if request.param == "tansu":
        return request.getfixturevalue("tansu_broker")
    return request.getfixturevalue("kafka_server").bootstrap


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings with TRAJLAKE_HOME in tmp_path and a unique topic and group (no broker)."""
    suffix = uuid.uuid4().hex[:8]
    monkeypatch.setenv("TRAJLAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAJLAKE_TOPIC", f"events-{suffix}")
    monkeypatch.setenv("TRAJLAKE_CONSUMER_GROUP", f"ingest-{suffix}")
    for name in ("TRAJLAKE_KAFKA_BOOTSTRAP", "TRAJLAKE_CATALOG_URI", "TRAJLAKE_CATALOG_PROPERTIES"):
        monkeypatch.delenv(name, raising=False)
    return load_settings()


@pytest.fixture
def kafka_settings(settings: Settings, broker: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings pointing at the session broker, with this test's topic created."""
    from common.broker import ensure_topic

    monkeypatch.setenv("TRAJLAKE_KAFKA_BOOTSTRAP", broker)
    configured = load_settings()
    ensure_topic(broker, configured.topic, configured.topic_partitions)
    return configured


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``stress`` runs unless asked for with ``-m stress`` or TRAJLAKE_STRESS_TESTS=1."""
    if os.environ.get("TRAJLAKE_STRESS_TESTS") == "1" or "stress" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="long stress run: use -m stress or TRAJLAKE_STRESS_TESTS=1")
    for item in items:
        if "stress" in item.keywords:
            item.add_marker(skip)


#: A test past this many seconds belongs in a slower tier: ``slow`` (or ``e2e`` when it drives the product
#: end to end). The fast tier (``bash scripts/test.sh``) names the unmarked ones it met, so the tier stays fast.
UNMARKED_LIMIT_S = float(os.environ.get("TRAJLAKE_UNMARKED_LIMIT_S", "5"))
_TIER_MARKS = ("slow", "e2e", "stress")
_unmarked_slow: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Time each unmarked test's setup, call and teardown (on the controller too, under xdist)."""
    if any(mark in report.keywords for mark in _TIER_MARKS) or report.skipped:
        return
    _unmarked_slow[report.nodeid] = _unmarked_slow.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    slow = sorted(((t, n) for n, t in _unmarked_slow.items() if t > UNMARKED_LIMIT_S), reverse=True)
    if not slow:
        return
    terminalreporter.section("tests over the fast tier's limit without a tier marker")
    terminalreporter.write_line(
        f"{len(slow)} test(s) took over {UNMARKED_LIMIT_S:g} s and are not marked slow or e2e (docs/testing.md):"
    )
    for seconds, nodeid in slow[:30]:
        terminalreporter.write_line(f"  {seconds:6.1f} s  {nodeid}")
