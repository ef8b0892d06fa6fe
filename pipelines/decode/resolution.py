"""Writer → reader schema resolution on Arrow arrays.

A block decoded with an older writer schema is resolved to the latest reader schema
column by column: record fields are matched by name, fields the writer lacks take the
reader's default, and everything else is cast (Avro promotions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.decode.framing import framed_schema
from schemas.registry import SchemaVersion, latest, snake_case


def _named_types(node: Any, named: dict[str, Any], namespace: str = "") -> None:
    if isinstance(node, list):
        for branch in node:
            _named_types(branch, named, namespace)
    elif isinstance(node, dict):
        if node.get("type") in ("record", "enum", "fixed"):
            space = node.get("namespace", namespace)
            full = node["name"] if "." in node["name"] else f"{space}.{node['name']}".strip(".")
            named[full] = node
            named[node["name"]] = node
            namespace = space
        for child in node.get("fields", []):
            _named_types(child["type"], named, namespace)
        for key in ("items", "values"):
            if key in node:
                _named_types(node[key], named, namespace)


def _resolve(node: Any, named: dict[str, Any]) -> Any:
    """Strip ``["null", T]`` and named references down to the type definition."""
    while True:
        if isinstance(node, list):
            branches = [b for b in node if b != "null"]
            node = branches[0] if len(branches) == 1 else node
            if len(branches) != 1:
                return node
        elif isinstance(node, str) and node in named:
            node = named[node]
        elif isinstance(node, dict) and isinstance(node.get("type"), (dict, list)):
            node = node["type"]
        else:
            return node


def fill(default: Any, length: int, target: pa.DataType) -> pa.Array:
    """``length`` copies of a reader default, as an Arrow array of ``target`` type.

    Built from one scalar, not from a list of ``length`` Python values: a field a writer version
    lacks is filled on every batch (a v1 record read as v4 lacks ten, one a struct of 31 leaves).
    """
    if default is None:
        return pa.nulls(length, type=target)
    if not length:  # pa.repeat of a nested scalar needs at least one row
        return pa.array([], type=target)
    return pa.repeat(pa.scalar(default, type=target), length)


def conform(array: pa.Array, reader: Any, target: pa.DataType, named: dict[str, Any]) -> pa.Array:
    """Resolve a writer-decoded Arrow array to the reader's Arrow type.

    Record fields are matched by name; fields the writer lacks take the reader's
    default; everything else is cast (Avro promotions int→long, float→double, enum→string).

    Raises:
        ValueError: a reader field without a default is missing from the writer.
        pyarrow.ArrowInvalid: a value that does not cast.
    """
    reader = _resolve(reader, named)
    if pa.types.is_struct(target) and isinstance(reader, dict) and reader.get("type") == "record":
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        fields_by_name = {f["name"]: f for f in reader["fields"]}
        children: list[pa.Array] = []
        for index in range(target.num_fields):
            target_field = target.field(index)
            spec = fields_by_name[target_field.name]
            if array.type.get_field_index(target_field.name) >= 0:
                child = array.field(target_field.name)
                children.append(conform(child, spec["type"], target_field.type, named))
            elif "default" in spec:
                children.append(fill(spec["default"], len(array), target_field.type))
            else:
                raise ValueError(f"reader field {target_field.name!r} has no default and the writer lacks it")
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    return array if array.type == target else pc.cast(array, target)


_OFFSETS: dict[pa.DataType, Any] = {
    pa.large_string(): np.int64,
    pa.large_binary(): np.int64,
    pa.string(): np.int32,
    pa.binary(): np.int32,
}


class _Spread:
    """Lays out arrays of ``len(positions)`` rows over ``n`` rows (see ``spread``); the kind's bitmap once."""

    def __init__(self, positions: np.ndarray, n: int) -> None:
        self.positions, self.n = positions, n
        valid = np.zeros(n, dtype=bool)
        valid[positions] = True
        self.valid = valid
        self.bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))

    def validity(self, array: pa.Array) -> tuple[pa.Buffer, int]:
        """Validity bitmap of ``n`` rows: ``array``'s validity at ``positions``, null elsewhere; its null count."""
        if not array.null_count:
            return self.bitmap, self.n - len(self.positions)
        valid = np.zeros(self.n, dtype=bool)
        valid[self.positions] = array.is_valid().to_numpy(zero_copy_only=False)
        return pa.py_buffer(np.packbits(valid, bitorder="little")), self.n - int(np.count_nonzero(valid))

    def offsets(self, array: pa.Array, dtype: Any) -> pa.Buffer:
        """Offsets of ``n`` rows: the rows at ``positions`` span what ``array``'s rows span, other rows are empty."""
        compact = np.frombuffer(array.buffers()[1], dtype=dtype, count=array.offset + len(array) + 1)[array.offset :]
        lengths = np.zeros(self.n + 1, dtype=dtype)
        lengths[0] = compact[0]
        lengths[self.positions + 1] = np.diff(compact)
        return pa.py_buffer(np.cumsum(lengths, dtype=dtype))

    def __call__(self, array: pa.Array) -> pa.Array:
        kind, n = array.type, self.n
        if pa.types.is_struct(kind):
            children = [self(array.field(i)) for i in range(kind.num_fields)]
            validity, nulls = self.validity(array)
            return pa.Array.from_buffers(kind, n, [validity], null_count=nulls, children=children)
        if kind in _OFFSETS:
            validity, nulls = self.validity(array)
            data = array.buffers()[2] or pa.py_buffer(b"")
            return pa.Array.from_buffers(
                kind, n, [validity, self.offsets(array, _OFFSETS[kind]), data], null_count=nulls
            )
        if pa.types.is_large_list(kind) or pa.types.is_list(kind):
            validity, nulls = self.validity(array)
            offsets = self.offsets(array, np.int64 if pa.types.is_large_list(kind) else np.int32)
            return pa.Array.from_buffers(kind, n, [validity, offsets], null_count=nulls, children=[array.values])
        if pa.types.is_primitive(kind) and not pa.types.is_boolean(kind):
            validity, nulls = self.validity(array)
            width = f"u{kind.bit_width // 8}"
            compact = np.frombuffer(array.buffers()[1], dtype=width, count=array.offset + len(array))[array.offset :]
            values = np.zeros(n, dtype=width)
            values[self.positions] = compact
            return pa.Array.from_buffers(kind, n, [validity, pa.py_buffer(values)], null_count=nulls)
        index = np.zeros(n, dtype=np.int64)
        index[self.positions] = np.arange(len(self.positions))
        return array.take(pa.array(index, mask=~self.valid))


