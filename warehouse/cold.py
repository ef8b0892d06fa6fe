"""The cold tier's tables: where they live, which tables have one, what tiering recorded on them.

Cold tables live in the same catalog under the namespace ``<namespace>_cold``, whose
``location`` is ``<cold_location>/<namespace>_cold`` (``file://`` or ``s3://``). Both the SQL
views (:mod:`warehouse.sql`) and tiering (:mod:`warehouse.tiering`, which moves rows here) use
this registry; it depends on neither.
"""

from __future__ import annotations

import json

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from common.settings import Settings
from warehouse.catalog import ensure_namespace
from warehouse.errors import WarehouseError
from warehouse.parquet_writer import BLOOM_ENABLED, ROW_GROUP_LIMIT
from warehouse.tables import RAW_EVENTS, STEPS, TABLES, TRAJECTORIES, ensure_table
from warehouse.transactions import transaction

#: Property of the cold ``raw_events`` table: JSON list of hot file paths already copied to cold.
TIERED_FILES = "trajlake.tiered-hot-files"
#: Tables that have a cold tier.
TIERED_TABLES = (RAW_EVENTS.name, TRAJECTORIES.name, STEPS.name)

#: Cold-table property: data files with a lower data sequence number were written before the
#: table's Bloom filters were turned on (``trajlake maintain`` rewrites them).
FILTERS_SINCE = "trajlake.bloom-filters-since-sequence"


def cold_namespace(settings: Settings) -> str:
    """Namespace of the cold tables."""
    return f"{settings.namespace}_cold"


def cold_settings(settings: Settings) -> Settings:
    """Settings whose namespace is the cold one (for :func:`warehouse.tables.ensure_table`)."""
    return settings.model_copy(update={"namespace": cold_namespace(settings)})


def ensure_cold_table(catalog: Catalog, settings: Settings, name: str) -> Table:
    """Load (creating if needed) the cold table of ``name`` under the cold location."""
    namespace = cold_namespace(settings)
    location = f"{settings.cold_location.rstrip('/')}/{namespace}"
    # The namespace location decides where new tables go, in SQL and REST catalogs alike.
    ensure_namespace(catalog, namespace, {"location": location})
    table = ensure_table(catalog, cold_settings(settings), name)
    for _ in range(_PROPERTY_ATTEMPTS):
        wanted = _wanted_properties(table, settings, name)
        if all(table.properties.get(k) == v for k, v in wanted.items()):
            return table
        try:
            with transaction(table) as tx:
                tx.set_properties(wanted)
        except CommitFailedException:  # another process (opening the lakehouse too) changed it first: look again
            pass
        table = catalog.load_table(table.name())
    raise WarehouseError(f"could not set the cold properties of {'.'.join(table.name())}: other processes kept racing")


#: Tries at setting a cold table's properties while other processes commit to it.
_PROPERTY_ATTEMPTS = 8


def _wanted_properties(table: Table, settings: Settings, name: str) -> dict[str, str]:
    """The properties the cold table of ``name`` should have (file size, row groups, the session Bloom filter)."""
    wanted = {
        "write.target-file-size-bytes": str(settings.cold_target_file_bytes),
        ROW_GROUP_LIMIT: str(settings.cold_row_group_rows),
    }
    keys = TABLES[name].sort_by
    if keys and keys[0] == "session_id":
        # A session lookup prunes the row groups of every other day by the filter (parquet_writer).
        bloom = f"{BLOOM_ENABLED}.session_id"
        wanted[bloom] = "true"
        snapshot = table.current_snapshot()
        if table.properties.get(bloom) != "true" and snapshot is not None:
            # The files already there were written without it: maintenance rewrites them.
            wanted[FILTERS_SINCE] = str((snapshot.sequence_number or 0) + 1)
    return wanted


def tiered_files(cold_raw: Table) -> set[str]:
    """Hot ``raw_events`` files whose rows are in the cold table (copied, maybe not yet deleted)."""
    text = cold_raw.properties.get(TIERED_FILES)
    return set(json.loads(text)) if text else set()
