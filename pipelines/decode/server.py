"""The decoder process's side: answer block reads and whole-batch decodes sent over the pipe.

A request is a pickled header followed by byte parts; the reply is a header followed by
Arrow IPC slices. Decoding here uses the in-process :class:`~pipelines.decode.batch.LocalDecoder`,
and, given a ``FileTarget``, the rows are written as data files here too, so only their
keys cross the pipe.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from common.memory import release_free_memory, reusing_allocator, steady_gc
from pipelines.decode.batch import LocalDecoder
from pipelines.decode.files import write_files_isolating
from pipelines.decode.framing import LazyValues, ipc_bytes, read_container_safely

# The decoder keeps freed pages for the next batch (its working set is one batch), and gives
# them back once it holds more than this, so a heap fragmented by odd batches cannot grow on.
DECODER_RETAINED_BYTES = 512 << 20

#: Rows per reply part: the decoder process serializes its answer a slice at a time, so it
#: never holds a second copy of a whole decoded batch.
_REPLY_ROWS = 4096


def _slices(table: pa.Table) -> Iterator[pa.Buffer]:
    """IPC slices of ``table``: ``_reply_parts(table)`` of them, at least one (it carries the schema)."""
    for start in range(0, max(table.num_rows, 1), _REPLY_ROWS):
        yield ipc_bytes(table.slice(start, _REPLY_ROWS))


def _reply_parts(table: pa.Table) -> int:
    return max(-(-table.num_rows // _REPLY_ROWS), 1)


def handle(
    header: dict[str, Any], parts: list[bytes], decoders: dict[Any, LocalDecoder]
) -> tuple[dict[str, Any], int, Iterable[bytes | pa.Buffer]]:
    """One decoder-process request: a block read (``read``) or a whole batch (``batch``).

    Args:
        header: the request (its ``kind`` and arguments).
        parts: the request's byte parts (a container to read, or a batch's offsets and data).
        decoders: decoders kept between requests, by target schema and size limit.

    Returns:
        The reply header, the number of reply parts and the parts (Arrow IPC slices).
    """
    if header["kind"] == "read":
        result = read_container_safely(parts[0], header["count"])
        if isinstance(result, pa.Table):
            return {"ok": True}, 1, [ipc_bytes(result)]
        return {"ok": False, "error": result}, 0, []
    try:
        key = (header["target"], header["max_event_bytes"])
        decoder = decoders.get(key)
        if decoder is None:
            decoder = decoders[key] = LocalDecoder(header["target"], header["max_event_bytes"])
        kind = pa.large_binary() if header["large"] else pa.binary()
        array = pa.Array.from_buffers(
            kind, header["n"], [None, pa.py_buffer(parts[0]), pa.py_buffer(parts[1])], offset=header["offset"]
        )
        decoded = decoder.decode_here(array, LazyValues(array), header["sort_by"])
        del array, parts[:]
        reply: dict[str, Any] = {"ok": True, "dead": decoded.dead, "fallback": decoded.fallback_records}
        events = decoded.events
        if header.get("write") is not None:
            events, reply["files"], unwritable = write_files_isolating(events, header["target"], header["write"])
            if unwritable:
                reply["dead"] = sorted(decoded.dead + unwritable, key=lambda item: item[0])
        return reply, _reply_parts(events), _slices(events)
    except Exception as exc:  # reported to the parent, which decodes the batch itself
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 0, []


def _warm_up() -> None:
    import polars_avro._avro_rs  # noqa: F401 - the Rust reader, before requests' deadlines start


def serve(conn: Connection) -> None:
    """Decoder process: answer requests (a pickled header, then byte parts) until the pipe closes."""
    reusing_allocator()
    _warm_up()
    conn.send({"ready": True})
    decoders: dict[Any, LocalDecoder] = {}
    with steady_gc():  # the modules and the warm-up stay out of every collection from here on
        while True:
            try:
                header = conn.recv()
                parts = [conn.recv_bytes() for _ in range(header.pop("parts"))]
            except (EOFError, OSError):
                return  # the parent closed its end
            reply, count, out = handle(header, parts, decoders)
            del parts
            conn.send({**reply, "parts": count})
            for part in out:
                conn.send_bytes(part)
            del reply, out  # the decoded batch is not kept while waiting for the next one
            release_free_memory(above=DECODER_RETAINED_BYTES)
