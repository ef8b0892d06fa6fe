"""Run work that cannot be trusted to stop in a child process the parent can kill, under a hard memory cap.

The child streams its result back as Arrow record batches over a pipe, one message per
batch, so neither side holds the whole result. The parent enforces a wall-clock deadline
counted from before the child starts (so everything the child does — opening the catalog,
parsing, planning, executing — is inside it) and, when it passes, kills the child's whole
process group with ``SIGKILL``: nothing the child runs (a planner that never checks for
interrupts, a scalar function building one huge value) can outlast it.

The memory cap is ``RLIMIT_AS`` in the child: once the work has done its trusted set-up
(:meth:`BatchSink.cap_memory`), its address space may grow by at most the given number of
bytes, whatever DuckDB thinks it is using. An allocation past it fails in the child (DuckDB
raises out-of-memory; the child reports it) and never touches the parent. No cgroup is used:
the cap needs no privileges.

How the child starts: by ``fork`` when the calling process has no other Python thread (the
command line), so the child inherits the imported modules and costs a few milliseconds;
otherwise through a fork server (``multiprocessing``'s ``forkserver``, started once per
process with the SQL layer preloaded; its children do not re-run the caller's ``__main__``),
because forking a process whose other threads may hold locks can deadlock the child. A child
of the fork server takes the caller's environment, directory and umask of the moment.

Messages (``multiprocessing.Connection.send_bytes``), first byte the kind: ``S`` the schema
(an Arrow IPC stream without batches), ``B`` one batch (an IPC stream of one batch), ``E`` an
error (JSON: kind, message), ``Z`` the end.
"""

from __future__ import annotations

import gc
import io
import json
import multiprocessing
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext, ForkServerProcess, set_spawning_popen
from typing import Any

import pyarrow as pa

from common.errors import CorruptMetadata, EnvironmentFault, environment_fault
from warehouse.errors import QueryError, QueryKilled, QueryMemoryExceeded, QueryTimeout

#: Largest batch the child sends in one message; bigger ones are sliced (bounds both sides' buffers).
MAX_MESSAGE_BYTES = 8 << 20

_forkserver_lock = threading.Lock()
_forkserver: BaseContext | None = None


