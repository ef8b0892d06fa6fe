"""The reaper: kills sandboxes at their wall-clock deadline, independent of the agents."""

from __future__ import annotations

import heapq
import itertools
import threading
import time

from producers.fleet.sandbox.bwrap import Sandbox


class Reaper:
    """Kills sandboxes at their wall-clock deadline, independent of the agents.

    One thread holds a deadline heap; at a deadline it SIGKILLs the whole sandbox, verifies that
    nothing survived, and counts it. The session runner sees the executor's pipe close and
    reports the session as timed out (``exit_reason='reaper'``).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Sandbox]] = []
        self._cond = threading.Condition()
        self._counter = itertools.count()
        self._stopped = False
        self.reaped: list[str] = []
        self.survivors = 0
        self._thread = threading.Thread(target=self._loop, name="sandbox-reaper", daemon=True)
        self._thread.start()

    def watch(self, sandbox: Sandbox, deadline_s: float) -> None:
        """Kill ``sandbox`` ``deadline_s`` seconds after it was created unless it ends first."""
        with self._cond:
            heapq.heappush(self._heap, (sandbox.created_at + deadline_s, next(self._counter), sandbox))
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                _, _, sandbox = heapq.heappop(self._heap)
            if sandbox.killed or not sandbox.alive:
                continue
            sandbox.kill(reaped=True)
            left = sandbox.survivors()
            with self._cond:
                self.reaped.append(sandbox.sandbox_id)
                self.survivors += left

    def stop(self) -> None:
        """Stop the reaper thread (pending deadlines are dropped)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(5)
