"""Searching long texts without a copy of their size: Aho-Corasick in windows, sizes and runs judged in place.

``ahocorasick_rs`` maps every character of its haystack to its byte offset, eight bytes per character:
a 24 MB tool output searched whole costs 190 MB for the duration of the call, and lower-casing it for
the search one more copy. A text longer than :data:`WINDOW_CHARS` is searched window by window (each
window lower-cased on its own), the windows overlapping by the longest pattern less one, and the
matches are exactly those of one search over the whole text:

* overlapping search: every match lies whole in the window where it starts, so each is kept once, in
  the window holding its start;
* non-overlapping search (standard or leftmost-longest): the automaton restarts after each match, so a
  search from any position gives the matches of a whole-text search from there on; a window's matches
  that start before its end are taken, and the next window starts after the last of them.

Windows are lower-cased as slices of :func:`lower_ascii` of the whole text would be (one length-changing
character anywhere makes every window use the ASCII-only table, as the whole text would).
"""

from __future__ import annotations

import string
from typing import Any

#: Texts longer than this are searched in windows of this many characters.
WINDOW_CHARS = 1 << 18
#: Characters per slice when a long text is checked piece by piece.
CHUNK_CHARS = 1 << 18
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def lower_ascii(text: str) -> str:
    """``text`` lower-cased with every position kept (a few non-ASCII characters lower-case to two)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


def _lowering(text: str) -> Any:
    """How the windows of a long ``text`` are lower-cased so that they are slices of ``lower_ascii(text)``."""
    if text.isascii():
        return str.lower
    keeps_length = all(
        len(piece.lower()) == len(piece)
        for piece in (text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS))
    )
    return str.lower if keeps_length else (lambda piece: piece.translate(_ASCII_LOWER))


def find_matches(
    automaton: Any, text: str, longest: int, *, lower: bool = False, overlapping: bool = False
) -> list[tuple[int, int, int]]:
    """``automaton.find_matches_as_indexes`` over ``text`` (over ``lower_ascii(text)`` with ``lower``).

    Args:
        automaton: an ``ahocorasick_rs.AhoCorasick``.
        text: the haystack; searched in windows when longer than :data:`WINDOW_CHARS`.
        longest: the length of the automaton's longest pattern (the windows' overlap is one less).
        lower: search the ASCII-lower-cased text (positions are the same).
        overlapping: every match, overlapping ones included.
    """
    if len(text) <= WINDOW_CHARS:
        return list(automaton.find_matches_as_indexes(lower_ascii(text) if lower else text, overlapping=overlapping))
    lowering = _lowering(text) if lower else None
    step = max(WINDOW_CHARS, longest)
    reach = step + max(longest, 1) - 1
    found: list[tuple[int, int, int]] = []
    position = 0
    while position < len(text):
        window = text[position : position + reach]
        if lowering is not None:
            window = lowering(window)
        last = position + reach >= len(text)
        limit = len(text) if last else position + step
        resume = limit
        for index, start, end in automaton.find_matches_as_indexes(window, overlapping=overlapping):
            start, end = start + position, end + position
            if start >= limit:
                if overlapping:
                    continue
                break
            found.append((index, start, end))
            resume = max(resume, end)
        del window
        if last:
            break
        position = resume if not overlapping else limit
    return found