class BatchSink:
    """The child's end of the pipe: what the work function writes its result to."""

    def __init__(self, conn: Connection, memory_bytes: int) -> None:
        self._conn = conn
        self._memory_bytes = memory_bytes
        self._capped = False
        self._schema: pa.Schema | None = None

    def cap_memory(self) -> None:
        """From now on this process may grow by at most the cap's bytes of address space (``RLIMIT_AS``).

        The work calls it once its trusted set-up is done and before it runs what it does not
        trust, so the cap measures what the untrusted part allocates, not the thread pools and
        caches of the set-up (whose reserved address space dwarfs what they use). Work that
        never calls it is capped before its first batch.
        """
        if self._capped:
            return
        self._capped = True
        cap = _address_space() + self._memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    def schema(self, schema: pa.Schema) -> None:
        """Announce the result's schema (once, before any batch)."""
        self.cap_memory()
        self._schema = schema
        self._conn.send_bytes(b"S" + _ipc(schema, []))

    def write(self, batch: pa.RecordBatch) -> None:
        """Send one batch, sliced so that no message exceeds :data:`MAX_MESSAGE_BYTES`."""
        if self._schema is None:
            self.schema(batch.schema)
        rows = batch.num_rows
        if rows == 0:
            return
        per_row = max(1, batch.nbytes // rows)
        step = max(1, min(rows, MAX_MESSAGE_BYTES // per_row))
        for offset in range(0, rows, step):
            self._conn.send_bytes(b"B" + _ipc(batch.schema, [batch.slice(offset, step)]))


def _ipc(schema: pa.Schema, batches: list[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _read_ipc(data: bytes) -> pa.RecordBatchStreamReader:
    return pa.ipc.open_stream(pa.py_buffer(data))


def _address_space() -> int:
    """This process's current virtual memory size in bytes (``VmSize``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


#: Lines of a DuckDB error kept after its first: the names it suggests for a misspelt one.
_SUGGESTIONS = ("Did you mean", "Candidate bindings:")


def error_line(text: str) -> str:
    """A DuckDB error as one line: its first line, and its "did you mean" / candidate names when it has them."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return " ".join([lines[0], *(line for line in lines[1:] if line.startswith(_SUGGESTIONS))])


def _child_main(
    conn: Connection, memory_bytes: int, work: Callable[..., None], args: tuple[Any, ...], caller: _Caller
) -> None:
    """The child: the caller's environment, own process group, memory cap, run ``work(sink, *args)``, report."""
    os.setpgid(0, 0)  # the parent kills the group: anything this process starts dies with it
    caller.adopt()
    # Objects inherited from the parent (its connections, its thread pools) are never collected
    # here: finalizing one could wait on a thread that the fork did not copy.
    gc.freeze()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        work(BatchSink(conn, memory_bytes), *args)
        conn.send_bytes(b"Z")
    except BaseException as exc:  # every failure becomes one message; the parent raises it
        kind = next((k for k, names in _KINDS.items() if _matches(exc, names)), "error")
        first = error_line(str(exc)) or type(exc).__name__
        report = {"kind": kind, "message": first}
        fault = environment_fault(exc)
        if fault is not None:  # the machine refused a file: the parent raises it as such (its exit code)
            report = {"kind": "fault", "message": str(fault), "cause": fault.cause, "path": fault.path}
            report["corrupt"] = "1" if isinstance(fault, CorruptMetadata) else ""
        try:
            conn.send_bytes(b"E" + json.dumps(report).encode())
        except OSError:
            pass  # the parent went away: nobody to tell
    finally:
        conn.close()
    os._exit(0)


class _Caller:
    """What a child forked from the fork server must take from its caller: environment, directory, umask.

    The fork server was started by an earlier call, so its environment (object-store endpoints and
    credentials read at run time), working directory (a relative ``TRAJLAKE_HOME``) and umask may
    no longer be the caller's.
    """

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.umask = _umask()

    def adopt(self) -> None:
        if os.environ != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        os.chdir(self.cwd)
        os.umask(self.umask)


def _umask() -> int:
    """This process's umask, read without changing it (Linux ``/proc``)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise OSError("no Umask in /proc/self/status")


#: Exception class names (of any module) by the kind of failure the parent reports.
_KINDS = {
    "memory": ("MemoryError", "OutOfMemoryException"),
    "query": ("QueryError",),
}


def _matches(exc: BaseException, names: tuple[str, ...]) -> bool:
    return any(cls.__name__ in names for cls in type(exc).__mro__)


class _ServerPopen(popen_forkserver.Popen):
    """The fork server's start, less one step: the child does not re-run the caller's ``__main__``.

    ``multiprocessing`` re-imports the main script in every fork-server child (for pickled
    references to it), which costs a program's whole import time per query and fails in a
    script without an ``if __name__ == "__main__"`` guard. The work and its arguments live in
    importable modules, so the child has no use for it. Otherwise as the standard library's.
    """

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))  # type: ignore[attr-defined]
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _ServerProcess(ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _ServerPopen:
        return _ServerPopen(process_obj)


def _context(preload: list[str]) -> tuple[BaseContext, Callable[..., Any]]:
    """``fork`` when this process has no other Python thread, else the (shared) fork server; and its Process."""
    global _forkserver
    if threading.active_count() == 1:
        forked = multiprocessing.get_context("fork")
        return forked, forked.Process
    with _forkserver_lock:
        if _forkserver is None:
            served = multiprocessing.get_context("forkserver")
            served.set_forkserver_preload(preload)
            _forkserver = served
        return _forkserver, _ServerProcess


class IsolatedStream:
    """The parent's view of one child: its schema, then its batches, all before the deadline.

    Use as a context manager: leaving it (or an error) kills the child if it still runs.

    Attributes:
        schema: The result's schema, known once :meth:`start` returns.
    """

    def __init__(
        self,
        work: Callable[..., None],
        args: tuple[Any, ...],
        *,
        timeout_s: float,
        memory_bytes: int,
        timeout_hint: str = "",
        memory_hint: str = "",
        preload: list[str] | None = None,
    ) -> None:
        self._work, self._args = work, args
        self._timeout_s, self._memory_bytes = timeout_s, memory_bytes
        self._timeout_hint, self._memory_hint = timeout_hint, memory_hint
        self._preload = preload or []
        self._deadline = 0.0
        self._process: Any = None
        self._conn: Connection | None = None
        self._killed = False
        self.schema: pa.Schema | None = None

    def start(self) -> IsolatedStream:
        """Start the child and wait for its schema.

        Raises:
            QueryTimeout: the deadline passed first (the child was killed).
            QueryMemoryExceeded: the child ran out of its memory cap.
            QueryError: the work failed (its message), or the child died.
        """
        self._deadline = time.monotonic() + self._timeout_s
        context, process_class = _context(self._preload)
        receive, send = context.Pipe(duplex=False)
        process = process_class(
            target=_child_main, args=(send, self._memory_bytes, self._work, self._args, _Caller()), daemon=True
        )
        process.start()
        send.close()  # only the child writes: its exit closes the pipe
        self._process, self._conn = process, receive
        kind, payload = self._next()
        if kind == b"Z":  # the work ended without a result
            self.schema = pa.schema([])
            self._push_back = (kind, payload)
            return self
        if kind != b"S":
            raise QueryError("the query process sent no schema")
        self.schema = _read_ipc(payload).schema
        self._push_back = None
        return self

    _push_back: tuple[bytes, bytes] | None = None

    def __enter__(self) -> IsolatedStream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The result's batches, as the child sends them.

        Raises:
            QueryTimeout, QueryMemoryExceeded, QueryError: as for :meth:`start`.
        """
        while True:
            if self._push_back is not None:
                kind, payload = self._push_back
                self._push_back = None
            else:
                kind, payload = self._next()
            if kind == b"Z":
                return
            if kind != b"B":
                raise QueryError(f"unexpected message {kind!r} from the query process")
            yield from _read_ipc(payload)

    def _next(self) -> tuple[bytes, bytes]:
        """The child's next message; an error message, a death or the deadline raises."""
        assert self._conn is not None and self._process is not None
        while True:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                raise QueryTimeout(f"query interrupted after {self._timeout_s:g} s{self._timeout_hint}")
            ready = wait([self._conn, self._process.sentinel], timeout=remaining)
            if self._conn in ready or (ready and self._conn.poll()):
                try:
                    data = self._conn.recv_bytes()
                except EOFError:
                    raise self._death() from None
                kind, payload = data[:1], data[1:]
                if kind == b"E":
                    raise self._error(json.loads(payload))
                return kind, payload
            if ready:  # the child exited and left nothing to read
                raise self._death()

    def _error(self, report: dict[str, str]) -> QueryError | EnvironmentFault:
        self.close()
        if report.get("kind") == "fault":
            fault = CorruptMetadata if report.get("corrupt") else EnvironmentFault
            return fault(report.get("cause", "?"), report.get("path", "?"))
        if report.get("kind") == "memory":
            return QueryMemoryExceeded(f"{report['message']}{self._memory_hint}")
        return QueryError(report.get("message") or "the query failed")

    def _death(self) -> QueryError:
        """Why the child ended without a last message."""
        assert self._process is not None
        self._process.join(5)
        code = self._process.exitcode
        self.close()
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            if -code in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
                # A failed allocation the engine did not catch ends the process this way.
                return QueryKilled(
                    f"the query process was killed ({name}), most likely by its memory cap{self._memory_hint}"
                )
            return QueryKilled(f"the query process was killed ({name})")
        return QueryKilled(f"the query process ended unexpectedly (exit code {code})")

    def _kill(self) -> None:
        if self._process is None or self._killed:
            return
        self._killed = True
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # not yet its own group leader, or already gone
        try:
            os.kill(self._process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._process.join()

    def close(self) -> None:
        """Kill the child if it still runs and release the pipe (idempotent)."""
        if self._process is not None and self._process.exitcode is None:
            self._kill()
        elif self._process is not None:
            self._process.join()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
