"""Decoding a batch in the calling process: group by writer version, read blocks, bisect failures.

Anything the batch path cannot vouch for goes through ``schemas.registry.decode_event``,
so results match it record by record, dead-letter reasons included:

* header checks (size limit, magic, fingerprint) run per record before batching;
* a block that fails to decode is bisected until the failing records are alone, and
  those are decoded one by one (giving ``decode_event``'s exact error);
* envelope validations (kind matches ``event_type``, non-empty ids, ``seq`` ≥ 0)
  run vectorized on the decoded columns with ``decode_event``'s messages.

Where the blocks are read is up to :meth:`LocalDecoder._decode_block`: here, or in the
decoder process under a deadline (:class:`pipelines.decode.decoder.BatchDecoder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.decode.framing import concatenated_buffer, object_container, read_container_safely
from pipelines.decode.process import BlockTimeout
from pipelines.decode.resolution import Plan, conform, fill, plan_for, spread
from pipelines.decode.results import INGEST_ONLY, ROW_INDEX, DecodeResult
from schemas.errors import DecodeError, InvalidEvent, OversizedEvent
from schemas.registry import HEADER_LEN, MAGIC, decode_event, snake_case, versions, writer_version


class LocalDecoder:
    """Decodes batches of single-object Avro records into raw-events Arrow columns, in this process.

    Args:
        target: Arrow schema of ``raw_events`` (``RAW_EVENTS.arrow_schema()``).
        max_event_bytes: larger records are dead-lettered as oversized.
    """

    def __init__(self, target: pa.Schema, max_event_bytes: int | None = None) -> None:
        self.target = target
        self.max_event_bytes = max_event_bytes
        self._plans: dict[int, Plan] = {}
        self.record_columns = [f.name for f in target if f.name not in INGEST_ONLY]

    def _decode_block(self, plan: Plan, block: bytes | pa.Buffer, count: int) -> pa.Table | None:
        """Arrow table of the block, or None when it failed (a corrupt record).

        Raises:
            BlockTimeout: the block was read elsewhere and missed its deadline (see ``BatchDecoder``).
        """
        decoded = read_container_safely(object_container(plan.schema_json, block, count), count)
        return decoded if isinstance(decoded, pa.Table) else None

    def _to_columns(
        self, plan: Plan, decoded: pa.Table, order: pa.Array | None = None
    ) -> tuple[pa.Table, list[tuple[int, DecodeError]]]:
        """Raw-events columns of a decoded block, and envelope-validation failures (positions in the result).

        With ``order``, row ``i`` of the result is row ``order[i]`` of the block: the order is
        applied to the envelope columns and the payload's type codes and offsets, so each
        payload struct is gathered once, already in order (not gathered, then sorted).
        """
        n = decoded.num_rows
        columns: dict[str, pa.Array] = {}
        for name in self.record_columns:
            if name in plan.reader_fields:
                target = self.target.field(name).type
                if name in decoded.column_names:
                    column = decoded.column(name) if order is None else decoded.column(name).take(order)
                    columns[name] = conform(column, plan.reader_fields[name]["type"], target, plan.named)
                elif "default" in plan.reader_fields[name]:
                    columns[name] = fill(plan.reader_fields[name]["default"], n, target)
                else:
                    raise ValueError(f"reader field {name!r} has no default and writer v{plan.writer.version} lacks it")
        payload = decoded.column("payload").combine_chunks()
        type_codes = payload.type_codes
        offsets = payload.offsets
        if order is not None:
            type_codes, offsets = type_codes.take(order), offsets.take(order)
        branch_kinds = [
            snake_case(payload.type.field(i).name.rsplit(".", 1)[-1]) for i in range(payload.type.num_fields)
        ]
        codes = list(payload.type.type_codes)
        row_codes, row_offsets = type_codes.to_numpy(), offsets.to_numpy()
        for kind, reader_record in plan.reader_kinds.items():
            target = self.target.field(kind).type
            positions = np.empty(0, np.int64)
            if kind in branch_kinds:
                positions = np.flatnonzero(row_codes == codes[branch_kinds.index(kind)])
            if not len(positions):
                columns[kind] = pa.nulls(n, type=target)
                continue
            # Only this kind's rows are gathered and resolved; spread lays them out among the batch's rows.
            child = payload.field(branch_kinds.index(kind)).take(pa.array(row_offsets[positions]))
            columns[kind] = spread(conform(child, reader_record, target, plan.named), positions, n)
        version = pa.scalar(plan.writer.version, self.target.field("schema_version").type)
        columns["schema_version"] = pa.repeat(version, n)
        table = pa.table(columns)
        return table, self._validate(plan, table, type_codes, codes, branch_kinds)

    def _validate(
        self, plan: Plan, table: pa.Table, type_codes: pa.Array, codes: list[int], branch_kinds: list[str]
    ) -> list[tuple[int, DecodeError]]:
        kind_of_code = {code: kind for code, kind in zip(codes, branch_kinds, strict=True)}
        row_kind = pc.take(pa.array(branch_kinds), pc.index_in(type_codes, pa.array(codes, pa.int8())))
        event_type = table.column("event_type")
        bad_kind = pc.not_equal(row_kind, event_type)
        bad_ids = pc.or_(
            pc.equal(pc.utf8_length(table.column("event_id")), 0),
            pc.equal(pc.utf8_length(table.column("session_id")), 0),
        )
        bad_seq = pc.less(table.column("seq"), 0)
        any_bad = pc.or_(pc.or_(bad_kind, bad_ids), bad_seq)
        if not pc.any(any_bad).as_py():
            return []
        failures: list[tuple[int, DecodeError]] = []
        for position in pc.indices_nonzero(any_bad).to_pylist():
            kind = kind_of_code[type_codes[position].as_py()]
            if bad_kind[position].as_py():
                name = plan.reader_names.get(kind) or plan.writer.payload_kinds.get(kind, kind)
                error: DecodeError = InvalidEvent(
                    f"event_type {event_type[position].as_py()!r} does not match payload {name}"
                )
            elif bad_ids[position].as_py():
                error = InvalidEvent("empty event_id or session_id")
            else:
                error = InvalidEvent(f"negative seq {table.column('seq')[position].as_py()}")
            failures.append((position, error))
        return failures

    # -- per-record fallback -----------------------------------------------------------

    def _decode_one_by_one(
        self, values: Sequence[bytes], indices: list[int]
    ) -> tuple[list[pa.Table], list[tuple[int, DecodeError]]]:
        rows: list[dict[str, Any]] = []
        kept: list[int] = []
        dead: list[tuple[int, DecodeError]] = []
        for index in indices:
            try:
                # ts as sent: one beyond a datetime's years is clamped later, as the batch path does
                event = decode_event(values[index], max_bytes=self.max_event_bytes, raw_timestamps=True)
            except DecodeError as exc:
                dead.append((index, exc))
                continue
            row = {name: event[name] for name in self.record_columns if name in event}
            row[event["event_type"]] = event["payload"]
            rows.append(row)
            kept.append(index)
        if not rows:
            return [], dead
        schema = pa.schema([self.target.field(name) for name in self.record_columns])
        table = pa.Table.from_pylist(rows, schema=schema).append_column(ROW_INDEX, pa.array(kept, pa.int64()))
        return [table], dead

    def _decode_group(
        self,
        plan: Plan,
        values: Sequence[bytes],
        array: pa.Array,
        indices: list[int],
        result: DecodeResult,
        tables: list[pa.Table],
        sort_by: Sequence[tuple[str, str]],
        sorted_tables: set[int],
    ) -> None:
        """Decode records of one writer version, bisecting around blocks that fail.

        Each block's rows come out ordered by ``sort_by`` (ties by batch index) when the block
        has those columns; the ids of tables so ordered are added to ``sorted_tables``.
        """
        try:
            decoded = self._decode_block(plan, concatenated_buffer(array, indices), len(indices))
        except BlockTimeout:
            decoded_tables, dead = self._decode_one_by_one(values, indices)
            tables.extend(decoded_tables)
            result.dead.extend(dead)
            result.fallback_records += len(indices)
            return
        if decoded is None:
            if len(indices) <= 8:  # small enough: decode_event says exactly what is wrong
                decoded_tables, dead = self._decode_one_by_one(values, indices)
                tables.extend(decoded_tables)
                result.dead.extend(dead)
                result.fallback_records += len(indices)
                return
            middle = len(indices) // 2
            self._decode_group(plan, values, array, indices[:middle], result, tables, sort_by, sorted_tables)
            self._decode_group(plan, values, array, indices[middle:], result, tables, sort_by, sorted_tables)
            return
        row_index = pa.array(indices, pa.int64())
        order = None
        if sort_by and all(name in decoded.column_names for name, _ in sort_by):
            keys = pa.table({**{name: decoded.column(name) for name, _ in sort_by}, ROW_INDEX: row_index})
            order = pc.sort_indices(keys, sort_keys=[*sort_by, (ROW_INDEX, "ascending")])
            row_index = row_index.take(order)
        table, failures = self._to_columns(plan, decoded, order)
        table = table.append_column(ROW_INDEX, row_index)
        if failures:
            bad = {position for position, _ in failures}
            result.dead.extend((row_index[position].as_py(), error) for position, error in failures)
            keep = pa.array([i not in bad for i in range(table.num_rows)])
            table = table.filter(keep)
        if order is not None:
            sorted_tables.add(id(table))
        tables.append(table)

    def decode_here(
        self, array: pa.BinaryArray, values: Sequence[bytes], sort_by: Sequence[tuple[str, str]] = ()
    ) -> DecodeResult:
        """Decode a batch here: group by writer version, read each group's block (bisecting failures).

        Args:
            array: the record values.
            values: the same values as ``bytes`` (what the per-record fallback decodes).
            sort_by: order of the returned events; ties keep batch order.

        Returns:
            The good events (with ``ROW_INDEX``) and the dead records, as :meth:`BatchDecoder.decode`.
        """
        result = DecodeResult(events=pa.table({}))
        limit = self.max_event_bytes if self.max_event_bytes is not None else float("inf")
        known = {MAGIC + v.fingerprint: v.version for v in versions().values()}
        groups: dict[int, list[int]] = {}
        if len(array):
            # The common case vectorized: header known and size within the limit.
            headers = pc.binary_slice(array, 0, HEADER_LEN)
            header_set = list(known)
            which = pc.index_in(headers, value_set=pa.array(header_set, pa.binary())).fill_null(-1).to_numpy()
            which = np.where(pc.binary_length(array).to_numpy() > limit, -1, which)
            for slot in np.unique(which):
                members = np.flatnonzero(which == slot)
                if slot >= 0:
                    groups.setdefault(known[header_set[slot]], []).extend(members.tolist())
                    continue
                for index in members.tolist():  # anything odd takes the checked path
                    value = values[index]
                    try:
                        if len(value) > limit:
                            raise OversizedEvent(
                                f"{len(value)} bytes exceeds the {self.max_event_bytes}-byte event limit"
                            )
                        version_number = writer_version(value).version
                    except DecodeError as exc:
                        result.dead.append((index, exc))
                        continue
                    groups.setdefault(version_number, []).append(index)
        tables: list[pa.Table] = []
        sorted_tables: set[int] = set()
        for version_number, indices in groups.items():
            plan = self._plans.get(version_number)
            if plan is None:
                plan = self._plans[version_number] = plan_for(writer_version(values[indices[0]]))
            self._decode_group(plan, values, array, indices, result, tables, sort_by, sorted_tables)
        return self._finish(result, tables, sort_by, presorted=len(tables) == 1 and id(tables[0]) in sorted_tables)

    def _finish(
        self, result: DecodeResult, tables: list[pa.Table], sort_by: Sequence[tuple[str, str]], presorted: bool = False
    ) -> DecodeResult:
        """``result`` with its events: the decoded tables in one, ordered (``presorted``: one table, in order)."""
        schema = pa.schema(
            [self.target.field(name) for name in self.record_columns] + [pa.field(ROW_INDEX, pa.int64())]
        )
        if tables:
            events = pa.concat_tables([t.select(schema.names).cast(schema) for t in tables])
            if presorted:
                result.events = events
            elif sort_by:
                result.events = events.sort_by([*sort_by, (ROW_INDEX, "ascending")])
            else:
                result.events = events.sort_by(ROW_INDEX) if len(tables) > 1 else events
        else:
            result.events = schema.empty_table()
        result.dead.sort(key=lambda item: item[0])
        return result
