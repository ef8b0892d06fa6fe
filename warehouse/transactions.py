"""Iceberg transactions that do less per commit than pyiceberg's, with the same result.

Two costs of pyiceberg's ``Transaction`` grow with what ingest commits many times a minute:

* ``table_metadata`` re-applies every staged update to the table's metadata and
  deep-copies the result each time it is read, and one append reads it about twenty
  times (schema checks, partition spec, the snapshot producer, the manifest writer).
  The copy covers every schema, snapshot and log entry of the table, so with the wide
  ``raw_events`` schema an append spent ~0.3 s copying — about half of an ingest
  commit — and the cost grew with the table's history. Pydantic metadata models are
  frozen, so the staged metadata can be shared between readers until the next update,
  and it is built without pyiceberg's closing deep copy at all
  (:func:`warehouse.catalog.apply_updates`, which the catalog's staging uses too).
* ``append`` converts the Arrow schema to an Iceberg schema twice (the compatibility
  check and the write task), and splits the rows by partition by filtering the whole
  table once per partition value and copying the result, even when every row falls in
  one partition (a day, for ingest's batches). Here both conversions are cached per
  (table, schema id, Arrow schema), and a table whose rows share one partition value is
  written as it is; rows spanning several values are split as pyiceberg does.

Every commit is conditioned on the snapshot it was planned from (``AssertRefSnapshotId``):
a writer that lost a race gets ``CommitFailedException`` and plans again from the new state
(:func:`retry_on_conflict`), instead of pyiceberg re-appending the same rows on top.
"""

from __future__ import annotations

import functools
import logging
import operator
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import Any, Self

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import BooleanExpression
from pyiceberg.expressions.visitors import bind, expression_evaluator, inclusive_projection
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    _expression_to_complementary_pyarrow,
    _get_field_from_arrow_table,
    bin_pack_arrow_table,
    pyarrow_to_schema,
    write_file,
)
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.schema import Schema
from pyiceberg.table import (
    DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE,
    Table,
    TableMetadata,
    TableProperties,
    WriteTask,
)
from pyiceberg.table import Transaction as _Transaction
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.utils.config import Config
from pyiceberg.utils.properties import property_as_int

from common.faults import crash_point
from warehouse.catalog import apply_updates
from warehouse.errors import CommitConflict
from warehouse.snapshots import live_files, read_data_files

log = logging.getLogger("trajlake.transactions")

#: (table uuid, schema id, Arrow schema) → the Iceberg schema of the Arrow data, checked compatible.
_TASK_SCHEMAS: dict[tuple[Any, int, pa.Schema], Schema] = {}
_TASK_SCHEMAS_LIMIT = 256


def _task_schema(metadata: TableMetadata, arrow_schema: pa.Schema) -> Schema:
    """The Iceberg schema of Arrow data for ``metadata``'s current schema (checked compatible once).

    Raises:
        ValueError: the Arrow schema does not fit the table's (as pyiceberg's ``append`` raises).
    """
    key = (metadata.table_uuid, metadata.current_schema_id, arrow_schema)
    cached = _TASK_SCHEMAS.get(key)
    if cached is not None:
        return cached
    downcast = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
    table_schema = metadata.schema()
    _check_pyarrow_schema_compatible(
        table_schema,
        provided_schema=arrow_schema,
        downcast_ns_timestamp_to_us=downcast,
        format_version=metadata.format_version,
    )
    schema = pyarrow_to_schema(
        arrow_schema,
        name_mapping=table_schema.name_mapping,
        downcast_ns_timestamp_to_us=downcast,
        format_version=metadata.format_version,
    )
    if len(_TASK_SCHEMAS) >= _TASK_SCHEMAS_LIMIT:
        _TASK_SCHEMAS.clear()
    _TASK_SCHEMAS[key] = schema
    return schema


def _partitions(metadata: TableMetadata, rows: pa.Table) -> Iterator[tuple[PartitionKey | None, pa.Table]]:
    """``rows`` split by partition value: as they are when they share one value (no copy)."""
    spec, schema = metadata.spec(), metadata.schema()
    if spec.is_unpartitioned():
        yield None, rows
        return
    transformed: list[pa.Array] = []
    for field in spec.fields:
        name = schema.find_column_name(field.source_id)
        if name is None:
            raise ValueError(f"Could not find column name for field ID: {field.source_id}")
        source = schema.find_field(field.source_id).field_type
        transformed.append(field.transform.pyarrow_transform(source)(_get_field_from_arrow_table(rows, name)))
    keys = pa.table({str(i): values for i, values in enumerate(transformed)})
    unique = keys.group_by(keys.column_names).aggregate([]).to_pylist()

    def key_of(values: dict[str, Any]) -> PartitionKey:
        field_values = [PartitionFieldValue(field, values[str(i)]) for i, field in enumerate(spec.fields)]
        return PartitionKey(field_values=field_values, partition_spec=spec, schema=schema)

    if len(unique) == 1:
        yield key_of(unique[0]), rows
        return
    for values in unique:
        conditions = [
            pc.is_null(keys.column(str(i))) if values[str(i)] is None else pc.equal(keys.column(str(i)), values[str(i)])
            for i in range(len(spec.fields))
        ]
        yield key_of(values), rows.filter(functools.reduce(operator.and_, conditions)).combine_chunks()


