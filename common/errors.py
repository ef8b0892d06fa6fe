"""The one error tree: every error trajlake raises on purpose derives from :class:`TrajlakeError`.

Each package keeps its branch in its own ``errors`` module (``schemas.errors``,
``producers.errors``, ``warehouse.errors``, ``pipelines.errors``), rooted here. Two markers
say what a caller should do: a :class:`TransientError` may succeed when retried unchanged
(Dagster retries such asset failures; the CLI exits with :data:`EXIT_TRANSIENT`), a
:class:`TerminalError` will not until something is changed. The CLI catches only the root
and prints one red line.
"""

from __future__ import annotations

import errno
import re

#: Exit code of the CLI for a transient failure (``EX_TEMPFAIL``: try again later).
EXIT_TRANSIENT = 75
#: Exit code of the CLI for every other trajlake error.
EXIT_ERROR = 1


class TrajlakeError(Exception):
    """Root of every trajlake error; the CLI reports it as one red line."""


class TransientError(TrajlakeError):
    """Marker: retrying later, unchanged, may succeed (broker unreachable, commit conflict)."""


class TerminalError(TrajlakeError):
    """Marker: retrying will not help until something is changed."""


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is marked transient."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, TransientError):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


class ConfigError(TerminalError):
    """A setting is invalid (a ``TRAJLAKE_*`` variable, or ``TRAJLAKE_HOME`` that is not a directory)."""


class BrokerError(TerminalError):
    """The embedded broker could not be started, found or stopped."""


class BrokerNotRunning(BrokerError):
    """No embedded broker is running and no ``TRAJLAKE_KAFKA_BOOTSTRAP`` is set."""


class KafkaUnavailable(TransientError):
    """Kafka did not answer within the timeout."""


#: Exit code of the CLI for an environment fault: a file-size limit, no space, a read-only or forbidden path
#: (``EX_IOERR``).
EXIT_ENVIRONMENT = 74
#: Exit code of the CLI for a corrupt or truncated table metadata file (``EX_DATAERR``).
EXIT_CORRUPT = 65


class EnvironmentFault(TerminalError):
    """The machine refused a write or a read that trajlake needs: a file-size limit, no space, a read-only
    file system, no permission, a corrupt file. Never retried (it is not a lock), reported as one line naming
    the cause and the path.

    Attributes:
        cause: what happened, in words (``file size limit reached (RLIMIT_FSIZE)``).
        path: the file or directory it happened to.
    """

    exit_code = EXIT_ENVIRONMENT

    def __init__(self, cause: str, path: str) -> None:
        super().__init__(f"{cause}: {path}")
        self.cause, self.path = cause, path


class CorruptMetadata(EnvironmentFault):
    """A table metadata file cannot be parsed (truncated, overwritten, not JSON)."""

    exit_code = EXIT_CORRUPT


_ERRNO_CAUSES = {
    errno.EFBIG: "file size limit reached (RLIMIT_FSIZE, `ulimit -f`)",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
#: The same faults as libraries word them without an errno (pyarrow, SQLite).
_TEXT_CAUSES = [
    ("file too large", errno.EFBIG),
    ("no space left on device", errno.ENOSPC),
    ("disk quota exceeded", errno.EDQUOT),
    ("read-only file system", errno.EROFS),
    ("attempt to write a readonly database", errno.EROFS),
    ("database or disk is full", errno.ENOSPC),
    ("permission denied", errno.EACCES),
]
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]")
_PATH_IN_TEXT = re.compile(r"""['"]((?:/|[a-z][a-z0-9+.-]*://)[^'"]+)['"]""")


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it was raised from or during (``__cause__``, ``__context__``, SQLAlchemy's ``orig``)."""
    seen: list[BaseException] = []
    todo = [error]
    while todo and len(seen) < 32:
        current = todo.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        for nxt in (getattr(current, "orig", None), current.__cause__, current.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return seen


def _file_size_limit() -> int | None:
    """The soft RLIMIT_FSIZE in bytes, or ``None`` when unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def environment_fault(error: BaseException, path: str | None = None) -> EnvironmentFault | None:
    """The environment fault ``error`` is, or was raised from; ``None`` when it is something else.

    Args:
        error: any exception (an ``OSError``, pyarrow's wording of one, SQLite's, or an error raised from them).
        path: what to name when the error itself names no path (the catalog file for SQLite's errors).
    """
    for current in _chain(error):
        if isinstance(current, EnvironmentFault):
            return current
    for current in _chain(error):
        text = str(current)
        number = current.errno if isinstance(current, OSError) else None
        if number is None and (found := _ERRNO_IN_TEXT.search(text)):
            number = int(found.group(1))
        if number not in _ERRNO_CAUSES:
            lowered = text.lower()
            number = next((n for words, n in _TEXT_CAUSES if words in lowered), None)
            if number is None and "disk i/o error" in lowered:
                limit = _file_size_limit()  # SQLite says only "disk I/O error" when a write is refused
                if limit is None:
                    return EnvironmentFault("disk I/O error (a full disk or a failing device)", path or "?")
                number = errno.EFBIG
        if number not in _ERRNO_CAUSES:
            continue
        where = getattr(current, "filename", None) if isinstance(current, OSError) else None
        if where is None and (found := _PATH_IN_TEXT.search(text)):
            where = found.group(1)
        cause = _ERRNO_CAUSES[number]
        if number == errno.EFBIG and (limit := _file_size_limit()) is not None:
            cause = cause.replace("RLIMIT_FSIZE,", f"RLIMIT_FSIZE {limit:,} bytes,")
        return EnvironmentFault(cause, str(where or path or "?"))
    return None
