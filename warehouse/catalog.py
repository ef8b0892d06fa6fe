"""The Iceberg catalog: SQLite ``SqlCatalog`` under ``TRAJLAKE_HOME`` by default.

``TRAJLAKE_CATALOG_URI`` points the SQL catalog at PostgreSQL (or any SQLAlchemy
URL), e.g. ``postgresql+psycopg://trajlake@db:5432/lake``; several processes may
commit at once (pyiceberg's SQL catalog swaps metadata pointers optimistically, a
loser gets ``CommitFailedException`` and retries). ``TRAJLAKE_CATALOG_PROPERTIES``
without a ``type`` adds FileIO properties to the SQL catalog (``s3.endpoint``,
``s3.region``; credentials from the AWS environment, which also gives the endpoint and region
when the properties do not: ``AWS_ENDPOINT_URL``, ``AWS_REGION``/``AWS_DEFAULT_REGION``); with a ``type`` (``rest``,
``glue``, …) it loads that pyiceberg catalog instead, e.g. a REST catalog::

    TRAJLAKE_CATALOG_PROPERTIES='{"type": "rest", "uri": "https://catalog:8181",
                                  "warehouse": "s3://lake/hot", "credential": "id:secret"}'
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.io import InputFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import StagedTable, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    TableRequirement,
    TableUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.typedef import Identifier, Properties
from pyiceberg.utils.datetime import datetime_to_millis
from sqlalchemy.exc import DatabaseError, IntegrityError

from common.errors import CorruptMetadata
from common.settings import Settings
from warehouse import parquet_writer
from warehouse.object_store import s3_properties

_read_table_metadata = FromInputFile.table_metadata


def _table_metadata_or_corrupt(input_file: InputFile, encoding: str = "utf-8") -> TableMetadata:
    """pyiceberg's reading of a table metadata file, a file it cannot parse raised as :class:`CorruptMetadata`.

    pyiceberg lets pydantic's ``ValidationError`` (or json's, or a codec's) out with the JSON it choked on and
    no path; a truncated ``*.metadata.json`` then reads as a traceback, with no word of which file it was.
    """
    try:
        return _read_table_metadata(input_file, encoding)
    except (ValueError, EOFError, IcebergValidationError) as exc:  # pydantic's and json's errors are ValueErrors
        kind = "truncated or not JSON" if "json" in str(exc).lower() else "not Iceberg table metadata"
        raise CorruptMetadata(f"corrupt table metadata file ({kind})", input_file.location) from None


def _install_metadata_check() -> None:
    """Make every catalog of this process read table metadata through :func:`_table_metadata_or_corrupt`."""
    checked: Any = staticmethod(_table_metadata_or_corrupt)
    FromInputFile.table_metadata = checked  # type: ignore[method-assign]


_install_metadata_check()  # at import: forked query processes read metadata without opening a catalog


def open_catalog(settings: Settings) -> Catalog:
    """The configured Iceberg catalog, with trajlake's namespace created.

    Tables written through it honour their Bloom filter properties (:mod:`warehouse.parquet_writer`).
    """
    parquet_writer.install()
    _install_metadata_check()
    props = s3_properties(settings.catalog_properties)
    if "type" in props:
        props.setdefault("warehouse", settings.hot_location)
        catalog = load_catalog(settings.catalog_name, **props)
    else:
        uri = settings.catalog_uri or f"sqlite:///{settings.catalog_file}"
        if uri.startswith("sqlite"):
            props.setdefault("init_catalog_tables", "true")
        catalog = _sql_catalog(settings.catalog_name, uri=uri, warehouse=settings.hot_location, **props)
    ensure_namespace(catalog, settings.namespace)
    return catalog


def apply_updates(
    base: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str | None = None
) -> TableMetadata:
    """``base`` with ``updates`` applied: pyiceberg's ``update_table_metadata`` (0.12) without its closing deep copy.

    pyiceberg ends every application of updates with a deep copy of the whole metadata — every
    schema, snapshot, summary and log entry — which it does at least twice per commit (the
    transaction's staged view, the catalog's staging). The cost grows with the table's history, which
    a follower adds to once a second (``trajlake bench commits``, docs/performance.md). The copy
    protects nothing: metadata models are frozen and every update is applied copy-on-write
    (new lists and dicts, ``model_copy(update=…)``), so the result may share unchanged parts with
    ``base``. The same checks run (partition spec and sort order against the schema).
    """
    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = _update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


class _LeanSqlCatalog(SqlCatalog):
    """pyiceberg's SQL catalog, staging a commit to an existing table without deep-copying its metadata."""

    def _update_and_stage_table(
        self,
        current_table: Table | None,
        table_identifier: Identifier,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> StagedTable:
        if current_table is None:  # a new table: pyiceberg validates the metadata it builds
            return super()._update_and_stage_table(current_table, table_identifier, requirements, updates)
        for requirement in requirements:
            requirement.validate(current_table.metadata)
        metadata = apply_updates(current_table.metadata, updates, current_table.metadata_location)
        version = self._parse_metadata_version(current_table.metadata_location) + 1
        location = load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(
            version
        )
        return StagedTable(
            identifier=table_identifier,
            metadata=metadata,
            metadata_location=location,
            io=self._load_file_io(properties=metadata.properties, location=location),
            catalog=self,
        )


#: Tries at opening a SQL catalog whose own tables another process is creating at the same moment.
_CATALOG_OPEN_ATTEMPTS = 5


def _sql_catalog(name: str, **properties: str) -> SqlCatalog:
    """pyiceberg's SQL catalog, tolerant of another process creating the catalog's tables at the same moment.

    On a new home every first command creates ``iceberg_tables`` and ``iceberg_namespace_properties``:
    pyiceberg probes for them, then creates them, so two commands started together can both probe before
    either creates, and the later ``CREATE TABLE`` fails ("already exists", or a unique key of the
    database's own catalog). Opening again then finds the tables made.
    """
    for attempt in range(_CATALOG_OPEN_ATTEMPTS):
        try:
            return _LeanSqlCatalog(name, **properties)
        except DatabaseError as exc:
            message = str(exc.orig).lower()
            if attempt + 1 == _CATALOG_OPEN_ATTEMPTS or not ("already exists" in message or "unique" in message):
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")  # the last attempt returns or raises


def ensure_namespace(catalog: Catalog, namespace: str, properties: Properties | None = None) -> None:
    """Create ``namespace`` with ``properties`` unless it exists, safe against another process doing the same.

    pyiceberg's ``create_namespace_if_not_exists`` looks, then inserts: in a SQL catalog two processes
    opening one new lakehouse at once can both look before either inserts, and the later insert hits the
    namespace's unique key (an ``IntegrityError``, not ``NamespaceAlreadyExistsError``). Either way the
    namespace is there afterwards, which is all an opener needs.
    """
    if catalog.namespace_exists(namespace):
        return
    try:
        catalog.create_namespace(namespace, properties or {})
    except (NamespaceAlreadyExistsError, IntegrityError):
        if not catalog.namespace_exists(namespace):  # the insert failed for some other reason
            raise
