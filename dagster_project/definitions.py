"""The trajlake code location: one merge of the per-domain definitions."""

from dagster import Definitions

from dagster_project.defs.lakehouse import lakehouse_assets
from dagster_project.resources import IcebergResource, KafkaResource, TrajlakeResource

defs = Definitions(
    assets=[*lakehouse_assets],
    resources={"trajlake": TrajlakeResource(), "kafka": KafkaResource(), "iceberg": IcebergResource()},
)
