"""The lakehouse: one object, opened once from the settings, that owns where trajlake's data lives.

:meth:`Lakehouse.open` opens the Iceberg catalog (:mod:`warehouse.catalog`) with trajlake's namespace,
then creates or evolves every table (:data:`warehouse.tables.TABLES`) and the cold tier's tables
(:mod:`warehouse.cold`) in one pass: after it, a stage loads a table by name and never asks whether
it exists. It holds the hot and cold stores (their locations and namespaces), the lakehouse's own
local directories (which no export or report is written into), the object-store footer cache and the
price table the views use, and it opens the DuckDB views (:mod:`warehouse.sql`) over all of it.

Stages take a ``Lakehouse`` plus their own small typed options, as pyiceberg hands out a ``Table`` and
dlt a ``Pipeline``: the command line, Dagster resources, benchmarks and tests open one from
:class:`~common.settings.Settings` and pass it on. ``settings`` stays reachable for the stages' own
``*Options.from_settings`` (each stage reads its configuration in one place) and for the warehouse's
lower functions that still take it.

Tables are loaded fresh on every :meth:`Lakehouse.table` call (one catalog read, as the catalog does):
a long-lived lakehouse (a Dagster resource) sees other processes' commits. Opening is cheap once the
tables are made: the namespace records a digest of the table definitions (:data:`LAYOUT`) after every
table was created or evolved to them, and an opening that finds the same digest loads no table.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from common.prices import PriceTable
from common.settings import Settings
from warehouse.catalog import open_catalog
from warehouse.cold import TIERED_TABLES, cold_namespace, ensure_cold_table
from warehouse.errors import UnknownTable
from warehouse.files import object_stores
from warehouse.locks import job_lock
from warehouse.object_store import ObjectStores
from warehouse.sql import open_views
from warehouse.tables import TABLES, ensure_table

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Locations:
    """Where a lakehouse keeps its data: the home directory and the hot and cold stores (known without opening it).

    Attributes:
        home: ``TRAJLAKE_HOME`` (catalog database, scratch space, scheduled exports and reports).
        hot: the hot store's location (``file://`` or an object store).
        cold: the cold store's location.
    """

    home: Path
    hot: str
    cold: str

    @classmethod
    def of(cls, settings: Settings) -> Locations:
        """The locations the settings give."""
        return cls(settings.home_dir, settings.hot_location, settings.cold_location)

    def local_directories(self) -> list[Path]:
        """The lakehouse's own local directories (home, and the hot and cold stores when on ``file://``)."""
        places = [self.home]
        for location in (self.hot, self.cold):
            if location.startswith("file://"):
                places.append(Path(location.removeprefix("file://")))
        return [place.resolve() for place in places]


#: Namespace property: digest of the table definitions every table of the namespace was made to.
LAYOUT = "trajlake.table-layout"


def _layout(settings: Settings) -> str:
    """Digest of what opening makes: each table's columns, and the cold tables' location and file properties."""
    tables = {name: str(spec.arrow_schema()) for name, spec in sorted(TABLES.items())}
    cold = [settings.cold_location, settings.cold_target_file_bytes, settings.cold_row_group_rows, TIERED_TABLES]
    return hashlib.sha256(json.dumps([tables, cold], sort_keys=True, default=str).encode()).hexdigest()[:32]


