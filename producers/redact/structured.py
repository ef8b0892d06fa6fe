"""Redaction of structured values: events, export records, JSON text, Arrow columns.

Structured values are redacted as values, never as serialized text: a JSON string (tool ``arguments``)
is parsed, its string values (and the values of secret-named keys) redacted, and re-serialized only
when something changed, so it stays valid JSON with the same structure.
"""

from __future__ import annotations

import bisect
import itertools
import json
from typing import Any

import pyarrow as pa

from producers.errors import RedactionError
from producers.redact.context import PGPASS
from producers.redact.decode import ESCAPE, decode_all, has_escape
from producers.redact.formats import REDACTED
from producers.redact.names import literal_is_secret, name_strength
from producers.redact.text import (
    CASED_TRIGGERS,
    LOWER_TRIGGERS,
    MAX_ENCODED_RUNS,
    active_layers,
    bare_body_spans,
    encoded_runs,
    may_contain_secret,
    redact_text,
    run_at_hides_secret,
    trigger_matches,
)
from producers.redact.tokens import drop_token_ids, has_token_ids, is_model_call, redact_tokens
from producers.redact.values import GAPS, _values_lock, generation, may_hold_injected, registered_variants
from producers.redact.vendor import vendor_spans

# What a vectorized pre-check looks for besides triggers: a run that may be encoded (base64, hex, key bodies).
_RUN_OR_BODY = r"[A-Za-z0-9+/_-]{20,}"

# Strings longer than this are pre-checked one by one (:func:`may_contain_secret`), not joined with the others.
LONG_STRING = 1 << 20

# Values nested deeper are not walked: JSON text that deep is redacted by the text rules (which keep it
# valid JSON), a Python value that deep is refused (``RedactionError``); never a RecursionError, never a leak.
MAX_DEPTH = 200


class _TooDeep(Exception):
    pass


def _secret_entry(key: Any, item: str) -> bool:
    """A dict entry whose key names a secret and whose string value is a literal one."""
    strength = name_strength(key) if isinstance(key, str) and "context" in active_layers() else 0
    return bool(strength) and literal_is_secret(strength, item, quoted=True, line_value=False, env_style=False)


def _redact_parsed(value: Any, depth: int, suspects: set[int] | None = None) -> Any:
    """Redact inside ``value``; with ``suspects``, only strings whose ``id`` is in it can hold a secret."""
    if type(value) is str:
        if suspects is not None and id(value) not in suspects:
            return value
        return _redact_json_text(value, depth + 1)
    if depth > MAX_DEPTH:
        raise _TooDeep
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if type(key) is str and (suspects is None or id(key) in suspects):
                key = _redacted_key(key, depth, out)
            if type(item) is str and _secret_entry(key, item):
                out[key] = REDACTED
            else:
                out[key] = _redact_parsed(item, depth + 1, suspects)
        if is_model_call(value):
            return _redact_call(value, out)
        return out
    if isinstance(value, list | tuple):
        return type(value)(_redact_parsed(item, depth + 1, suspects) for item in value)
    if isinstance(value, str):
        return _redact_json_text(str(value), depth + 1)
    return value


def _redacted_key(key: str, depth: int, taken: dict[Any, Any]) -> str:
    """A dict key with its secrets redacted (an attribute named after a token); kept apart from the keys before it."""
    out = _redact_json_text(key, depth + 1)
    if out == key:
        return key
    unique, n = out, 1
    while unique in taken:
        n += 1
        unique = f"{out}#{n}"
    return unique


def _redact_call(call: dict[Any, Any], out: dict[Any, Any]) -> dict[Any, Any]:
    """A model call: its token strings redacted as the text they spell; token ids dropped if its text changed."""
    tokens = call.get("completion_tokens_text")
    redacted = redact_tokens(tokens, redact_text) if isinstance(tokens, list) else None
    if redacted is not None:
        out["completion_tokens_text"] = redacted
    if (redacted is not None or out != call) and has_token_ids(call):
        return drop_token_ids(out)
    return out


def redact_json_text(text: str) -> str:
    """Redact a string that may hold JSON: parsed values when it is JSON, text rules otherwise.

    The result of a JSON input is still valid JSON with the same structure (keys, nesting,
    types); it is re-serialized only when something was redacted, otherwise returned as is.
    """
    return _redact_json_text(text, 0)


def _redact_json_text(text: str, depth: int) -> str:
    if not text or not may_contain_secret(text):
        return text
    first, last = _ends(text)
    if depth <= MAX_DEPTH and first in ("{", "[") and last in ("}", "]"):
        try:
            parsed = json.loads(text.strip())
            redacted = _redact_parsed(parsed, depth)
            return text if redacted == parsed else json.dumps(redacted, ensure_ascii=False)
        except (ValueError, RecursionError, _TooDeep):
            pass  # not JSON, or too deep to walk: the text rules keep valid JSON valid
    return redact_text(text)


def redact_bytes(data: bytes | None) -> bytes | None:
    """Raw bytes no decoder could read (a dead letter's key or value) with the secrets in their text redacted.

    Read as Latin-1 (one character per byte), so every byte outside a secret is kept as it was and the
    secrets, ASCII in UTF-8 as in Avro strings, are found where they lie; unchanged bytes are returned as is.
    """
    if not data:
        return data
    text = bytes(data).decode("latin-1")
    out = redact_text(text)
    return data if out == text else out.encode("latin-1", errors="replace")


def _ends(text: str) -> tuple[str, str]:
    """The first and the last character of ``text.strip()`` (``""`` when blank), without the stripped copy."""
    start, end = 0, len(text)
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (text[start], text[end - 1]) if start < end else ("", "")


