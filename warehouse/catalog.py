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
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.exceptions import ValidationError as IcebergValidationError
from pyiceberg.io import InputFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Properties
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
            return SqlCatalog(name, **properties)
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
