"""The trajlake code location: one merge of the per-domain definitions and the resources they take.

Runs execute their steps in the run's own process (``in_process_executor``): an automation run
holds assembly, scoring and a handful of checks, and Dagster's default executor starts a fresh
Python process per step (tens of seconds each on a loaded two-core machine, measured by
``trajlake bench automation``), which alone missed the one-minute freshness target. A deployment
that wants steps in parallel sets another executor on its own jobs.
"""

from dagster import Definitions, in_process_executor

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
    Definitions(resources={"lakehouse": LakehouseResource(), "fleet": FleetResource()}, executor=in_process_executor),
)
