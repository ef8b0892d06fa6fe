"""Errors raised while encoding, decoding or checking event schemas."""

from __future__ import annotations

from common.errors import TerminalError


class SchemaError(TerminalError):
    """Base class of every schema error."""


class EncodeError(SchemaError):
    """An event does not conform to the writer schema."""


class DecodeError(SchemaError):
    """Bytes that cannot be turned into an event; the message says why."""

    reason: str = "decode_error"


class BadMagic(DecodeError):
    """The bytes do not start with the Avro single-object marker C3 01."""

    reason = "bad_magic"


class UnknownFingerprint(DecodeError):
    """The writer-schema fingerprint is not one this reader knows."""

    reason = "unknown_schema"


class CorruptPayload(DecodeError):
    """The body does not decode under the writer schema (truncated, wrong types, bad UTF-8)."""

    reason = "corrupt_payload"


class InvalidEvent(DecodeError):
    """The event decodes but violates an envelope rule (empty ids, negative seq, type mismatch)."""

    reason = "invalid_event"


class OversizedEvent(DecodeError):
    """The record exceeds the configured maximum event size."""

    reason = "oversized"


class IncompatibleSchema(SchemaError):
    """A schema change breaks the configured compatibility; the message lists each problem."""
