"""The batch buffer: records consumed for one commit, held as columns."""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, Message

from pipelines.decode import binary_array_over

log = logging.getLogger("trajlake.ingest")


@dataclass
class Batch:
    """Records consumed for one commit, held as columns, not as ``Message`` objects.

    Values are appended to one buffer as they arrive (the decoder takes it as an Arrow
    binary array without another copy), and each message is released at once: a batch
    costs its bytes plus ~30 bytes of coordinates per record.
    """

    data: bytearray = field(default_factory=bytearray)
    ends: array[int] = field(default_factory=lambda: array("q"))  # end of each value in ``data``
    partitions: array[int] = field(default_factory=lambda: array("i"))
    offsets: array[int] = field(default_factory=lambda: array("q"))
    timestamps: array[int] = field(default_factory=lambda: array("q"))  # Kafka timestamp (ms, 0 if none)
    keys: list[bytes | None] = field(default_factory=list)
    n_bytes: int = 0  # size of the values (kept after ``data`` is released)
    started: float = 0.0  # time.monotonic() of the first record, or ``opened`` when set
    #: time.monotonic() from which this batch's records may have been waiting (0: unknown). A follower
    #: opens the next batch at the cut of the one before: records that arrive while the worker waits
    #: for a commit are older than their first poll, and the linger counts from when they could arrive.
    opened: float = 0.0

    def __len__(self) -> int:
        return len(self.ends)

    def values(self) -> pa.BinaryArray:
        """The record values as an Arrow binary array over the batch's buffer (no copy)."""
        return binary_array_over(self.data, np.frombuffer(self.ends, dtype=np.int64))

    def value(self, index: int) -> bytes:
        """The value of the ``index``-th record (a copy)."""
        start = self.ends[index - 1] if index else 0
        return bytes(self.data[start : self.ends[index]])

    def add(self, messages: Iterable[Message], positions: dict[int, int]) -> int:
        """Append the records among ``messages`` (errors are logged, partition EOFs ignored).

        Args:
            messages: what a consumer poll returned.
            positions: next offset to read per partition, advanced past every record added.

        Returns:
            The number of records added.
        """
        if not self.ends:
            self.started = self.opened or time.monotonic()
        data, ends, partitions, offsets, timestamps, keys = (
            self.data,
            self.ends,
            self.partitions,
            self.offsets,
            self.timestamps,
            self.keys,
        )
        before = len(ends)
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", error)
                continue
            partition, offset = message.partition(), message.offset()
            if partition is None or offset is None:  # only error events lack coordinates
                continue
            value = message.value()
            if value:
                data += value
            ends.append(len(data))
            partitions.append(partition)
            offsets.append(offset)
            timestamps.append(message.timestamp()[1])
            keys.append(message.key())
            positions[partition] = offset + 1
        self.n_bytes = len(data)
        return len(ends) - before
