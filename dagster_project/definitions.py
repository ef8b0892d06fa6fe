"""The trajlake code location: one merge of the per-domain definitions."""

from dagster import Definitions

from dagster_project.defs.fleet import FleetResource, sandbox_runs
from dagster_project.defs.lakehouse import lakehouse_assets
from dagster_project.defs.lifecycle import lifecycle_assets, lifecycle_jobs, lifecycle_schedules
from dagster_project.defs.quality import quality_assets, quality_checks, quality_jobs, quality_schedules
from dagster_project.resources import IcebergResource, KafkaResource, TrajlakeResource

defs = Definitions(
    assets=[sandbox_runs, *lakehouse_assets, *quality_assets, *lifecycle_assets],
    asset_checks=[*quality_checks],
    jobs=[*quality_jobs, *lifecycle_jobs],
    schedules=[*quality_schedules, *lifecycle_schedules],
    resources={
        "trajlake": TrajlakeResource(),
        "kafka": KafkaResource(),
        "iceberg": IcebergResource(),
        "fleet": FleetResource(),
    },
)
