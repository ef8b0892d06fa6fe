"""Typed settings for every trajlake component, read from ``TRAJLAKE_*`` variables.

One place for configuration: each field documents its environment variable and
default. Nothing else in the code base reads ``os.environ`` for trajlake settings.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """All trajlake settings; ``Settings()`` reads the environment at call time."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_", extra="ignore")

    home: Path = Field(Path(".trajlake"), description="TRAJLAKE_HOME: state, catalog and warehouses.")

    # Kafka
    kafka_bootstrap: str | None = Field(
        None, description="TRAJLAKE_KAFKA_BOOTSTRAP: any Kafka; unset means the embedded broker."
    )
    kafka_extra: dict[str, str] = Field(
        default_factory=dict,
        description="TRAJLAKE_KAFKA_EXTRA: JSON object of librdkafka settings (security, SASL, ...).",
    )
    topic: str = Field("trajlake.events", description="TRAJLAKE_TOPIC: the event topic.")
    topic_partitions: int = Field(8, ge=1, description="TRAJLAKE_TOPIC_PARTITIONS")
    consumer_group: str = Field("trajlake-ingest", description="TRAJLAKE_CONSUMER_GROUP")

    # Iceberg
    catalog_name: str = Field("trajlake", description="TRAJLAKE_CATALOG_NAME")
    catalog_uri: str | None = Field(
        None, description="TRAJLAKE_CATALOG_URI: SQLAlchemy URI; unset means SQLite under home."
    )
    catalog_properties: dict[str, str] = Field(
        default_factory=dict,
        description="TRAJLAKE_CATALOG_PROPERTIES: JSON object passed to pyiceberg load_catalog "
        '(e.g. {"type": "rest", "uri": ...}).',
    )
    namespace: str = Field("trajlake", description="TRAJLAKE_NAMESPACE: Iceberg namespace.")
    hot_warehouse: str | None = Field(None, description="TRAJLAKE_HOT_WAREHOUSE: URI; default home/hot.")
    cold_warehouse: str | None = Field(None, description="TRAJLAKE_COLD_WAREHOUSE: URI; default home/cold.")
    hot_retention_days: float = Field(7.0, gt=0, description="TRAJLAKE_HOT_RETENTION_DAYS")

    # Ingest
    ingest_max_rows: int = Field(50_000, ge=1, description="TRAJLAKE_INGEST_MAX_ROWS per batch")
    ingest_max_bytes: int = Field(64 << 20, ge=1024, description="TRAJLAKE_INGEST_MAX_BYTES per batch")
    ingest_max_seconds: float = Field(5.0, gt=0, description="TRAJLAKE_INGEST_MAX_SECONDS per batch")
    max_event_bytes: int = Field(
        1 << 20, ge=1024, description="TRAJLAKE_MAX_EVENT_BYTES: larger records are dead-lettered."
    )

    # Assembly
    session_idle_timeout_s: float = Field(
        900.0, gt=0, description="TRAJLAKE_SESSION_IDLE_TIMEOUT_S: close sessions idle this long."
    )

    @field_validator("kafka_extra", "catalog_properties", mode="before")
    @classmethod
    def _parse_json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            parsed = json.loads(value) if value.strip() else {}
            if not isinstance(parsed, dict):
                raise ValueError("must be a JSON object")
            return {str(k): str(v) for k, v in parsed.items()}
        return value

    @cached_property
    def home_dir(self) -> Path:
        """Absolute TRAJLAKE_HOME, created on first use."""
        path = self.home.expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def hot_location(self) -> str:
        """Warehouse URI of the hot tier."""
        return self.hot_warehouse or (self.home_dir / "hot").as_uri()

    @property
    def cold_location(self) -> str:
        """Warehouse URI of the cold tier."""
        return self.cold_warehouse or (self.home_dir / "cold").as_uri()

    @property
    def broker_dir(self) -> Path:
        """State directory of the embedded broker (pid file, log, address)."""
        return self.home_dir / "broker"


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment, with explicit overrides taking precedence."""
    return Settings(**overrides)
