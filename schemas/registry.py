"""Event schema versions, Avro single-object encoding, and decoding with resolution.

Every Kafka record value is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO
fingerprint of the writer schema's canonical form + the Avro binary body. A
reader looks the fingerprint up among the versions it knows and resolves the
writer schema to its own (the latest) by Avro's rules, so producers on an older
version keep working while readers move on.

In Python an event is a flat ``dict`` of envelope fields plus ``payload``: a
``dict`` of the payload kind named by ``event_type`` (``"agent_action"`` ↔ the
Avro record ``AgentAction``).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas.errors import (
    BadMagic,
    CorruptPayload,
    EncodeError,
    InvalidEvent,
    OversizedEvent,
    UnknownFingerprint,
)

MAGIC = b"\xc3\x01"
HEADER_LEN = 10
_AVSC_PATTERN = re.compile(r"trajlake\.event\.v(\d+)\.avsc$")


def snake_case(name: str) -> str:
    """``AgentAction`` → ``agent_action``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@dataclass(frozen=True)
class SchemaVersion:
    """One version of the event schema."""

    version: int
    raw: dict[str, Any]
    parsed: Any
    canonical: str
    fingerprint: bytes
    payload_kinds: dict[str, str]  # event_type -> full Avro record name

    @property
    def header(self) -> bytes:
        """The single-object encoding header for this writer schema."""
        return MAGIC + self.fingerprint


def _load_version(version: int, text: str) -> SchemaVersion:
    raw = json.loads(text)
    canonical = to_parsing_canonical_form(raw)
    parsed = fastavro.parse_schema(raw, _write_hint=True, _force=True)
    namespace = raw.get("namespace", "")
    payload_field = next(f for f in raw["fields"] if f["name"] == "payload")
    kinds = {snake_case(branch["name"]): f"{namespace}.{branch['name']}" for branch in payload_field["type"]}
    return SchemaVersion(
        version=version,
        raw=raw,
        parsed=parsed,
        canonical=canonical,
        fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
        payload_kinds=kinds,
    )


@cache
def versions() -> dict[int, SchemaVersion]:
    """All schema versions shipped with this package, by version number."""
    found: dict[int, SchemaVersion] = {}
    for entry in resources.files("schemas").joinpath("avro").iterdir():
        match = _AVSC_PATTERN.search(entry.name)
        if match:
            found[int(match.group(1))] = _load_version(int(match.group(1)), entry.read_text())
    if not found:
        raise RuntimeError("no event schema (.avsc) found in schemas/avro")
    return dict(sorted(found.items()))


def latest() -> SchemaVersion:
    """The newest schema version; readers resolve every writer version to it."""
    return versions()[max(versions())]


def get_version(version: int) -> SchemaVersion:
    """A schema version by number.

    Raises:
        KeyError: no such version is shipped.
    """
    return versions()[version]


@cache
def _by_fingerprint() -> dict[bytes, SchemaVersion]:
    return {v.fingerprint: v for v in versions().values()}


def encode_event(event: dict[str, Any], version: int | None = None) -> bytes:
    """Encode an event as Avro single-object bytes.

    Args:
        event: envelope fields plus ``payload`` (the dict of the kind named by ``event_type``).
        version: writer schema version; the latest by default.

    Returns:
        ``C3 01`` + fingerprint + Avro binary body.

    Raises:
        EncodeError: unknown ``event_type`` or a field that does not fit the schema.
    """
    schema = get_version(version) if version is not None else latest()
    kind = event.get("event_type")
    record_name = schema.payload_kinds.get(kind) if isinstance(kind, str) else None
    if record_name is None:
        raise EncodeError(f"event_type {kind!r} is not a payload kind of schema v{schema.version}")
    body = dict(event)
    body["payload"] = (record_name, event["payload"])
    buffer = io.BytesIO()
    buffer.write(schema.header)
    try:
        fastavro.schemaless_writer(buffer, schema.parsed, body, strict_allow_default=True)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise EncodeError(f"event {event.get('event_id')!r} ({kind}): {exc}") from exc
    return buffer.getvalue()


def writer_version(data: bytes) -> SchemaVersion:
    """The writer schema named by a record's header.

    Raises:
        BadMagic: no single-object header.
        UnknownFingerprint: a header naming a schema this reader does not know.
    """
    if len(data) < HEADER_LEN or data[:2] != MAGIC:
        raise BadMagic(f"not Avro single-object encoded (first bytes {data[:4].hex() or 'empty'})")
    schema = _by_fingerprint().get(bytes(data[2:HEADER_LEN]))
    if schema is None:
        raise UnknownFingerprint(f"unknown writer schema fingerprint {data[2:HEADER_LEN].hex()}")
    return schema


def _without_logical_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_without_logical_types(v) for v in node]
    return node


@cache
def _raw_parsed(version: int) -> Any:
    """Version ``version``'s schema parsed without logical types: ``ts`` reads as the int64 µs sent."""
    return fastavro.parse_schema(_without_logical_types(get_version(version).raw), _write_hint=True, _force=True)


def decode_event(data: bytes, max_bytes: int | None = None, raw_timestamps: bool = False) -> dict[str, Any]:
    """Decode single-object bytes into an event dict under the latest reader schema.

    Args:
        data: the record value.
        max_bytes: larger records raise ``OversizedEvent``.
        raw_timestamps: ``ts`` as the int64 µs sent (any value an Avro long holds), not a
            ``datetime`` (which holds years 1 to 9999 only: one outside is ``CorruptPayload``).

    Raises:
        OversizedEvent: ``len(data) > max_bytes``.
        BadMagic, UnknownFingerprint, CorruptPayload, InvalidEvent: see each class.
    """
    if max_bytes is not None and len(data) > max_bytes:
        raise OversizedEvent(f"{len(data)} bytes exceeds the {max_bytes}-byte event limit")
    writer = writer_version(data)
    reader = latest()
    buffer = io.BytesIO(data)
    buffer.seek(HEADER_LEN)
    writer_schema = _raw_parsed(writer.version) if raw_timestamps else writer.parsed
    reader_schema = (_raw_parsed(reader.version) if raw_timestamps else reader.parsed) if reader is not writer else None
    try:
        record = fastavro.schemaless_reader(
            buffer,
            writer_schema,
            reader_schema,
            return_record_name=True,
            return_record_name_override=True,
        )
    except Exception as exc:  # fastavro raises many types for corrupt input
        raise CorruptPayload(f"schema v{writer.version}: {type(exc).__name__}: {exc}") from exc
    if buffer.tell() != len(data):
        raise CorruptPayload(f"schema v{writer.version}: {len(data) - buffer.tell()} trailing bytes")
    if not isinstance(record, dict):  # every version's top level is a record; fastavro's type admits any datum
        raise CorruptPayload(f"schema v{writer.version}: decoded a {type(record).__name__}, not a record")
    record_name, payload = record["payload"]
    kind = snake_case(record_name.rsplit(".", 1)[-1])
    if kind != record["event_type"]:
        raise InvalidEvent(f"event_type {record['event_type']!r} does not match payload {record_name}")
    if not record["event_id"] or not record["session_id"]:
        raise InvalidEvent("empty event_id or session_id")
    if record["seq"] < 0:
        raise InvalidEvent(f"negative seq {record['seq']}")
    record["payload"] = payload
    record["schema_version"] = writer.version
    return record
