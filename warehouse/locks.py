"""Named locks that every process sharing one catalog sees, on one machine or many.

A run that plans from "what the table holds now" and replaces it (assembly, scoring,
tiering, maintenance) takes the lock of its job, so a second run of the same job waits for
the first and then finds nothing left to do. With a SQL catalog (SQLite by default,
PostgreSQL in production) the lock is a row in the catalog's own database
(``trajlake_locks``, primary key = the lock name): whoever inserts it holds it, on any
machine. A holder renews its lease every ``ttl/3`` seconds from a background thread; a
row whose lease ran out, or whose holder on this host is no longer alive (a SIGKILLed
run), is taken over. Other catalogs (REST, Glue) fall back to ``flock`` on a file under
``TRAJLAKE_HOME`` (one machine only); their commits are still conditioned on the snapshot
they were planned from (``warehouse.transactions``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, delete, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError

from common.errors import environment_fault
from common.faults import crash_point
from common.settings import Settings
from warehouse.errors import LockBusy

log = logging.getLogger("trajlake.locks")

#: Seconds a lease lasts without renewal (a holder on another machine that died is taken over after this).
LEASE_S = 60.0

_METADATA = MetaData()
_LOCKS = Table(
    "trajlake_locks",
    _METADATA,
    Column("name", String(255), primary_key=True),
    Column("owner", String(64), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("expires_at", Float, nullable=False),
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


class _RowLock:
    """One held lock row: insert to take, lease renewed by a thread, delete to release."""

    def __init__(self, engine: Engine, name: str, lease_s: float) -> None:
        self.engine, self.name, self.lease_s = engine, name, lease_s
        self.owner = uuid.uuid4().hex
        self.host = socket.gethostname()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_acquire(self) -> bool:
        now = time.time()
        try:
            with self.engine.begin() as con:
                row = con.execute(select(_LOCKS).where(_LOCKS.c.name == self.name)).first()
                if row is not None:
                    dead = row.host == self.host and row.pid != os.getpid() and not _alive(row.pid)
                    if row.expires_at >= now and not dead:
                        return False
                    # an expired lease or a dead holder: take over that exact row (the owner guards a race)
                    con.execute(delete(_LOCKS).where(_LOCKS.c.name == self.name, _LOCKS.c.owner == row.owner))
                con.execute(
                    insert(_LOCKS).values(
                        name=self.name,
                        owner=self.owner,
                        host=self.host,
                        pid=os.getpid(),
                        expires_at=now + self.lease_s,
                    )
                )
        except IntegrityError:  # another process inserted first
            return False
        except OperationalError as exc:  # SQLite busy is a lock; a refused write (no space, read-only) is not
            fault = environment_fault(exc, str(self.engine.url.database or self.engine.url))
            if fault is not None:
                raise fault from exc
            return False
        self._thread = threading.Thread(target=self._renew, name=f"lock-{self.name}", daemon=True)
        self._thread.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                with self.engine.begin() as con:
                    done = con.execute(
                        update(_LOCKS)
                        .where(_LOCKS.c.name == self.name, _LOCKS.c.owner == self.owner)
                        .values(expires_at=time.time() + self.lease_s)
                    )
                if done.rowcount == 0:
                    log.warning("lock %s: lease lost (taken over after it expired)", self.name)
                    return
            except OperationalError as exc:  # the database was busy: try again at the next tick
                log.info("lock %s: renewal failed (%s)", self.name, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for _ in range(50):
            try:
                with self.engine.begin() as con:
                    con.execute(delete(_LOCKS).where(_LOCKS.c.name == self.name, _LOCKS.c.owner == self.owner))
                return
            except OperationalError as exc:  # SQLite busy; the lease expires anyway
                if environment_fault(exc) is not None:
                    return  # a write the machine refuses will not succeed by retrying
                time.sleep(0.1)


@contextmanager
def job_lock(
    settings: Settings, catalog: Catalog, name: str, wait_s: float = 600.0, lease_s: float = LEASE_S
) -> Iterator[None]:
    """Hold the lock ``name`` for the block, waiting up to ``wait_s`` seconds for it.

    Args:
        settings: trajlake settings (``TRAJLAKE_HOME`` for the file-lock fallback).
        catalog: the catalog whose database holds the lock row (a ``SqlCatalog``).
        name: the job, e.g. ``assemble``.
        wait_s: how long to wait for another holder.
        lease_s: lease of the row, renewed while held.

    Raises:
        LockBusy: another run held the lock for ``wait_s`` seconds.
        EnvironmentFault: the catalog's database refuses the write (no space, a file-size limit, read-only):
            at once, never after waiting as for a lock.
    """
    deadline = time.monotonic() + wait_s
    if isinstance(catalog, SqlCatalog):
        engine = catalog.engine
        try:
            _METADATA.create_all(engine, checkfirst=True)
        except DatabaseError as exc:  # another process created it between the check and the create
            fault = environment_fault(exc, str(engine.url.database or engine.url))
            if fault is not None:
                raise fault from exc
        lock = _RowLock(engine, f"{settings.namespace}:{name}", lease_s)
        while not lock.try_acquire():
            crash_point("waiting_for_lock")
            if time.monotonic() > deadline:
                raise LockBusy(f"another `{name}` run holds the catalog lock {lock.name!r}; try again later")
            time.sleep(0.2)
        try:
            yield
        finally:
            lock.release()
        return
    path = settings.home_dir / f"{name}.lock"
    with open(path, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                crash_point("waiting_for_lock")
                if time.monotonic() > deadline:
                    raise LockBusy(f"{path}: another `{name}` run holds the lock; try again later") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
