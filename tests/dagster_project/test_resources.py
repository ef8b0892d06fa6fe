"""The composed resource and the transient-retry policy of every asset."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import RetryRequested

from common.errors import ConfigError, KafkaUnavailable
from dagster_project.resources import IcebergConfig, KafkaConfig, LakehouseResource, transient_retries
from warehouse.errors import CommitConflict


def test_resource_fields_override_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_TOPIC", "from-env")
    monkeypatch.setenv("TRAJLAKE_CONSUMER_GROUP", "env-group")
    resource = LakehouseResource(
        home=str(tmp_path), kafka=KafkaConfig(topic="from-resource"), iceberg=IcebergConfig(namespace="ns")
    )
    settings = resource.settings()
    assert (settings.home, settings.topic, settings.consumer_group, settings.namespace) == (
        tmp_path,
        "from-resource",
        "env-group",
        "ns",
    )


def test_the_resource_opens_the_lakehouse_its_fields_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAJLAKE_CATALOG_URI", "TRAJLAKE_CATALOG_PROPERTIES", "TRAJLAKE_HOT_WAREHOUSE"):
        monkeypatch.delenv(name, raising=False)
    lake = LakehouseResource(home=str(tmp_path / "home"), iceberg=IcebergConfig(namespace="ns")).open()
    assert lake.namespace == "ns" and lake.home == (tmp_path / "home").resolve()
    assert {name for _, name in lake.catalog.list_tables("ns")} >= {"raw_events", "trajectories", "scores"}


@pytest.mark.parametrize("error", [KafkaUnavailable("broker down"), CommitConflict("lost five races")])
def test_transient_errors_become_dagster_retries(error: Exception) -> None:
    with pytest.raises(RetryRequested) as raised, transient_retries():
        raise error
    assert raised.value.__cause__ is error


def test_transient_cause_is_recognised_through_a_wrapper() -> None:
    with pytest.raises(RetryRequested), transient_retries():
        try:
            raise KafkaUnavailable("no answer")
        except KafkaUnavailable as exc:
            raise RuntimeError("ingest failed") from exc


@pytest.mark.parametrize("error", [ConfigError("TRAJLAKE_HOME is a file"), ValueError("a bug")])
def test_terminal_errors_fail_the_step_unchanged(error: Exception) -> None:
    with pytest.raises(type(error)) as raised, transient_retries():
        raise error
    assert raised.value is error
