"""Batch decoding of Kafka record values into raw-events Arrow columns.

Per-record decoding (``schemas.registry.decode_event`` → dict → ``pa.Table.from_pylist``)
costs tens of microseconds per event in Python. Here a whole message batch is decoded
at once: records are grouped by writer-schema fingerprint, each group's Avro bodies
are concatenated into one block of an in-memory Avro object container (header = the
writer schema), and a Rust Avro reader (``polars-avro``) turns that block into Arrow
arrays. The payload union arrives as a dense union and becomes the per-kind struct
columns of ``raw_events``; older writer versions are resolved to the latest reader
schema column by column (missing fields take the reader's default, types are cast).

Isolated (the default), the whole batch is decoded in a child process (see below): the
calling process only ships the values' bytes and takes back sorted Arrow columns, so a
consumer's Python thread and the decoding work on different cores. Given a ``FileTarget``,
the child also writes the rows as Iceberg data files and sends back only the files and the
rows' keys, so the wide rows never cross the pipe and Parquet encoding leaves the
consumer's process too.

Results are the same as ``decode_event`` record by record, dead-letter reasons
included, because anything the batch path cannot vouch for goes through
``decode_event``:

* header checks (size limit, magic, fingerprint) run per record before batching;
* a block that fails to decode is bisected until the failing records are alone, and
  those are decoded one by one (giving ``decode_event``'s exact error);
* the Rust reader runs in a child process with a deadline, because a block whose
  records consume fewer bytes than the block holds (a record with trailing bytes)
  makes it spin instead of failing; on a timeout the child is killed (SIGKILL) and
  the records are decoded record by record;
* envelope validations (kind matches ``event_type``, non-empty ids, ``seq`` ≥ 0)
  run vectorized on the decoded columns with ``decode_event``'s messages.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import pyarrow as pa

from pipelines.decode.batch import LocalDecoder
from pipelines.decode.files import write_files_isolating
from pipelines.decode.framing import LazyValues, binary_array, object_container, read_ipc
from pipelines.decode.process import BlockTimeout, DecoderProcess
from pipelines.decode.resolution import Plan
from pipelines.decode.results import DecodeResult, FileTarget
from pipelines.decode.server import serve

log = logging.getLogger("trajlake.decode")


class BatchDecoder(LocalDecoder):
    """Decodes batches of single-object Avro records into raw-events Arrow columns.

    Args:
        target: Arrow schema of ``raw_events`` (``RAW_EVENTS.arrow_schema()``).
        max_event_bytes: larger records are dead-lettered as oversized.
        isolate: run the Rust reader in a child process with a deadline (see module doc);
            ``False`` runs it in-process, for trusted input and tests.
        timeout_s: deadline per block, plus ``timeout_per_mb_s`` per MB of block.
    """

    def __init__(
        self,
        target: pa.Schema,
        max_event_bytes: int | None = None,
        isolate: bool = True,
        timeout_s: float = 10.0,
        timeout_per_mb_s: float = 2.0,
    ) -> None:
        super().__init__(target, max_event_bytes)
        self.isolate = isolate
        self.timeout_s = timeout_s
        self.timeout_per_mb_s = timeout_per_mb_s
        self._decoder: DecoderProcess | None = None
        if isolate:
            self._start_decoder()

    def _start_decoder(self) -> DecoderProcess:
        self._decoder = DecoderProcess(serve)
        return self._decoder

    def close(self, grace_s: float = 1.0) -> None:
        """Stop the decoder process, if any (killed if still busy after ``grace_s``)."""
        if self._decoder is not None:
            self._decoder.close(grace_s)
            self._decoder = None

    def __del__(self) -> None:
        # A worker that is dropped without close() must not leave its decoder process behind.
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> BatchDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _decode_block(self, plan: Plan, block: bytes | pa.Buffer, count: int) -> pa.Table | None:
        """Arrow table of the block, or None when it failed (corrupt record); read by the decoder process.

        Raises:
            BlockTimeout: the block missed its deadline (the process is killed).
        """
        if not self.isolate:
            return super()._decode_block(plan, block, count)
        container = object_container(plan.schema_json, block, count)
        decoder = self._decoder or self._start_decoder()
        deadline = self.timeout_s + self.timeout_per_mb_s * len(container) / 1e6
        try:
            reply, parts = decoder.call({"kind": "read", "count": count}, [container], deadline)
        except BlockTimeout:
            log.warning("Avro block of %d records timed out after %.1f s; decoding record by record", count, deadline)
            self.close(grace_s=0.0)
            raise
        return read_ipc(parts[0]) if reply["ok"] else None

    # -- public --------------------------------------------------------------------------

    def decode(self, values: Sequence[bytes | None], sort_by: Sequence[tuple[str, str]] = ()) -> DecodeResult:
        """Decode a batch of record values (``None`` counts as empty bytes).

        Isolated, the whole batch is decoded in the decoder process (the caller's process
        only ships the bytes and takes the Arrow result). If that misses its deadline, the
        process is killed and the batch is decoded record by record with ``decode_event``;
        if decoding raised there, the batch is decoded again here, each block read by the
        decoder process under its own deadline (``decode_here``).

        Args:
            values: record values, in batch order.
            sort_by: order of the returned events (column, "ascending"|"descending");
                ties and the default keep batch order.

        Returns:
            The good events (with ``ROW_INDEX`` pointing into ``values``) and the dead
            records with their ``decode_event`` errors (in batch order).
        """
        return self.decode_array(binary_array([value or b"" for value in values]), sort_by)

    def decode_array(
        self, array: pa.BinaryArray, sort_by: Sequence[tuple[str, str]] = (), write: FileTarget | None = None
    ) -> DecodeResult:
        """:meth:`decode` for values already in an Arrow binary array (nulls count as empty).

        With ``write``, the events are written as data files and only their keys come back
        (``DecodeResult.files``): by the decoder process, or here when the batch was decoded
        here (a timeout, an error in the decoder process, or not isolated). Events that cannot
        be written are dead records (``UnwritableEvent``), wherever they were written.
        """
        values = LazyValues(array)
        result = None
        if self.isolate and len(array):
            try:
                result = self._decode_in_child(array, sort_by, write)
            except BlockTimeout:
                # Some block spins the reader (or kills it): every group's block would be
                # suspect, and each retry costs a deadline, so decode_event takes the batch.
                tables, dead = self._decode_one_by_one(values, list(range(len(values))))
                result = self._finish(
                    DecodeResult(events=pa.table({}), dead=dead, fallback_records=len(values)), tables, sort_by
                )
        if result is None:
            result = self.decode_here(array, values, sort_by)
        if write is not None and result.files is None:
            result.events, result.files, unwritable = write_files_isolating(result.events, self.target, write)
            if unwritable:
                result.dead = sorted(result.dead + unwritable, key=lambda item: item[0])
        return result

    def _decode_in_child(
        self, array: pa.BinaryArray, sort_by: Sequence[tuple[str, str]], write: FileTarget | None = None
    ) -> DecodeResult | None:
        """The whole batch decoded by the decoder process; None when decoding raised there.

        Raises:
            BlockTimeout: no answer within the deadline (the process is killed).
        """
        decoder = self._decoder or self._start_decoder()
        offsets, data = array.buffers()[1], array.buffers()[2]
        deadline = self.timeout_s + self.timeout_per_mb_s * data.size / 1e6
        header = {
            "kind": "batch",
            "n": len(array),
            "large": pa.types.is_large_binary(array.type),
            "offset": array.offset,
            "target": self.target,
            "max_event_bytes": self.max_event_bytes,
            "sort_by": list(sort_by),
            "write": write,
        }
        try:
            reply, parts = decoder.call(header, [offsets, data], deadline)
        except BlockTimeout:
            log.warning(
                "batch of %d records not decoded within %.1f s; decoding it record by record", len(array), deadline
            )
            self.close(grace_s=0.0)
            raise
        if not reply["ok"]:
            log.warning("batch decoding failed in the decoder process (%s); decoding it block by block", reply["error"])
            return None
        events = pa.concat_tables([read_ipc(part) for part in parts])
        return DecodeResult(
            events=events, dead=reply["dead"], fallback_records=reply["fallback"], files=reply.get("files")
        )
