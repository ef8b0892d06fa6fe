"""Input-derived text made safe to print: the one sanitizer every command's output goes through.

Trajectories, imported runs, verdict files and query results hold what agents, tools and other
people wrote. Printed as they are, a few characters act on the terminal instead of being shown:
C0 controls (``ESC`` starts colour, cursor, title, OSC 52 clipboard and OSC 8 hyperlink
sequences; ``CR`` and ``BS`` overwrite what was printed), ``DEL``, the C1 controls (``CSI``,
``OSC`` as single bytes), the Unicode bidirectional controls (``U+202E`` shows ``exe.txt`` for
``txt.exe``), the line and paragraph separators, and lone surrogates (which cannot be encoded
and would end the command with a traceback). :func:`printable` shows each of them as a visible
escape (``\\x1b``, ``\\r``, ``\\u202e``), so the terminal only ever receives printable text and
a value cannot fake the lines around it.

The CLI's consoles apply it to every text segment they write (``trajlake.console``); ``show``,
``sql`` tables, the HTML report and the importers' messages call it for the values they format.
"""

from __future__ import annotations

import re
from typing import Any

#: Characters never written as they are: C0 (newline and tab are kept where asked), DEL, C1,
#: the bidirectional controls, the line/paragraph separators, and surrogates (unencodable).
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_KEEP_MULTILINE = frozenset("\n\t")


def _visible(char: str) -> str:
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(value: Any, *, multiline: bool = True) -> str:
    """``value`` as text that does nothing to a terminal but show itself.

    Args:
        value: anything (``None`` is the empty string; others through ``str``).
        multiline: keep newlines and tabs as they are (a command's output); else show them as
            ``\\n`` and ``\\t`` too (a table cell, a one-line message).

    Returns:
        The text with every character of :data:`UNSAFE` (except newline and tab when
        ``multiline``) replaced by a visible escape; ``\\r\\n`` line ends count as newlines.
    """
    text = "" if value is None else str(value)
    if multiline:
        text = text.replace("\r\n", "\n")

    def visible(match: re.Match[str]) -> str:
        char = match.group(0)
        return char if multiline and char in _KEEP_MULTILINE else _visible(char)

    return UNSAFE.sub(visible, text)


def is_printable(text: str, *, multiline: bool = True) -> bool:
    """Whether ``text`` holds no character :func:`printable` would escape."""
    found = UNSAFE.findall(text)
    return all(multiline and char in _KEEP_MULTILINE for char in found)


__all__ = ["UNSAFE", "is_printable", "printable"]