_CONTAINERS = (dict, list, tuple)


def _collect(value: Any, strings: list[str]) -> bool:
    """Gather the strings inside ``value``; True when a secret-named key holds a literal string value.

    Iterative (no recursion limit) and typed by ``type(...) is`` checks: it runs on every event.
    """
    hit = False
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            strings.append(item)
        elif kind is dict:
            tokens = item.get("completion_tokens_text")
            if type(tokens) is list and tokens:
                strings.append("".join(t for t in tokens if type(t) is str))  # the text the tokens spell
            for key, child in item.items():
                if type(key) is str and _may_be_token_key(key):
                    strings.append(key)  # a key can hold a secret too (an attribute named after a token)
                if type(child) is str:
                    strings.append(child)
                    if not hit and _secret_entry(key, child):
                        hit = True
                elif type(child) in _CONTAINERS:
                    stack.append(child)
        elif kind in _CONTAINERS:
            stack.extend(child for child in item if type(child) in _CONTAINERS or type(child) is str)
        elif isinstance(item, str | dict | list | tuple):  # subclasses: the slow path
            stack.append(_plain(item))
    return hit


def _may_be_token_key(key: str) -> bool:
    """A dict key long enough, and not a lower-case name, to hold a token (schema and attribute names do not)."""
    return len(key) >= 16 and not (key.isascii() and all(c.islower() or c in "_.-" for c in key))


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return dict(value)
    return list(value)


def _encoded_positions(joined: str) -> list[int]:
    """Where in ``joined`` an encoded run decodes to text that may hold a secret, or a bare key body starts."""
    current = generation()
    positions = [
        m.start()
        for m in encoded_runs(joined, 4 * MAX_ENCODED_RUNS)
        if run_at_hides_secret(joined, m.start(), m.end(), 0, current)
    ]
    positions += [start for start, _ in bare_body_spans(joined)]
    positions += [start for start, _ in vendor_spans(joined, limit=4 * MAX_ENCODED_RUNS)]
    if ":" in joined:
        positions += [m.start() for m in PGPASS.finditer(joined)]
    if has_escape(joined):
        # an escaped name or value (``{"\\u0070assword": …}``, ``%3A…%40``): the decoded text decides
        decoded = decode_all(joined)
        if decoded != joined and may_contain_secret(decoded):
            positions += [m.start() for m in ESCAPE.finditer(joined)]
    return positions


def redact_value(value: Any) -> Any:
    """Redact strings anywhere inside nested dicts, lists and tuples (an event, an export record).

    JSON strings are redacted as parsed values (:func:`redact_json_text`); a dict entry whose key
    names a secret (``"password": "hunter2"``) has its value replaced. The common case costs one
    Aho-Corasick pass and one scan for encoded runs over the value's joined text, and returns
    ``value`` itself when nothing in it can be a secret.

    Raises:
        RedactionError: ``value`` is nested deeper than ``MAX_DEPTH`` (it is refused, not passed on).
    """
    strings: list[str] = []
    key_hit = _collect(value, strings)
    # a long string (a 24 MB tool output) is judged on its own, where it is: no joined copy of it
    long_suspects = {id(text) for text in strings if len(text) > LONG_STRING and may_contain_secret(text)}
    if any(len(text) > LONG_STRING for text in strings):
        strings = [text for text in strings if len(text) <= LONG_STRING]
    joined = "\x00".join(strings)  # no trigger contains NUL: a match lies within one string
    positions = [start for _, start, _ in trigger_matches(joined)]
    positions += _encoded_positions(joined)
    suspects: set[int] | None = None
    if any(trigger in joined for trigger, _ in CASED_TRIGGERS) or may_hold_injected(joined):
        pass  # rare: every string is looked at
    elif not positions:
        if not key_hit and not long_suspects:
            return value
        suspects = long_suspects
    else:
        # the strings holding a trigger, found from match positions without scanning each string again
        starts = list(itertools.accumulate((len(text) + 1 for text in strings), initial=0))
        suspects = {id(strings[bisect.bisect_right(starts, start) - 1]) for start in positions} | long_suspects
    try:
        return _redact_parsed(value, 0, suspects)
    except (_TooDeep, RecursionError) as exc:
        raise RedactionError(f"value nested deeper than {MAX_DEPTH} levels; refusing to pass it on unredacted") from exc


def redact_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """:func:`redact_json_text` over an Arrow string column, vectorized.

    One Aho-Corasick pass (polars ``contains_any``) over the whole column finds the values that
    may hold a secret, plus those with an encoded run or a registered value in any of its forms;
    only those go through the regular expressions.
    """
    import polars as pl

    series = pl.Series(values)
    # cased triggers (SK, AC) would match almost every value case-insensitively: look for them as they are
    hits = series.str.contains_any(LOWER_TRIGGERS, ascii_case_insensitive=True)
    hits = hits | series.str.contains(_RUN_OR_BODY)
    with _values_lock:  # a fleet thread may register or forget values meanwhile
        cased = [trigger for trigger, _ in CASED_TRIGGERS]
    exact = cased + registered_variants()
    hits = hits | series.str.contains_any(exact)
    if len(exact) > len(cased):
        hits = hits | series.str.replace_all(GAPS.pattern, "").str.contains_any(exact)
    suspects = hits.fill_null(False).arg_true().to_list()
    arrow = series.to_arrow()
    if not suspects:
        return arrow
    texts = series.to_list()
    for index in suspects:
        texts[index] = redact_json_text(texts[index])
    return pa.array(texts, type=arrow.type)


redact_event = redact_value
redact_record = redact_value
