"""Schema compatibility checks by Avro's resolution rules.

``can_read(reader, writer)`` decides whether data written with ``writer`` can
be read with ``reader`` (Avro specification, "Schema Resolution"): matching
primitives and the allowed promotions, record fields matched by name (a reader
field missing from the writer needs a default), enum symbols, array/map items,
and every writer union branch readable by some reader branch. The modes follow
the usual registry names:

* ``BACKWARD`` — the new schema reads data of the old one (upgrade readers first);
* ``FORWARD`` — the old schema reads data of the new one (upgrade writers first);
* ``FULL`` — both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from schemas.errors import IncompatibleSchema, SchemaError

_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class Compatibility(StrEnum):
    """Which direction(s) of reading must work between an old and a new schema."""

    BACKWARD = "backward"
    FORWARD = "forward"
    FULL = "full"


@dataclass(frozen=True)
class Problem:
    """One reason a reader cannot read a writer's data."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.message}"


def _name(schema: Any) -> str | None:
    return schema.get("name") if isinstance(schema, dict) else None


def _type(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema if schema in _PRIMITIVES else "named"
    kind = schema["type"]
    return (
        kind
        if isinstance(kind, str) and kind in _PRIMITIVES | {"record", "enum", "array", "map", "fixed"}
        else _type(kind)
    )


class _Checker:
    def __init__(self) -> None:
        self.reader_named: dict[str, Any] = {}
        self.writer_named: dict[str, Any] = {}
        self.seen: set[tuple[str, str]] = set()

    def _resolve(self, schema: Any, named: dict[str, Any]) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            short = schema.rsplit(".", 1)[-1]
            return named.get(schema) or named[short]
        if isinstance(schema, dict) and isinstance(schema["type"], dict | list):
            return schema["type"]
        if isinstance(schema, dict) and schema["type"] in _PRIMITIVES:
            return schema["type"]
        if isinstance(schema, dict) and _name(schema):
            named[schema["name"]] = schema
        return schema

    def check(self, reader: Any, writer: Any, path: str) -> list[Problem]:
        """Problems of ``reader`` reading what ``writer`` wrote at ``path``: unions, then types, then their parts."""
        reader = self._resolve(reader, self.reader_named)
        writer = self._resolve(writer, self.writer_named)
        r_type, w_type = _type(reader), _type(writer)
        if w_type == "union":  # every branch the writer may have written must be readable
            problems: list[Problem] = []
            for branch in writer:
                problems += self.check(reader, branch, f"{path}|{_name(branch) or branch}")
            return problems
        if r_type == "union":  # some branch of the reader must read it
            if any(not self.check(branch, writer, path) for branch in reader):
                return []
            return [Problem(path, f"no branch of the reader union reads the writer's {_name(writer) or w_type}")]
        if r_type != w_type:
            if r_type in _PROMOTIONS.get(w_type, set()):
                return []
            return [Problem(path, f"reader type {r_type} cannot read writer type {w_type}")]
        if r_type in _PRIMITIVES:
            return []
        if (
            r_type in ("record", "enum", "fixed")
            and reader["name"].rsplit(".", 1)[-1] != writer["name"].rsplit(".", 1)[-1]
        ):
            return [Problem(path, f"reader {r_type} {reader['name']} does not match writer {writer['name']}")]
        parts = {
            "record": self._record,
            "enum": self._enum,
            "fixed": self._fixed,
            "array": self._array,
            "map": self._map,
        }.get(r_type)
        if parts is None:
            return [Problem(path, f"unsupported schema type {r_type}")]
        return parts(reader, writer, path)

    def _record(self, reader: Any, writer: Any, path: str) -> list[Problem]:
        """Each reader field from the writer's field of its name (or an alias), or from its default."""
        key = (reader["name"], json.dumps(writer, sort_keys=True, default=str)[:200])
        if key in self.seen:  # recursive types
            return []
        self.seen.add(key)
        writer_fields = {f["name"]: f for f in writer["fields"]}
        problems: list[Problem] = []
        for field in reader["fields"]:
            source = writer_fields.get(field["name"])
            if source is None:
                for alias in field.get("aliases", []):
                    source = writer_fields.get(alias)
            if source is None:
                if "default" not in field:
                    problems.append(
                        Problem(f"{path}.{field['name']}", "reader field has no default and the writer lacks it")
                    )
                continue
            problems += self.check(field["type"], source["type"], f"{path}.{field['name']}")
        return problems

    def _enum(self, reader: Any, writer: Any, path: str) -> list[Problem]:
        missing = set(writer["symbols"]) - set(reader["symbols"])
        if missing and "default" not in reader:
            return [Problem(path, f"writer enum symbols {sorted(missing)} unknown to the reader")]
        return []

    def _fixed(self, reader: Any, writer: Any, path: str) -> list[Problem]:
        return [] if reader["size"] == writer["size"] else [Problem(path, "fixed sizes differ")]

    def _array(self, reader: Any, writer: Any, path: str) -> list[Problem]:
        return self.check(reader["items"], writer["items"], f"{path}[]")

    def _map(self, reader: Any, writer: Any, path: str) -> list[Problem]:
        return self.check(reader["values"], writer["values"], f"{path}{{}}")


def can_read(reader: Any, writer: Any) -> list[Problem]:
    """Problems that keep ``reader`` from reading data written with ``writer``; empty when it can."""
    return _Checker().check(reader, writer, "")


def check_compatibility(old: Any, new: Any, mode: Compatibility = Compatibility.BACKWARD) -> list[str]:
    """Every problem of changing ``old`` into ``new`` under ``mode``, as readable lines."""
    problems: list[str] = []
    if mode in (Compatibility.BACKWARD, Compatibility.FULL):
        problems += [f"new schema cannot read old data at {p}" for p in can_read(new, old)]
    if mode in (Compatibility.FORWARD, Compatibility.FULL):
        problems += [f"old schema cannot read new data at {p}" for p in can_read(old, new)]
    return problems


def load_schema(path: str | Path) -> Any:
    """An ``.avsc`` file as parsed JSON.

    Raises:
        SchemaError: the file is missing or not JSON.
    """
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SchemaError(f"cannot read Avro schema {path}: {exc}") from exc


def check_shipped(mode: Compatibility = Compatibility.BACKWARD) -> dict[tuple[int, int], list[str]]:
    """Problems of every pair (older, newer) of the shipped event schema versions."""
    from schemas.registry import versions

    shipped = versions()
    numbers = sorted(shipped)
    return {
        (old, new): check_compatibility(shipped[old].raw, shipped[new].raw, mode)
        for i, old in enumerate(numbers)
        for new in numbers[i + 1 :]
    }


def assert_compatible(old: Any, new: Any, mode: Compatibility, label: str) -> None:
    """Raise ``IncompatibleSchema`` listing the problems of ``label`` when there are any."""
    problems = check_compatibility(old, new, mode)
    if problems:
        raise IncompatibleSchema(f"{label} is not {mode.value.upper()} compatible: " + "; ".join(problems))
