"""Writing the report: the overview, one page per session, the search index, in a directory that holds only a report."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from common.text import printable
from pipelines.errors import ReportError
from pipelines.export._files import (
    _ExclusiveFile,
    _open_out_dir,
    _remove_stale_temporaries,
    _write_file,
    open_subdirectory,
)
from pipelines.report.data import FILTERS, Overview, define_scope, export_sessions, overview, session_index

if TYPE_CHECKING:
    import duckdb

    from common.progress import Progress
    from warehouse.lakehouse import Lakehouse


_SAFE = re.compile(r"[a-z0-9._-]{1,96}")
#: Values a filter of the search lists at most (the most common; the free-text search finds the rest).
FILTER_VALUES = 1000
#: Sessions whose pages are read with one query per table (memory holds this many sessions' steps).
_PAGES_PER_READ = 100


@dataclass
class ReportStats:
    """What a report holds and where it is."""

    index: Path
    sessions: int
    flagged: int
    pages: int
    seconds: float


def page_name(session_id: str) -> str:
    """The file name of a session's page, one per session whatever the ids.

    A plain id (lower-case letters, digits, ``.``, ``_``, ``-``; not starting with ``.`` or ``s-``) is
    its own name; any other id — with upper case (two ids differing in case share a file on a
    case-insensitive file system), a ``/``, or one that looks like a digest name — is named by
    the sha256 of the id (``s-`` and 64 hex digits). Plain names never start with ``s-``, so no
    id can take another's page.
    """
    if _SAFE.fullmatch(session_id) and not session_id.startswith((".", "s-")):
        return f"{session_id}.html"
    return f"s-{hashlib.sha256(session_id.encode()).hexdigest()}.html"


#: Every name a report writes into its directory, and the names of its pages and index shards.
_REPORT_NAMES = frozenset({"index.html", "sessions"})
_PAGE = re.compile(r"[A-Za-z0-9._-]{1,130}\.html|index-\d{5}\.js|search\.js")


def _write_page(dir_fd: int, name: str, text: str) -> None:
    """Write a page or shard as the export writes its files (a temporary name created exclusively, never
    through a planted link, then renamed), without an fsync per file: a report is rewritten by running
    it again, and thousands of fsyncs were most of its time."""
    out = _ExclusiveFile(dir_fd, name)
    try:
        out.handle.write(text)
        out.handle.close()
        os.replace(out.tmp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        out.discard()
        raise


def _write_index(
    con: duckdb.DuckDBPyConnection, pages_fd: int, page_of: dict[str, str]
) -> tuple[int, dict[str, list[tuple[str, int]]]]:
    """Write the session index (every session in scope, in shards) and the search script.

    Returns:
        The number of shards, and for each filter of :data:`pipelines.report.data.FILTERS` its values
        with their session counts, most sessions first.
    """
    from pipelines.report.search import SEARCH_JS, shard_rows, shard_text

    counts: dict[str, Counter[str]] = {name: Counter() for name in FILTERS}
    shards = 0
    for rows in session_index(con):
        for row in rows:
            for name in ("family", "outcome", "origin", "agent"):
                if row.get(name):
                    counts[name][printable(row[name], multiline=False)] += 1
            counts["flag"].update({printable(f["flag"], multiline=False) for f in row.get("flags") or []})
        _write_page(pages_fd, f"index-{shards:05d}.js", shard_text(shards, shard_rows(rows, page_of)))
        shards += 1
    _write_page(pages_fd, "search.js", SEARCH_JS)
    filters = {name: sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:FILTER_VALUES] for name, c in counts.items()}
    return shards, filters


def _check_is_a_report(root: Path, dir_fd: int) -> None:
    """Refuse a directory holding anything but an earlier report: its files are replaced, its old pages removed.

    Raises:
        ReportError: the directory holds other files.
    """
    others = sorted(name for name in os.listdir(dir_fd) if name not in _REPORT_NAMES and not name.startswith("."))
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise ReportError(
            f"refusing to write the report into {root}: it holds files that are no report ({shown}); "
            "choose a new or empty directory"
        )


def _remove_earlier_pages(pages_fd: int, with_page: set[str]) -> None:
    """Remove the pages of an earlier report that this one does not have (``with_page``: its sessions)."""
    keep = {page_name(s) for s in with_page} | {"search.js"}
    for old in os.listdir(pages_fd):
        if _PAGE.fullmatch(old) and old not in keep:
            os.unlink(old, dir_fd=pages_fd)


def _write_session_pages(
    con: duckdb.DuckDBPyConnection, pages_fd: int, data: Overview, generated: datetime, progress: Progress | None
) -> dict[str, str]:
    """Write the page of every session ``data`` lists, read ``_PAGES_PER_READ`` at a time; their page names.

    Raises:
        ReportError: two sessions would share one page (a sha256 collision).
    """
    from pipelines.report.html import session_html
    from pipelines.report.inspect import load_sessions

    listed = [str(row["session_id"]) for row in data.listed]
    page_of = {session_id: page_name(session_id) for session_id in listed}
    if len(set(page_of.values())) != len(page_of):  # a sha256 collision: never one page for two sessions
        raise ReportError("two sessions would share one report page; report them separately")
    done = 0
    for start in range(0, len(listed), _PAGES_PER_READ):
        for detail in load_sessions(con, listed[start : start + _PAGES_PER_READ]):
            _write_page(pages_fd, page_of[detail.session_id], session_html(detail, "../index.html", generated))
            done += 1
            if progress is not None:
                progress(done, len(listed), "pages")
    return page_of


def write_report(
    lake: Lakehouse,
    out_dir: Path | str,
    *,
    export_dir: Path | str | None = None,
    max_pages: int | None = None,
    progress: Progress | None = None,
) -> ReportStats:
    """Write the report into ``out_dir`` (created; an earlier report there is replaced).

    Args:
        lake: the lakehouse.
        out_dir: the report's directory.
        export_dir: report on the sessions of this export (its directory) instead of the lakehouse.
        max_pages: session pages at most (default ``TRAJLAKE_REPORT_MAX_SESSIONS``, from the lakehouse's settings).
        progress: told of each session page written.

    Raises:
        ReportError: ``out_dir`` is refused (a system directory, ``$HOME`` itself, the lakehouse, a
            directory holding other files than a report), is not a directory or cannot be written, or
            ``export_dir`` is not an export.
    """
    from pipelines.report.html import overview_html

    started = time.monotonic()
    generated = datetime.now(UTC)
    limit = lake.settings.report_max_sessions if max_pages is None else max_pages
    manifest, ids = (None, None)
    if export_dir is not None:
        manifest, ids = export_sessions(Path(export_dir).expanduser().resolve())
    # where an export may write, a report may (never a system directory, $HOME itself or the
    # lakehouse), with the same exclusive, no-follow files; and only over an earlier report
    root, root_fd = _open_out_dir(out_dir, lake.locations, ReportError, "write the report")
    pages_fd = -1
    con = None
    try:
        _check_is_a_report(root, root_fd)
        pages_fd = open_subdirectory(root_fd, "sessions")
        _remove_stale_temporaries(pages_fd)
        con = lake.views()
        define_scope(con, ids)
        scope = f"export {manifest.get('export_id')} ({manifest.get('format')})" if manifest else "the lakehouse"
        data = overview(con, scope, limit)
        data.export = manifest
        with_page = {row["session_id"] for row in data.listed}
        _remove_earlier_pages(pages_fd, with_page)
        page_of = _write_session_pages(con, pages_fd, data, generated, progress)
        data.index_shards, data.filters = _write_index(con, pages_fd, page_of)
        index = root / "index.html"
        _write_file(
            root_fd,
            index.name,
            overview_html(data, lambda s: f"sessions/{page_name(s)}" if s in with_page else None, generated),
        )
    except OSError as exc:
        planted = exc.errno in (errno.ELOOP, errno.ENOTDIR)  # O_NOFOLLOW | O_DIRECTORY on a link or a file
        reason = "its sessions is a symlink or a file, not a directory" if planted else exc.strerror or exc
        raise ReportError(f"cannot write the report into {root}: {reason}") from exc
    finally:
        if con is not None:
            con.close()
        if pages_fd >= 0:
            os.close(pages_fd)
        os.close(root_fd)
    return ReportStats(
        index=index,
        sessions=int(data.totals.get("sessions") or 0),
        flagged=data.flagged_total,
        pages=len(data.listed),
        seconds=time.monotonic() - started,
    )