class Lakehouse:
    """The catalog, every table, the hot and cold stores and the SQL views of one trajlake warehouse.

    Open it with :meth:`open`; the constructor is not for callers.
    """

    def __init__(self, settings: Settings, catalog: Catalog) -> None:
        self.settings = settings
        self.catalog = catalog
        self.namespace = settings.namespace
        self.cold_namespace = cold_namespace(settings)
        self.locations = Locations.of(settings)
        self.home = self.locations.home

    @classmethod
    def open(cls, settings: Settings, catalog: Catalog | None = None) -> Lakehouse:
        """Open the configured catalog (or use ``catalog``) and create or evolve every table.

        Raises:
            WarehouseError: a table's new columns could not be added (another process kept racing).
        """
        lake = cls(settings, catalog or open_catalog(settings))
        layout = _layout(settings)
        if lake._recorded_layout() != layout:
            for name in TABLES:
                ensure_table(lake.catalog, settings, name)
            for name in TIERED_TABLES:
                ensure_cold_table(lake.catalog, settings, name)
            lake._record_layout(layout)
        return lake

    def _record_layout(self, layout: str) -> None:
        """Record ``layout`` on the namespace: a cache of "every table is current", never needed for correctness.

        Two processes opening a new lakehouse at once both write it; the catalog may refuse the second
        insert (SQL: a unique key). What counts is that some opening recorded it; otherwise the next
        opening checks every table again.
        """
        try:
            self.catalog.update_namespace_properties(self.namespace, updates={LAYOUT: layout})
        except NotImplementedError:  # a catalog without namespace properties: every opening checks
            return
        except Exception as exc:  # any refusal of this cache write leaves the tables as they were made
            if self._recorded_layout() != layout:
                log.info(
                    "the table layout was not recorded on %s (%s): the next opening checks again", self.namespace, exc
                )

    def _recorded_layout(self) -> str | None:
        try:
            return self.catalog.load_namespace_properties(self.namespace).get(LAYOUT)
        except (NoSuchNamespaceError, NotImplementedError):
            return None

    def __repr__(self) -> str:
        return f"Lakehouse(namespace={self.namespace!r}, hot={self.locations.hot!r}, cold={self.locations.cold!r})"

    def table(self, name: str) -> Table:
        """The hot table ``name`` at its current snapshot.

        Raises:
            UnknownTable: ``name`` is not a trajlake table.
        """
        if name not in TABLES:
            raise UnknownTable(f"unknown table {name!r}; trajlake defines {sorted(TABLES)}")
        try:
            return self.catalog.load_table((self.namespace, name))
        except NoSuchTableError:  # dropped since the lakehouse was opened (a reset): made again, as at open
            return ensure_table(self.catalog, self.settings, name)

    def cold_table(self, name: str) -> Table:
        """The cold tier's table ``name`` (one of :data:`warehouse.cold.TIERED_TABLES`) at its current snapshot.

        Raises:
            UnknownTable: ``name`` has no cold tier.
        """
        if name not in TIERED_TABLES:
            raise UnknownTable(f"table {name!r} has no cold tier; these do: {', '.join(TIERED_TABLES)}")
        try:
            return self.catalog.load_table((self.cold_namespace, name))
        except NoSuchTableError:
            return ensure_cold_table(self.catalog, self.settings, name)

    @property
    def prices(self) -> PriceTable:
        """The price table the ``trajectories`` view and exports price unpriced model calls with."""
        return self.settings.prices

    def scratch(self, name: str) -> Path:
        """A private working directory under the home (``tmp/<name>``, created), e.g. where a sort spills."""
        path = self.home / "tmp" / name
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    @contextmanager
    def lock(self, job: str, wait_s: float = 600.0) -> Iterator[None]:
        """Hold the lakehouse-wide lock ``job`` (every process and machine sharing the catalog, :mod:`warehouse.locks`).

        Raises:
            LockBusy: another run held it for ``wait_s`` seconds.
        """
        with job_lock(self.settings, self.catalog, job, wait_s):
            yield

    def object_stores(self) -> ObjectStores:
        """A connection's object stores with the configured footer cache."""
        return object_stores(self.settings)

    def views(self, locked: bool = False, save_plan: bool = False) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with a view per table under its stable name (:func:`warehouse.sql.open_views`).

        Args:
            locked: lock the connection for untrusted SQL.
            save_plan: save the views as the lakehouse's view plan (the next ``trajlake sql`` opens them
                without the catalog while no table has moved on).

        Returns:
            The connection; the caller closes it.
        """
        return open_views(self.settings, self.catalog, locked=locked, save_plan=save_plan, tables=self)
