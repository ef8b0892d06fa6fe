"""Batch decoding of Kafka record values into raw-events Arrow columns (see :mod:`pipelines.decode.decoder`)."""

from __future__ import annotations

from pipelines.decode.decoder import (
    DECODER_RETAINED_BYTES,
    HEADER_FIELD,
    KEY_COLUMNS,
    ROW_INDEX,
    BatchDecoder,
    DecodeResult,
    FileTarget,
    binary_array,
    binary_array_over,
    concatenated,
    concatenated_buffer,
    conform,
    framed_schema,
    ipc_bytes,
    object_container,
    read_ipc,
    with_coordinates,
)

__all__ = [
    "DECODER_RETAINED_BYTES",
    "HEADER_FIELD",
    "KEY_COLUMNS",
    "ROW_INDEX",
    "BatchDecoder",
    "DecodeResult",
    "FileTarget",
    "binary_array",
    "binary_array_over",
    "concatenated",
    "concatenated_buffer",
    "conform",
    "framed_schema",
    "ipc_bytes",
    "object_container",
    "read_ipc",
    "with_coordinates",
]
