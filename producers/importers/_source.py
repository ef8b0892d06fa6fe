"""Reading recorded runs: whole JSON files, JSON Lines record by record, and what a record is.

A JSON file is parsed whole (its memory is its size); a JSON Lines file is read one line at a
time, so a bad line is one quarantined record and memory is bounded by the longest line. Every
record carries the sha256 of its own bytes (the namespace of its session's ids) and where it is
in the file (``line 7``, ``trial t-3``), which a quarantine entry names.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.errors import ProducerError

#: Deepest nesting of lists/objects an imported file may have (real runs nest about ten levels).
MAX_JSON_DEPTH = 200


class ImportFormatError(ProducerError):
    """A recorded run cannot be imported: unknown, corrupt or truncated input (names the file and the reason)."""

    def __init__(self, path: Path | str, reason: str, position: str = "") -> None:
        reason = " ".join(reason.split())  # one line, whatever the cause quoted
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason
        self.position = position  # where in the file (``line 7``), when the error is one record's


@dataclass(frozen=True)
class SourceFile:
    """One recorded run (or one record of a multi-run file) as read: the sha256 of its bytes and the parsed JSON.

    Attributes:
        path: the file it came from.
        sha256: of the record's own bytes (a whole file, or one line of a JSON Lines file).
        data: the parsed JSON.
        position: where the record is in the file (``""`` for a whole file, ``"line 3"``, …).
    """

    path: Path
    sha256: str
    data: Any
    position: str = ""
    repaired: tuple[str, ...] = ()  # where unpaired surrogates were replaced (they cannot be UTF-8)

    def at(self, position: str, sha256: str, data: Any) -> SourceFile:
        """A record of this file at ``position``."""
        return SourceFile(self.path, sha256, data, position)


@dataclass(frozen=True)
class JsonLines:
    """A JSON Lines file, read lazily: :func:`iter_lines` yields its records."""

    path: Path
    first: Any  # the first record, parsed (what format detection looks at)

    def records(self) -> Iterator[SourceFile | ImportFormatError]:
        """Every non-empty line as a record, or the error that line is (a bad line never stops the rest)."""
        return iter_lines(self.path)


def open_regular(path: Path) -> io.BufferedReader:
    """``path`` opened for reading, if it is (or links to) a regular file.

    A FIFO, a socket or a device (``/dev/zero``, a terminal) is refused before anything is read
    from it: reading one would block for ever or never end. The check is made on the opened
    descriptor (opened without blocking), so the file cannot be swapped between check and read.

    Raises:
        ImportFormatError: missing, unreadable, or not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ImportFormatError(path, f"cannot read file ({exc.strerror or exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ImportFormatError(path, f"not a regular file ({_kind(mode)}): only recorded runs on disk are read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a file")


def read_bytes(path: Path) -> bytes:
    """The file's bytes.

    Raises:
        ImportFormatError: missing, unreadable, not a regular file, or empty.
    """
    try:
        with open_regular(path) as handle:
            raw = handle.read()
    except OSError as exc:
        raise ImportFormatError(path, f"cannot read file ({exc.strerror or exc})") from exc
    if not raw or raw.isspace():  # (no stripped copy: a run can be hundreds of MB)
        raise ImportFormatError(path, "file is empty")
    return raw


def parse_json(path: Path, raw: bytes, where: str = "") -> Any:
    """Parse JSON bytes, with errors that name the place (unpaired surrogates repaired: :func:`parse_record`).

    Raises:
        ImportFormatError: not UTF-8, not JSON, or nested deeper than :data:`MAX_JSON_DEPTH`.
    """
    return _loads(path, _decode(path, raw, where), where)


def _decode(path: Path, raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        prefix = f"{where}: " if where else ""
        raise ImportFormatError(path, f"{prefix}not UTF-8 text (byte {exc.start})") from exc


def _loads(path: Path, text: str, where: str) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if where:
            raise ImportFormatError(path, f"{where} is not valid JSON (truncated or corrupt?): {exc.msg}") from exc
        raise ImportFormatError(
            path, f"not valid JSON (truncated or corrupt?): {exc.msg} at line {exc.lineno}"
        ) from exc
    except RecursionError:  # the C parser recurses per nesting level
        prefix = f"{where}: " if where else ""
        raise ImportFormatError(path, f"{prefix}JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    check_nesting(path, data, where)
    return data


#: The escape a lone surrogate can only come from (searched in place: no lower-cased copy of the bytes).
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD]")


def parse_record(path: Path, raw: bytes, where: str = "") -> tuple[Any, tuple[str, ...]]:
    """Parse JSON bytes and replace every unpaired surrogate (a ``\\ud800`` escape) by U+FFFD.

    Returns:
        The data and the JSON paths of the strings that were repaired.

    Raises:
        ImportFormatError: as :func:`parse_json`.
    """
    data = parse_json(path, raw, where)
    if _SURROGATE_ESCAPE.search(raw) is None:  # a lone surrogate can only come from an escape
        return data, ()
    repaired: list[str] = []
    return _repair(data, "", repaired), tuple(repaired)


def _bad_text(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _fixed(text: str) -> str:
    return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)


def _repair(value: Any, where: str, repaired: list[str]) -> Any:
    """``value`` with its strings (keys too) made encodable; iterative, so depth costs no stack."""
    root: list[Any] = [value]
    stack: list[tuple[Any, Any, str]] = [(root, 0, where)]
    while stack:
        container, key, path = stack.pop()
        item = container[key]
        if isinstance(item, str):
            if _bad_text(item):
                repaired.append(path or "$")
                container[key] = _fixed(item)
        elif isinstance(item, dict):
            if any(_bad_text(k) for k in item):
                repaired.append(path or "$")
                item = container[key] = {_fixed(k): v for k, v in item.items()}
            stack.extend((item, k, f"{path}.{k}" if path else k) for k in item)
        elif isinstance(item, list):
            stack.extend((item, i, f"{path}[{i}]") for i in range(len(item)))
    return root[0]


def check_nesting(path: Path, data: Any, where: str = "") -> None:
    """Refuse ``data`` nested deeper than :data:`MAX_JSON_DEPTH` (walked without recursion).

    Raises:
        ImportFormatError: the nesting is deeper than the cap.
    """
    stack = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                prefix = f"{where}: " if where else ""
                raise ImportFormatError(path, f"{prefix}JSON nested deeper than {MAX_JSON_DEPTH} levels")
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))


