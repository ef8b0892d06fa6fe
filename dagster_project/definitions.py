"""The trajlake code location: one merge of the per-domain definitions and the resources they take."""

from dagster import Definitions

from dagster_project.defs import fleet, lakehouse, lifecycle, operations, quality, streaming
from dagster_project.defs.fleet import FleetResource
from dagster_project.resources import LakehouseResource

defs = Definitions.merge(
    fleet.defs,
    lakehouse.defs,
    quality.defs,
    lifecycle.defs,
    streaming.defs,
    operations.defs,
    Definitions(resources={"lakehouse": LakehouseResource(), "fleet": FleetResource()}),
)
