"""Layer 1: the secret values the host injected, and the forms a sandbox can turn them into.

The fleet registers every per-task secret it hands a sandbox (:func:`register_secret_values`). Each
value is matched exactly, and so are the transforms an agent can apply with standard tools: reversed
(``rev``), upper, lower or swapped case (``tr``), ROT13, hex (``xxd -p``), base64 in each of its three
alignments inside a longer stream, standard and URL-safe, with or without padding (``base64``), and
any of these broken up by whitespace or escaped newlines (``fold -w N``, ``base64 -w N``, one
character per line). All variants of all values sit in one Aho-Corasick automaton: a string costs one
pass, plus one over its whitespace-free form, whatever the number of values.

Not covered: transforms that do not keep a contiguous run of the value's characters (a hash of it,
encryption, ``xxd``'s default dump with offsets, every other character, arithmetic on it).
"""

from __future__ import annotations

import base64
import codecs
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable

import ahocorasick_rs

from producers.redact.scan import find_matches

# Bound on remembered values: a host registers one set per sandbox; the oldest are forgotten first.
MAX_SECRET_VALUES = 4096
# Shorter values would match ordinary text; the fleet's tokens are 32 hex digits.
MIN_SECRET_VALUE_LEN = 8
# Values matched across whitespace (``fold``): shorter ones would be found spread over ordinary words.
MIN_FOLDED_LEN = 12
# Whitespace and the escapes of line breaks in JSON text: what ``fold`` and ``base64 -w`` insert.
GAPS = re.compile(r"\s+|\\[nrt]")
_ESCAPES = re.compile(r"\\[nrt]")

_URL_SAFE = str.maketrans("+/", "-_")

_values_lock = threading.Lock()
_secret_values: OrderedDict[str, None] = OrderedDict()
# One automaton over every variant of the registered values, rebuilt when they change.
_automaton: tuple[ahocorasick_rs.AhoCorasick, list[bool], int] | None = None
# Bumped whenever the registered values change: caches of verdicts that depend on them key on it.
_generation = 0


def generation() -> int:
    """A number that changes whenever the registered values do."""
    return _generation


def variants(value: str) -> set[str]:
    """The forms of ``value`` to redact: itself and its reversible transforms (at least 8 characters each)."""
    data = value.encode()
    found = {value, value[::-1], value.upper(), value.lower(), value.swapcase(), codecs.encode(value, "rot13")}
    found |= {data.hex(), data.hex().upper()}
    for shift in range(3):
        # inside a longer stream the value starts ``shift`` bytes into a 3-byte group: only the groups
        # holding nothing but the value's bytes encode the same whatever surrounds it
        encoded = base64.b64encode(b"\0" * shift + data).decode()
        first, last = -(-shift // 3), (shift + len(data)) // 3
        clean = encoded[4 * first : 4 * last]
        found |= {clean, clean.translate(_URL_SAFE)}
    return {v for v in found if len(v) >= MIN_SECRET_VALUE_LEN}


def register_secret_values(values: Iterable[str]) -> None:
    """Remember secret values this host injected (per-task tokens), to redact them wherever they appear.

    Args:
        values: the secret strings; those shorter than ``MIN_SECRET_VALUE_LEN`` are ignored. The
            ``MAX_SECRET_VALUES`` most recent are kept.
    """
    global _automaton, _generation
    with _values_lock:
        for value in values:
            if isinstance(value, str) and len(value) >= MIN_SECRET_VALUE_LEN:
                _secret_values[value] = None
                _secret_values.move_to_end(value)
        while len(_secret_values) > MAX_SECRET_VALUES:
            _secret_values.popitem(last=False)
        _automaton = None
        _generation += 1


def forget_secret_values(values: Iterable[str]) -> None:
    """Stop redacting ``values`` specially (the session that used them has ended and its events are sent)."""
    global _automaton, _generation
    with _values_lock:
        for value in values:
            _secret_values.pop(value, None)
        _automaton = None
        _generation += 1


def registered_variants() -> list[str]:
    """Every form of every registered value (what a vectorized pre-check looks for)."""
    with _values_lock:
        values = list(_secret_values)
    return sorted({v for value in values for v in variants(value)})


def _injected() -> tuple[ahocorasick_rs.AhoCorasick, list[bool], int] | None:
    """The automaton over all variants, per pattern whether it may match across whitespace, the longest's length."""
    global _automaton
    if not _secret_values:
        return None
    automaton = _automaton
    if automaton is None:
        with _values_lock:
            patterns: dict[str, bool] = {}
            for value in _secret_values:
                for form in variants(value):
                    patterns[form] = patterns.get(form, False) or len(value) >= MIN_FOLDED_LEN
            if patterns:
                # leftmost-longest: a value containing another is removed whole
                built = ahocorasick_rs.AhoCorasick(list(patterns), matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_LONGEST)
                automaton = (built, list(patterns.values()), max(map(len, patterns)))
            _automaton = automaton
    return automaton


def injected_spans(text: str) -> list[tuple[int, int]]:
    """Where registered values (in any of their forms) occur in ``text``, as sorted ``(start, end)`` spans."""
    found = _injected()
    if found is None or not text:
        return []
    automaton, foldable, longest = found
    spans = [(start, end) for _, start, end in find_matches(automaton, text, longest)]
    compact = GAPS.sub("", text)
    if len(compact) != len(text):
        hits = [(s, e) for index, s, e in find_matches(automaton, compact, longest) if foldable[index]]
        if hits:
            kept: list[int] = []  # the position in ``text`` of each character of ``compact``
            position = 0
            for gap in GAPS.finditer(text):
                kept.extend(range(position, gap.start()))
                position = gap.end()
            kept.extend(range(position, len(text)))
            spans += [(kept[s], kept[e - 1] + 1) for s, e in hits]
    return merge_spans(spans)


def may_hold_injected(text: str) -> bool:
    """Whether a registered value, in any form, may occur in ``text`` (a cheap pre-check)."""
    found = _injected()
    if found is None:
        return False
    automaton, _, longest = found
    if find_matches(automaton, text, longest):
        return True
    # removes at least what GAPS does (a pre-check may over-approximate), at C speed
    compact = "".join(text.split())
    if "\\" in compact:
        compact = _ESCAPES.sub("", compact)
    return bool(find_matches(automaton, compact, longest))


def merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping spans covering the same characters."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def replace_spans(text: str, spans: list[tuple[int, int]], marker: str) -> str:
    """``text`` with each of the sorted, non-overlapping ``spans`` replaced by ``marker``."""
    if not spans:
        return text
    pieces: list[str] = []
    position = 0
    for start, end in spans:
        pieces += [text[position:start], marker]
        position = end
    pieces.append(text[position:])
    return "".join(pieces)
