"""The decoded view: text with URL escapes, HTML entities or JSON/Python escapes is also read decoded.

``clone=https%3A%2F%2Fdeploy%3Apw%40host``, ``{"\\u0070assword": "…"}``, ``pass&#119;ord=…`` hide a secret
from rules that read raw text. Each line holding an escape is decoded with a map from every decoded
character back to the characters it came from; the other layers run on the decoded line, and whatever
they replace there is replaced in the original (the whole escape sequences it came from), so the text
keeps its encoding and only the secret goes.
"""

from __future__ import annotations

import difflib
import html.entities
import re
from collections.abc import Callable

# One escape: a run of %XX (UTF-8 bytes), an HTML character reference, a JSON/Python \\uXXXX, \\xXX.
ESCAPE = re.compile(
    r"(?:%[0-9A-Fa-f]{2})+|&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"
    r"|\\u[0-9A-Fa-f]{4}(?:\\u[0-9A-Fa-f]{4})?|\\x[0-9A-Fa-f]{2}"
)
# Lines longer than this are not decoded (minified data; the raw rules still run on them).
MAX_LINE = 1 << 15
_ENTITIES = html.entities.html5


def _decode_escape(escape: str) -> str | None:
    if escape[0] == "%":
        data = bytes(int(escape[i + 1 : i + 3], 16) for i in range(0, len(escape), 3))
        return data.decode("utf-8", errors="replace")
    if escape[0] == "&":
        if escape[1] == "#":
            code = int(escape[3:-1], 16) if escape[2] in "xX" else int(escape[2:-1])
            return chr(code) if 0 < code < 0x110000 and not 0xD800 <= code < 0xE000 else None
        return _ENTITIES.get(escape[1:])
    if escape[1] == "x":
        return chr(int(escape[2:], 16))
    units = [int(escape[i + 2 : i + 6], 16) for i in range(0, len(escape), 6)]
    if len(units) == 2 and 0xD800 <= units[0] < 0xDC00 <= units[1] < 0xE000:
        return chr(0x10000 + ((units[0] - 0xD800) << 10) + (units[1] - 0xDC00))
    return "".join(_unit(u) for u in units)


def _unit(unit: int) -> str:
    return "\ufffd" if 0xD800 <= unit < 0xE000 else chr(unit)


def decoded_view(line: str) -> tuple[str, list[int], list[int]] | None:
    """``line`` decoded, with each decoded character's original start and end; None when nothing decodes."""
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    position = 0
    changed = False
    for match in ESCAPE.finditer(line):
        decoded = _decode_escape(match.group(0))
        if decoded is None:
            continue
        for index in range(position, match.start()):
            pieces.append(line[index])
            starts.append(index)
            ends.append(index + 1)
        for char in decoded:
            pieces.append(char)
            starts.append(match.start())
            ends.append(match.end())
        position = match.end()
        changed = True
    if not changed:
        return None
    for index in range(position, len(line)):
        pieces.append(line[index])
        starts.append(index)
        ends.append(index + 1)
    return "".join(pieces), starts, ends


_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_ENTITY = re.compile(r"&#?[A-Za-z0-9]{1,31};")


def has_escape(text: str) -> bool:
    """A cheap test: may ``text`` hold an escape this layer decodes (literal checks first, at C speed)."""
    if "\\u" in text or "\\x" in text:
        return True
    return ("%" in text and _PERCENT.search(text) is not None) or ("&" in text and _ENTITY.search(text) is not None)


def decoded_spans(text: str, redact: Callable[[str], str], may_matter: Callable[[str], bool]) -> list[tuple[int, int]]:
    """Spans of ``text`` whose decoded form ``redact`` changes (see the module docstring); only lines whose
    decoded form ``may_matter`` (a pre-check) are redacted."""
    spans: list[tuple[int, int]] = []
    offset = 0
    for line in text.splitlines(keepends=True):
        if len(line) <= MAX_LINE and has_escape(line) and may_matter(decode_all(line)):
            view = decoded_view(line)
            if view is not None:
                decoded, starts, ends = view
                out = redact(decoded)
                if out != decoded:
                    matcher = difflib.SequenceMatcher(None, decoded, out, autojunk=False)
                    for tag, i1, i2, _, _ in matcher.get_opcodes():
                        if tag in ("replace", "delete") and i2 > i1:
                            spans.append((offset + starts[i1], offset + ends[i2 - 1]))
                        elif tag == "insert" and 0 < i1 < len(starts):
                            spans.append((offset + starts[i1], offset + ends[i1]))
        offset += len(line)
    return _close_gaps(spans, text)


def _close_gaps(spans: list[tuple[int, int]], text: str) -> list[tuple[int, int]]:
    """Spans with the short gaps between them closed: a diff can keep a character of the secret that happens
    to equal one of the marker's (``[REDACTED]T[REDACTED]``)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start - merged[-1][1] <= 3 and not any(c.isspace() for c in text[merged[-1][1] : start]):
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def decode_all(text: str) -> str:
    """Every escape of ``text`` decoded (for a pre-check: may the decoded text hold a secret)."""
    return ESCAPE.sub(lambda m: _decode_escape(m.group(0)) or m.group(0), text)
