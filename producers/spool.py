"""A bounded, crash-safe on-disk spool for events that cannot reach Kafka yet.

The spool is one append-only log file plus a head file holding the byte offset
of the first record not yet acknowledged by Kafka. Records are appended in
emission order and delivered from the head in the same order, so one session's
events keep their order across an outage and across a restart of the producer
process (a new ``Spool`` on the same directory picks up where the old one
stopped). A record torn by a crash mid-append is cut off when the spool is
opened again; it was never acknowledged to the caller.

Record layout: ``u32 body length`` + ``u16 key length`` + key + ``u16 id
length`` + event id + value (all big-endian lengths).
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from producers.errors import SpoolFullError

_LEN = struct.Struct(">I")
_SHORT = struct.Struct(">H")
LOG_NAME = "spool.log"
HEAD_NAME = "spool.head"


@dataclass(frozen=True)
class SpooledEvent:
    """One spooled record and where the next one starts."""

    session_id: str
    event_id: str
    value: bytes
    end: int  # byte offset just past this record


class Spool:
    """Append events while Kafka is down; hand them back in order when it returns.

    Args:
        directory: where the spool files live (created if missing).
        max_bytes: limit on unacknowledged bytes; appending past it raises ``SpoolFullError``.
        fsync: fsync after every append (survives power loss, not only process crashes).
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 256 << 20, fsync: bool = False) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # unsent events: owner-only
        self.max_bytes = max_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._log_path = self.directory / LOG_NAME
        self._head_path = self.directory / HEAD_NAME
        self._log = open(self._log_path, "ab+")  # held open for the spool's lifetime
        self._head = self._read_head()
        self._size = self._recover_tail()

    # -- persistence ---------------------------------------------------------------

    def _read_head(self) -> int:
        try:
            return int(self._head_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _write_head(self, head: int) -> None:
        # Write-then-rename so a crash leaves the old or the new head, never a torn one.
        tmp = self._head_path.with_suffix(".tmp")
        tmp.write_text(str(head))
        os.replace(tmp, self._head_path)
        self._head = head

    def _recover_tail(self) -> int:
        """Size of the log's valid prefix; a torn last record (crash mid-append) is cut off."""
        if self._head > self._log_path.stat().st_size:  # crashed between emptying the log and resetting the head
            self._write_head(0)
        valid = self._head
        for record in self._scan(self._head):
            valid = record.end
        if valid != self._log_path.stat().st_size:
            self._log.truncate(valid)
        return valid

    def _scan(self, start: int) -> Iterator[SpooledEvent]:
        with open(self._log_path, "rb") as log:
            log.seek(start)
            position = start
            while True:
                prefix = log.read(_LEN.size)
                if len(prefix) < _LEN.size:
                    return
                (length,) = _LEN.unpack(prefix)
                body = log.read(length)
                if len(body) < length:
                    return
                position += _LEN.size + length
                key_len = _SHORT.unpack_from(body, 0)[0]
                key = body[2 : 2 + key_len].decode()
                id_at = 2 + key_len
                id_len = _SHORT.unpack_from(body, id_at)[0]
                event_id = body[id_at + 2 : id_at + 2 + id_len].decode()
                yield SpooledEvent(key, event_id, bytes(body[id_at + 2 + id_len :]), position)

    # -- public API ----------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Bytes of records not yet acknowledged."""
        return self._size - self._head

    def __len__(self) -> int:
        return sum(1 for _ in self._scan(self._head)) if self.pending_bytes else 0

    def __bool__(self) -> bool:
        return self.pending_bytes > 0

    def append(self, session_id: str, event_id: str, value: bytes) -> None:
        """Append one record durably (to the OS; to disk too with ``fsync``).

        Raises:
            SpoolFullError: the record would take unacknowledged bytes past ``max_bytes``.
        """
        key, eid = session_id.encode(), event_id.encode()
        body = _SHORT.pack(len(key)) + key + _SHORT.pack(len(eid)) + eid + value
        record = _LEN.pack(len(body)) + body
        with self._lock:
            if self.pending_bytes + len(record) > self.max_bytes:
                raise SpoolFullError(
                    f"spool {self.directory} is full ({self.pending_bytes} of {self.max_bytes} bytes pending): "
                    f"Kafka has been unreachable too long; event {event_id} of session {session_id} was not accepted"
                )
            self._log.write(record)
            self._log.flush()
            if self.fsync:
                os.fsync(self._log.fileno())
            self._size += len(record)

    def pending(self) -> list[SpooledEvent]:
        """Unacknowledged records, oldest first."""
        with self._lock:
            return list(self._scan(self._head)) if self.pending_bytes else []

    def ack(self, end: int) -> None:
        """Mark every record before byte offset ``end`` delivered; empties the files once all are."""
        with self._lock:
            if end <= self._head:
                return
            if end >= self._size:
                # Everything delivered: start over with empty files so the log does not grow forever.
                self._log.truncate(0)
                self._size = 0
                self._write_head(0)
            else:
                self._write_head(end)

    def close(self) -> None:
        """Close the log file (records stay on disk for the next ``Spool``)."""
        self._log.close()
