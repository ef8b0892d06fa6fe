"""The one composed Dagster resource every asset takes: where the lakehouse lives and how to reach it.

Fields left unset fall back to the ``TRAJLAKE_*`` environment, read at run time (not import
time), so one code location serves every deployment. Kafka and the Iceberg catalog are nested
configuration of the one resource, so an asset asks for ``lakehouse`` and opens the lakehouse
(:meth:`LakehouseResource.open`) the stages it calls take; ``settings()`` is for what is not the
lakehouse's (check thresholds, the fleet, Kafka).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dagster import Config, ConfigurableResource, RetryRequested
from pydantic import Field

from common.errors import is_transient
from common.settings import Settings, load_settings
from warehouse.lakehouse import Lakehouse

#: Dagster retries of a step that failed with a transient trajlake error, and the wait before each.
TRANSIENT_RETRIES = 3
TRANSIENT_RETRY_WAIT_S = 15


class KafkaConfig(Config):
    """The Kafka cluster; the embedded broker when ``bootstrap`` is unset."""

    bootstrap: str | None = None
    topic: str | None = None
    consumer_group: str | None = None


class IcebergConfig(Config):
    """The Iceberg catalog; SQLite under ``TRAJLAKE_HOME`` when ``uri`` is unset."""

    uri: str | None = None
    namespace: str | None = None


class LakehouseResource(ConfigurableResource):
    """Where trajlake keeps its state and how it reaches Kafka and the catalog.

    Attributes:
        home: ``TRAJLAKE_HOME``; unset means the environment's.
        kafka: Kafka overrides.
        iceberg: catalog overrides.
    """

    home: str | None = None
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    iceberg: IcebergConfig = Field(default_factory=IcebergConfig)

    def settings(self, **overrides: Any) -> Settings:
        """Settings for a run: the environment, then this resource's fields, then ``overrides``.

        Files trajlake writes during the run are owner-only (the process umask is set here,
        as the CLI does), since a Dagster run process is not started through the CLI.
        """
        os.umask(0o077)
        values: dict[str, Any] = {
            "home": self.home,
            "kafka_bootstrap": self.kafka.bootstrap,
            "topic": self.kafka.topic,
            "consumer_group": self.kafka.consumer_group,
            "catalog_uri": self.iceberg.uri,
            "namespace": self.iceberg.namespace,
        }
        return load_settings(**{**{k: v for k, v in values.items() if v is not None}, **overrides})

    def open(self, **overrides: Any) -> Lakehouse:
        """The run's lakehouse, opened once from :meth:`settings` and handed to the stages an asset calls.

        Raises:
            WarehouseError: the catalog cannot be opened or a table cannot be created or evolved.
        """
        return Lakehouse.open(self.settings(**overrides))


@contextmanager
def transient_retries() -> Iterator[None]:
    """Turn a transient trajlake failure (broker unreachable, commit conflicts) into a Dagster retry.

    Terminal errors propagate unchanged: retrying them would only repeat the failure.
    """
    try:
        yield
    except Exception as exc:
        if is_transient(exc):
            raise RetryRequested(max_retries=TRANSIENT_RETRIES, seconds_to_wait=TRANSIENT_RETRY_WAIT_S) from exc
        raise
