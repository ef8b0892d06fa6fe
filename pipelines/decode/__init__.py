"""Batch decoding of Kafka record values into raw-events Arrow columns.

One module per concern:

* :mod:`~pipelines.decode.results`: what a decoded batch is (``DecodeResult``, ``FileTarget``) and
  how it becomes raw-events rows (``with_coordinates``);
* :mod:`~pipelines.decode.framing`: Avro object-container framing, Arrow binary arrays and IPC;
* :mod:`~pipelines.decode.resolution`: writer → reader schema resolution on Arrow arrays;
* :mod:`~pipelines.decode.batch`: decoding a batch in this process (grouping, bisecting, validating);
* :mod:`~pipelines.decode.decoder`: ``BatchDecoder``, which decodes in a child process under a deadline;
* :mod:`~pipelines.decode.process` and :mod:`~pipelines.decode.server`: the two ends of that child
  process's pipe; :mod:`~pipelines.decode.files`: the data files it writes.
"""

from __future__ import annotations

from pipelines.decode.decoder import BatchDecoder
from pipelines.decode.framing import (
    HEADER_FIELD,
    binary_array,
    binary_array_over,
    concatenated,
    concatenated_buffer,
    framed_schema,
    ipc_bytes,
    object_container,
    read_ipc,
)
from pipelines.decode.resolution import conform
from pipelines.decode.results import KEY_COLUMNS, ROW_INDEX, DecodeResult, FileTarget, with_coordinates
from pipelines.decode.server import DECODER_RETAINED_BYTES

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
