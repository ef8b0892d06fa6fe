"""Event schemas: Avro versions, single-object encoding, Iceberg mapping, compatibility."""

from schemas.registry import decode_event, encode_event, get_version, latest, versions

__all__ = ["decode_event", "encode_event", "get_version", "latest", "versions"]
