"""Which errors are environment faults, as the libraries trajlake uses raise them, and the lock that no longer waits."""

from __future__ import annotations

import errno
import resource
import sqlite3
import time
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from common.errors import EXIT_ENVIRONMENT, EnvironmentFault, TerminalError, environment_fault
from common.settings import Settings
from warehouse.locks import job_lock


def test_an_oserror_names_its_cause_and_file() -> None:
    fault = environment_fault(OSError(errno.ENOSPC, "No space left on device", "/lake/hot/x.parquet"))
    assert fault is not None and fault.exit_code == EXIT_ENVIRONMENT
    assert str(fault) == "no space left on the device: /lake/hot/x.parquet"
    assert str(environment_fault(OSError(errno.EROFS, "Read-only file system", "/lake"))) == (
        "read-only file system: /lake"
    )


def test_wordings_without_an_errno_are_recognised_through_the_chain() -> None:
    try:
        try:
            raise OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
        except OSError as inner:
            raise TerminalError("cannot write the export into /out") from inner
    except TerminalError as outer:
        fault = environment_fault(outer, "/home")
    assert fault is not None and fault.cause == "no space left on the device" and fault.path == "/home"
    readonly = sqlite3.OperationalError("attempt to write a readonly database")
    assert str(environment_fault(readonly, "/lake/catalog.db")) == "read-only file system: /lake/catalog.db"
    path_in_text = OSError("Failed to open local file '/lake/hot/d.parquet'. Detail: [errno 13] Permission denied")
    assert str(environment_fault(path_in_text)) == "permission denied: /lake/hot/d.parquet"


def test_other_errors_are_no_fault() -> None:
    for error in [
        ValueError("bad value"),
        OSError(errno.ECONNREFUSED, "refused"),
        sqlite3.OperationalError("database is locked"),
    ]:
        assert environment_fault(error) is None


def test_a_disk_io_error_under_a_file_size_limit_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (4096, resource.RLIM_INFINITY))
    fault = environment_fault(sqlite3.OperationalError("disk I/O error"), "/lake/catalog.db")
    assert str(fault) == "file size limit reached (RLIMIT_FSIZE 4,096 bytes, `ulimit -f`): /lake/catalog.db"


def test_the_catalog_lock_raises_a_refused_write_at_once(tmp_path: Path, settings: Settings) -> None:
    path = tmp_path / "catalog.db"
    SqlCatalog("t", uri=f"sqlite:///{path}", warehouse=f"file://{tmp_path}", init_catalog_tables="true")
    read_only = SqlCatalog(
        "t", uri=f"sqlite:///file:{path}?mode=ro&uri=true", warehouse=f"file://{tmp_path}", init_catalog_tables="false"
    )
    started = time.monotonic()
    with pytest.raises(EnvironmentFault, match="read-only file system"):
        with job_lock(settings, read_only, "assemble", wait_s=30):
            pass
    assert time.monotonic() - started < 5  # not the 30 s a busy lock would be waited for
