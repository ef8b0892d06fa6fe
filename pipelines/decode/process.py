"""The decoder's child process, seen from the parent: start it, call it under a deadline, kill it.

The Rust reader runs in a child process because a malformed block can make it spin instead
of failing; a request that misses its deadline kills the child. What the child does with a
request is :mod:`pipelines.decode.server`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from common.errors import TransientError
from pipelines.errors import PipelineError


class BlockTimeout(PipelineError, TransientError):
    """The Rust reader missed its deadline on a block (or its process died); always handled by the decoder."""


class DecoderProcess:
    """One child process running the Rust reader, with its own pipe, killable at any moment.

    Not a ``multiprocessing.Pool``: terminating a pool goes through its handler threads and
    queue locks and ends with SIGTERM; a reader spinning in native code under load has left
    that waiting forever. Here a request that misses its deadline gets SIGKILL and the pipe
    is dropped, so nothing of the stuck call survives. Spawned, not forked: the parent runs
    librdkafka threads. The child imports the reader as it starts (≈1-2 s), overlapping the
    consumer-group join; it says when it is ready, and request deadlines count from then.
    """

    #: Longest wait for a new child's imports (a loaded machine can take tens of seconds).
    startup_timeout_s = 120.0

    def __init__(self, serve: Callable[[Connection], None]) -> None:
        """Start the child.

        Args:
            serve: the child's main loop, given its end of the pipe (a module-level function:
                the child is spawned, so it is pickled by name).
        """
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe(duplex=True)
        self._process = context.Process(target=serve, args=(child_end,), name="trajlake-decoder", daemon=True)
        self._process.start()
        child_end.close()
        self._sender: threading.Thread | None = None
        self._ready = False

    def call(
        self, header: dict[str, Any], parts: Sequence[bytes | pa.Buffer], deadline_s: float
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Send a request, return the reply header and its byte parts.

        The request is written by a helper thread: a child that stops reading (stopped,
        wedged) would otherwise block the write of a request larger than the pipe buffer
        before the deadline could start; killing the child ends that write.

        Raises:
            BlockTimeout: no complete reply within ``deadline_s`` of waiting, or the child died.
        """
        self._sender = threading.Thread(target=self._send, args=({**header, "parts": len(parts)}, parts), daemon=True)
        self._sender.start()
        try:
            if not self._ready:  # start-up (imports) does not count against a request's deadline
                if not self._conn.poll(self.startup_timeout_s):
                    raise BlockTimeout
                self._ready = self._conn.recv().get("ready", False)
            if not self._conn.poll(deadline_s):
                raise BlockTimeout
            reply = self._conn.recv()
            out: list[bytes] = []
            for _ in range(reply.pop("parts")):
                if not self._conn.poll(deadline_s):
                    raise BlockTimeout
                out.append(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:  # the child died (a native crash, the OOM killer)
            raise BlockTimeout from exc
        self._sender.join()
        return reply, out

    def _send(self, header: dict[str, Any], parts: Sequence[bytes | pa.Buffer]) -> None:
        with contextlib.suppress(OSError):  # the child was killed, or died: call() reports it
            self._conn.send(header)
            for part in parts:
                self._conn.send_bytes(part)

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._process.pid

    def close(self, grace_s: float = 1.0) -> None:
        """End the child: EOF on its pipe lets an idle one exit; a busy one is killed."""
        writing = self._sender is not None and self._sender.is_alive()
        if not writing:  # no other thread uses the pipe: closing it is the exit request
            self._conn.close()
            self._process.join(grace_s)
        if self._process.exitcode is None:
            self._process.kill()  # a write still in flight fails with EPIPE
            self._process.join()
        if self._sender is not None:
            self._sender.join()
        with contextlib.suppress(OSError):
            self._conn.close()
        self._process.close()
