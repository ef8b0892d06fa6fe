"""Shared fixtures: isolated settings per test, one embedded broker per test session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.settings import Settings, load_settings


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of an embedded tansu broker shared by the test session."""
    from pipelines.broker import start_broker, stop_broker

    settings = load_settings(home=tmp_path_factory.mktemp("broker-home"))
    state = start_broker(settings)
    yield state.bootstrap
    stop_broker(settings)


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
    from pipelines.broker import ensure_topic

    monkeypatch.setenv("TRAJLAKE_KAFKA_BOOTSTRAP", broker)
    configured = load_settings()
    ensure_topic(broker, configured.topic, configured.topic_partitions)
    return configured


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``slow`` tests unless asked for with ``-m slow`` or TRAJLAKE_SLOW_TESTS=1."""
    if os.environ.get("TRAJLAKE_SLOW_TESTS") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow stress run: use -m slow or TRAJLAKE_SLOW_TESTS=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