def data_files(metadata: TableMetadata, rows: pa.Table, io: FileIO, write_uuid: uuid.UUID) -> list[DataFile]:
    """Write ``rows`` as Parquet data files of the table (split by partition and target size)."""
    task_schema = _task_schema(metadata, rows.schema)
    configured = property_as_int(metadata.properties, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES)
    target = TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT if configured is None else configured
    tasks: list[WriteTask] = []
    for key, part in _partitions(metadata, rows):
        for batches in bin_pack_arrow_table(part, target):
            task = WriteTask(
                write_uuid=write_uuid, task_id=len(tasks), record_batches=batches, schema=task_schema, partition_key=key
            )
            tasks.append(task)
    return list(write_file(io=io, table_metadata=metadata, tasks=iter(tasks)))


class Transaction(_Transaction):
    """A pyiceberg transaction with cached staged metadata and a leaner ``append`` (see module doc).

    Its commits are conditioned on the snapshot they were planned from: when another writer
    committed in between, the commit fails with ``CommitFailedException`` instead of being
    re-applied to the new state (see :meth:`_rebuild_snapshot_updates`). Plan again from the
    table's new state (:func:`retry_on_conflict`), or pass ``replay_on_conflict=True`` for a
    commit whose outcome does not depend on what the table held (appending new unique rows).
    """

    _staged: tuple[object, object, TableMetadata] | None = None

    def __init__(self, table: Table, autocommit: bool = False, replay_on_conflict: bool = False) -> None:
        super().__init__(table, autocommit=autocommit)
        self._replay_on_conflict = replay_on_conflict

    def _rebuild_snapshot_updates(self) -> None:
        # pyiceberg >= 0.12 answers a lost race by re-running the snapshot producers on the new
        # state: a fast append is re-appended as it is, so two runs that each planned "replace
        # these sessions" from the same old snapshot both land (600 rows for 300 sessions). A
        # plan made against a state that no longer exists is refused; the caller re-plans.
        if not self._replay_on_conflict:
            raise CommitFailedException(
                f"{'.'.join(self._table.name())} changed since this commit was planned; re-plan from its new state"
            )
        super()._rebuild_snapshot_updates()

    @property
    def table_metadata(self) -> TableMetadata:
        # Keyed on identity: staging replaces the ``_updates`` tuple, a commit replaces the
        # table's metadata object; either one invalidates the cached copy.
        base, updates = self._table.metadata, self._updates
        staged = self._staged
        if staged is None or staged[0] is not base or staged[1] is not updates:
            staged = (base, updates, apply_updates(base, updates))
            self._staged = staged
        return staged[2]

    def __enter__(self) -> Self:
        """Start the transaction (pyiceberg's ``__enter__`` is typed as returning its own class)."""
        return self

    def commit_transaction(self) -> Table:
        """Commit (see pyiceberg); crash point ``before_iceberg_commit``: data files written, nothing committed."""
        if self._updates:
            crash_point("before_iceberg_commit")
        return super().commit_transaction()

    def append(
        self,
        df: pa.Table | pa.RecordBatchReader,
        snapshot_properties: dict[str, str] = EMPTY_DICT,
        branch: str | None = MAIN_BRANCH,
    ) -> None:
        """Append an Arrow table in one snapshot, like pyiceberg's ``append`` (same files and summary)."""
        if not isinstance(df, pa.Table) or branch != MAIN_BRANCH:  # streaming readers, branches: pyiceberg's path
            super().append(df, snapshot_properties=snapshot_properties, branch=branch)
            return
        metadata = self.table_metadata
        _task_schema(metadata, df.schema)  # checked before anything is staged, as pyiceberg does
        files = data_files(metadata, df, self._table.io, uuid.uuid4()) if df.num_rows else []
        self.append_files(files, snapshot_properties)

    def append_files(self, files: list[DataFile], snapshot_properties: dict[str, str] = EMPTY_DICT) -> None:
        """Append data files already written for this table (``data_files``) in one snapshot."""
        with self._append_snapshot_producer(snapshot_properties) as append_files:
            for data_file in files:
                append_files.append_data_file(data_file)

    def replace_rows(
        self,
        predicate: BooleanExpression,
        column: str,
        values: Collection[object],
        rows: pa.Table | None = None,
        snapshot_properties: dict[str, str] = EMPTY_DICT,
    ) -> None:
        """Delete the rows matching ``predicate`` and append ``rows``, in one snapshot (copy-on-write).

        ``predicate`` must imply ``column IN values``: of the files whose partition can match, only
        those whose ``column`` holds one of ``values`` are read whole and rewritten (one column is
        read of the others). pyiceberg's delete reads every file the predicate's metrics cannot
        exclude — with random session ids, every file of the partitions — and evaluates the
        predicate against each file's metrics and every row twice: the cost of a replace of a few
        sessions grew with the files of their days.
        """
        metadata = self.table_metadata
        schema = metadata.schema()
        io = self._table.io
        bound = bind(schema, predicate, case_sensitive=True)
        keep = _expression_to_complementary_pyarrow(bound, schema)
        wanted = pa.array(list(values))
        evaluators: dict[int, Callable[[Any], bool]] = {}
        removed: list[DataFile] = []
        added: list[DataFile] = []
        for entry in live_files(self._table) if self._table.current_snapshot() is not None else []:
            data_file = entry.data_file
            if data_file.spec_id not in evaluators:
                spec = metadata.specs()[data_file.spec_id]
                projected = inclusive_projection(schema, spec, True)(predicate)
                partition_schema = Schema(*spec.partition_type(schema).fields)
                evaluators[data_file.spec_id] = expression_evaluator(partition_schema, projected, True)
            if not evaluators[data_file.spec_id](data_file.partition):
                continue
            if not _holds_any(io, data_file, column, wanted):
                continue
            whole = read_data_files(self._table, [data_file])
            kept = whole.filter(keep)
            if kept.num_rows == whole.num_rows:
                continue
            removed.append(data_file)
            if kept.num_rows:
                added.extend(data_files(metadata, kept, io, uuid.uuid4()))  # file names: uuid + task number
        appended: list[DataFile] = []
        if rows is not None and rows.num_rows:
            _task_schema(metadata, rows.schema)
            appended = data_files(metadata, rows, io, uuid.uuid4())
        if not removed:
            if appended:
                self.append_files(appended, snapshot_properties)
            return
        with self.update_snapshot(snapshot_properties=snapshot_properties).overwrite() as overwrite:
            for data_file in removed:
                overwrite.delete_data_file(data_file)
            for data_file in added + appended:
                overwrite.append_data_file(data_file)


