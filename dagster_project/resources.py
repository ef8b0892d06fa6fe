"""Typed Dagster resources: settings, Kafka and the Iceberg catalog.

Fields left unset fall back to the ``TRAJLAKE_*`` environment, read at run
time (not import time), so one code location serves every deployment.
"""

from typing import Any

from dagster import ConfigurableResource
from pyiceberg.catalog import Catalog

from common.settings import Settings, load_settings


class TrajlakeResource(ConfigurableResource):
    """Where trajlake keeps its state; ``None`` fields come from ``TRAJLAKE_*``."""

    home: str | None = None

    def settings(self, **overrides: Any) -> Settings:
        """Settings for a run (environment, then this resource's fields, then overrides)."""
        if self.home:
            overrides.setdefault("home", self.home)
        return load_settings(**overrides)


class KafkaResource(ConfigurableResource):
    """The Kafka cluster; the embedded broker when ``bootstrap`` is unset."""

    bootstrap: str | None = None
    topic: str | None = None
    consumer_group: str | None = None

    def overrides(self) -> dict[str, Any]:
        """Settings overrides carried by this resource."""
        values = {"kafka_bootstrap": self.bootstrap, "topic": self.topic, "consumer_group": self.consumer_group}
        return {k: v for k, v in values.items() if v is not None}


class IcebergResource(ConfigurableResource):
    """The Iceberg catalog; SQLite under ``TRAJLAKE_HOME`` when ``uri`` is unset."""

    uri: str | None = None
    namespace: str | None = None

    def overrides(self) -> dict[str, Any]:
        """Settings overrides carried by this resource."""
        values = {"catalog_uri": self.uri, "namespace": self.namespace}
        return {k: v for k, v in values.items() if v is not None}

    def catalog(self, settings: Settings) -> Catalog:
        """Open the catalog."""
        from warehouse.catalog import open_catalog

        return open_catalog(settings)


def run_settings(trajlake: TrajlakeResource, kafka: KafkaResource, iceberg: IcebergResource) -> Settings:
    """Settings for one run from the three resources."""
    return trajlake.settings(**kafka.overrides(), **iceberg.overrides())