def spread(array: pa.Array, positions: np.ndarray, n: int) -> pa.Array:
    """``n`` rows: row ``positions[i]`` is ``array[i]`` (``positions`` ascending), every other row null.

    The values of ``array.take(index)`` with ``index`` null off ``positions``, laid out from
    ``array``'s buffers: strings' and lists' data is not copied again, only offsets, fixed-width
    values and validity are laid out over the ``n`` rows (one bitmap shared by the leaves without
    nulls). A payload kind's column then costs a gather of its own rows and a pass per leaf,
    not a gather of every row of the batch per leaf.
    """
    return _Spread(positions, n)(array)


@dataclass(frozen=True)
class Plan:
    """How to turn one writer version's decoded batch into raw-events columns."""

    writer: SchemaVersion
    schema_json: str
    reader_fields: dict[str, Any]  # envelope field name -> reader Avro field
    reader_kinds: dict[str, Any]  # event_type -> reader Avro record of the payload
    reader_names: dict[str, str]  # event_type -> full reader record name (decode_event's message)
    named: dict[str, Any]


def plan_for(writer: SchemaVersion) -> Plan:
    """The plan resolving ``writer``'s records to the latest reader schema (framed: see ``framed_schema``)."""
    reader = latest()
    named: dict[str, Any] = {}
    _named_types(reader.raw, named)
    fields = {f["name"]: f for f in reader.raw["fields"] if f["name"] != "payload"}
    payload = next(f for f in reader.raw["fields"] if f["name"] == "payload")
    kinds = {snake_case(branch["name"]): branch for branch in payload["type"]}
    return Plan(writer, json.dumps(framed_schema(writer.raw)), fields, kinds, dict(reader.payload_kinds), named)