def _holds_any(io: FileIO, data_file: DataFile, column: str, wanted: pa.Array) -> bool:
    """Whether the file's ``column`` holds one of ``wanted`` (True when it cannot tell: no such column)."""
    with io.new_input(data_file.file_path).open() as stream:
        parquet = pq.ParquetFile(stream)
        if column not in parquet.schema_arrow.names:
            return True
        return bool(pc.any(pc.is_in(parquet.read(columns=[column]).column(column), value_set=wanted)).as_py())


def transaction(table: Table, replay_on_conflict: bool = False) -> Transaction:
    """Start a transaction on ``table`` (use as a context manager; it commits on exit).

    Args:
        table: the table, as loaded when the commit was planned.
        replay_on_conflict: let pyiceberg re-apply the commit on top of a concurrent one; only for
            commits whose result does not depend on the table's state (see :class:`Transaction`).
    """
    return Transaction(table, replay_on_conflict=replay_on_conflict)


#: Attempts of a commit that keeps losing optimistic-concurrency races before giving up.
COMMIT_ATTEMPTS = 5


def retry_on_conflict(what: str, attempt_fn: Callable[[], object]) -> None:
    """Run a commit, re-planning on optimistic-concurrency conflicts with concurrent writers.

    Args:
        what: what is committed, for the log and the error.
        attempt_fn: plans and commits from the table's current state; called again after a conflict.

    Raises:
        CommitConflict: every attempt lost a race.
    """
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            attempt_fn()
            return
        except CommitFailedException as exc:
            log.info("%s: commit conflict (%s), retrying", what, exc)
            time.sleep(0.1 * (attempt + 1))
    raise CommitConflict(f"{what}: gave up after {COMMIT_ATTEMPTS} conflicting commits")