def read_source(path: Path | str) -> SourceFile:
    """Read a recorded run: a JSON document, or (objects one per line) a lazily read JSON Lines file.

    A JSON Lines file is recognised by a first line that is a JSON object by itself with more lines
    after it, or, when the whole file is not JSON, by any line that is: so a file whose first line
    was cut still imports its other lines.

    Raises:
        ImportFormatError: the file is missing, unreadable, not UTF-8 or not valid JSON.
    """
    path = Path(path)
    first = _first_line_record(path)
    if first is not None:
        return SourceFile(path, _file_sha256(path), JsonLines(path, first))
    raw = read_bytes(path)
    digest = hashlib.sha256(raw).hexdigest()
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    lines_shaped = _lines_shaped(raw)
    try:
        text = _decode(path, raw, "")
        del raw  # one copy of a large run at a time: the bytes go before the text is parsed
        data = _loads(path, text, "")
        del text
        repaired: list[str] = []
        if surrogates:
            data = _repair(data, "", repaired)
        return SourceFile(path, digest, data, repaired=tuple(repaired))
    except ImportFormatError:
        if lines_shaped:
            record = next((r for r in iter_lines(path) if isinstance(r, SourceFile) and isinstance(r.data, dict)), None)
            if record is not None:
                return SourceFile(path, digest, JsonLines(path, record.data))
        raise


def _lines_shaped(raw: bytes) -> bool:
    """Whether ``raw`` starts with an object and has a line break inside its content (JSON Lines, maybe)."""
    first = re.search(rb"\S", raw)
    if first is None or raw[first.start() : first.start() + 1] != b"{":
        return False
    end = len(raw)
    while end and raw[end - 1 : end].isspace():
        end -= 1
    return raw.find(b"\n", first.start(), end) >= 0


def _file_sha256(path: Path) -> str:
    with open_regular(path) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _first_line_record(path: Path) -> Any | None:
    """The first line parsed, when it is a JSON object by itself and more lines follow (JSON Lines)."""
    try:
        with open_regular(path) as handle:
            first = b""
            for line in handle:
                if line.strip():
                    first = line
                    break
            if not first.lstrip().startswith(b"{"):
                return None
            if not any(line.strip() for line in handle):
                return None
    except (OSError, ImportFormatError):
        return None  # read_bytes reports it
    try:
        parsed = json.loads(first)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def iter_lines(path: Path) -> Iterator[SourceFile | ImportFormatError]:
    """The records of a JSON Lines file, one line at a time; a line that is not JSON is an error in its place."""
    with open_regular(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            raw = line.rstrip(b"\r\n")
            where = f"line {number}"
            try:
                data, repaired = parse_record(path, raw, where)
            except ImportFormatError as exc:
                exc.position = where
                yield exc
                continue
            yield SourceFile(path, hashlib.sha256(raw).hexdigest(), data, where, repaired)


def read_json_file(path: Path) -> Any | None:
    """A small companion JSON file (a report, a result), or None when it is absent.

    Raises:
        ImportFormatError: it exists but is not valid JSON.
    """
    if not path.is_file():
        return None
    return parse_record(path, read_bytes(path))[0]
