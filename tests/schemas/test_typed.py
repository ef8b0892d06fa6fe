"""The TypedDicts of ``schemas.typed`` match the newest Avro event schema field for field."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, NotRequired, get_args, get_origin, get_type_hints

import pytest

from schemas import typed
from schemas.registry import latest, snake_case

_PRIMITIVES = {"string": str, "long": int, "int": int, "double": float, "float": float, "boolean": bool}


def _expected(avro: Any) -> Any:
    """The Python annotation an Avro type maps to (records by name, unions with null as ``X | None``)."""
    if isinstance(avro, list):
        members = [_expected(branch) for branch in avro]
        return ("union", frozenset(members))
    if isinstance(avro, dict):
        kind = avro["type"]
        if kind == "record":
            return ("record", avro["name"])
        if kind == "array":
            return ("list", _expected(avro["items"]))
        if kind == "map":
            return ("map", _expected(avro["values"]))
        if kind == "enum":
            return ("enum", frozenset(avro["symbols"]))
        return _expected(kind)
    if avro == "null":
        return ("null",)
    return _PRIMITIVES[avro]


def _actual(hint: Any) -> Any:
    """The same shape read from a type hint."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return ("union", frozenset(_actual(arg) for arg in get_args(hint)))
    if hint is type(None):
        return ("null",)
    if origin is list:
        return ("list", _actual(get_args(hint)[0]))
    if origin is dict:
        return ("map", _actual(get_args(hint)[1]))
    if origin is Literal:
        return ("enum", frozenset(get_args(hint)))
    if isinstance(hint, type) and typing.is_typeddict(hint):
        return ("record", hint.__name__)
    return hint


def _compare(record: dict[str, Any], cls: type, where: str) -> list[str]:
    problems = []
    hints = get_type_hints(cls, include_extras=True)
    fields = {f["name"]: f for f in record["fields"]}
    if record["name"] == "Event":
        fields.pop("payload")
        hints.pop("payload", None)
    for name in sorted(set(fields) - set(hints)):
        problems.append(f"{where}.{name}: in the Avro schema, not in {cls.__name__}")
    for name in sorted(set(hints) - set(fields)):
        problems.append(f"{where}.{name}: in {cls.__name__}, not in the Avro schema")
    for name in sorted(set(fields) & set(hints)):
        hint = hints[name]
        optional = get_origin(hint) is NotRequired
        if optional:
            hint = get_args(hint)[0]
        if optional != ("default" in fields[name]):
            problems.append(f"{where}.{name}: NotRequired is {optional}, Avro default is {'default' in fields[name]}")
        if _actual(hint) != _expected(fields[name]["type"]):
            problems.append(f"{where}.{name}: {hint} does not match Avro {fields[name]['type']}")
        nested = _nested_records(fields[name]["type"])
        for sub in nested:
            problems += _compare(sub, typed.RECORDS[sub["name"]], f"{where}.{name}")
    return problems


def _nested_records(avro: Any) -> list[dict[str, Any]]:
    if isinstance(avro, list):
        return [r for branch in avro for r in _nested_records(branch)]
    if isinstance(avro, dict):
        if avro["type"] == "record":
            return [avro]
        if avro["type"] == "array":
            return _nested_records(avro["items"])
    return []


def test_envelope_matches_the_newest_schema() -> None:
    assert _compare(latest().raw, typed.Envelope, "Event") == []


def test_every_payload_kind_has_a_matching_typed_dict() -> None:
    payload = next(f for f in latest().raw["fields"] if f["name"] == "payload")
    kinds = {snake_case(branch["name"]): branch for branch in payload["type"]}
    assert set(kinds) == set(typed.PAYLOADS)
    problems = [p for kind, record in kinds.items() for p in _compare(record, typed.PAYLOADS[kind], kind)]
    assert problems == []


@pytest.mark.parametrize(
    "change",
    [
        lambda raw: raw["fields"].append({"name": "tenant", "type": ["null", "string"], "default": None}),
        lambda raw: next(f for f in raw["fields"] if f["name"] == "seq").update(type="string"),
        lambda raw: next(f for f in raw["fields"] if f["name"] == "agent_name").pop("default"),
    ],
)
def test_a_drifted_schema_is_reported(change) -> None:
    import copy

    raw = copy.deepcopy(latest().raw)
    change(raw)
    assert _compare(raw, typed.Envelope, "Event") != []
