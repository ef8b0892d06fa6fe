"""Redaction across the events of one session: what no single event shows.

A session's events are emitted in order; a secret can straddle two of them: an output chunk that ends
in ``ghp_Ab3…`` and the next that goes on ``…Xy9``, ``export API_TOKEN=`` then the value, a private key
whose header is in one event and its body in the next ones. :class:`SessionRedactor` keeps, per text
field (``payload.output``, ``payload.command`` …), the last line of the previous value (at most
``TAIL_CHARS``), whether that value ended inside a secret, and whether a private key block is open.

For each new value of a field it redacts: the body of an open key block up to its END line; the start
of the value when the previous one ended inside a secret (the rest of the same token); whatever the
previous value's last line and this value's first line show only together (``Authorization: Bearer``
then the token); and, because the earlier half of a token has already left, a value that *ends* in the
prefix of a known token format (``…AKIA12``, ``…ghp_Ab``) is redacted to its end before it is sent.

Not covered: a secret cut into more than two events of which the middle one shows nothing secret on
its own, a secret whose two halves are in different fields, a split inside an unprefixed random value
with no name before it, and key blocks left open for more than ``MAX_OPEN_EVENTS`` events.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import ahocorasick_rs

from producers.redact.formats import REDACTED, TOKEN_PREFIXES
from producers.redact.scan import find_matches
from producers.redact.structured import redact_value
from producers.redact.text import active_layers, key_block_spans, may_join_secret, redact_text
from producers.redact.tokens import drop_token_ids, has_token_ids, redact_tokens
from producers.redact.values import MIN_SECRET_VALUE_LEN, merge_spans, replace_spans

# What is kept of a field's previous value: its last line, at most this long.
TAIL_CHARS = 512
# Secrets found in a session and redacted by value in its later events (the most recent are kept).
MAX_LEARNED = 256
# Fields remembered per session (an event kind has a handful; a hostile producer cannot grow it).
MAX_FIELDS = 64
# A key block still open after this many events of its field is given up (its state is dropped).
MAX_OPEN_EVENTS = 256
_CONTINUATION = re.compile(r"[A-Za-z0-9_+/=.~-]+")


@dataclass
class _FieldState:
    tail: str  # the previous value's last line, unredacted (it never leaves the host)
    ended_in_secret: bool  # the previous value's redaction reached its very end
    open_block: int  # events left in an open private key block (0: none)


Path = tuple[Any, ...]


def _leaves(value: Any, path: Path, out: list[Path]) -> None:
    """The paths of the string leaves inside ``value``."""
    if type(value) is str:
        out.append(path)
    elif isinstance(value, dict):
        for key, item in value.items():
            _leaves(item, (*path, key), out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _leaves(item, (*path, index), out)


#: The field the token strings of a session's model calls are remembered under (their joined text).
_TOKENS: Path = ("payload", "model_call", "completion_tokens_text")


def _is_token_string(path: Path) -> bool:
    """Whether ``path`` is one token of a model call's ``completion_tokens_text``."""
    return len(path) >= 2 and path[-2] == "completion_tokens_text"


def _changed_ranges(before: str, after: str) -> list[tuple[int, int]]:
    """The ranges of ``before`` that redaction replaced to give ``after``."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return [(i1, i2) for tag, i1, i2, _, _ in matcher.get_opcodes() if tag in ("replace", "delete")]


class SessionRedactor:
    """Redacts one session's events in emission order, carrying what straddles two events (bounded)."""

    def __init__(self) -> None:
        self._fields: dict[Path, _FieldState] = {}
        # a model call of this session had its text rewritten: later calls' prompt token ids (which share
        # its tokens as their prefix) would decode to the secret, so they are dropped too
        self._tokens_tainted = False
        # secrets found earlier in the session, redacted by value wherever they appear again (a tool output's
        # secret inside a later model call's messages, where the text around it does not tell)
        self._learned: dict[str, None] = {}
        self._learned_automaton: ahocorasick_rs.AhoCorasick | None = None
        self._learned_longest = 0

    def redact_event(self, event: dict[str, Any]) -> dict[str, Any]:
        """The event with every secret redacted, those it shares with earlier events of the session included.

        Raises:
            RedactionError: the event is nested deeper than the redactor walks.
        """
        leaves: list[Path] = []
        streamed = dict(event)
        for part in ("payload", "extra"):
            if isinstance(event.get(part), dict):
                _leaves(event[part], (part,), leaves)
                streamed[part] = _copy(event[part])
        raw: dict[Path, str] = {}
        for path in leaves:
            text = _get(event, path)
            if not text or _is_token_string(path):
                # a token is no text of its own: the call's token strings are redacted as the text they
                # spell (``tokens``); a token ending in a vendor prefix would otherwise be redacted alone
                # and leave the rest of the secret unrecognisable in the joined text
                continue
            raw[path] = text
            spans = self._boundary_spans(path, text) + self._learned_spans(text)
            if spans:
                _set(streamed, path, replace_spans(text, merge_spans(spans), REDACTED))
        joined = self._stream_tokens(event, streamed)
        redacted = redact_value(streamed)
        if joined is not None:
            self._remember_tokens(joined, redacted)
        for path, text in raw.items():
            out = _get(redacted, path)
            self._remember(path, text, isinstance(out, str) and out.endswith(REDACTED))
            if isinstance(out, str) and out != text and REDACTED in out:
                self._learn(removed_values(text, out))
        return self._token_ids(event, redacted)

    def _stream_tokens(self, event: dict[str, Any], streamed: dict[str, Any]) -> str | None:
        """A model call's token strings as one text of the session: what straddles two calls or was learned.

        Returns the text the tokens spell (None when the event has none); ``streamed`` gets the tokens with
        the spans the session's earlier events tell of replaced.
        """
        payload = event.get("payload")
        call = payload.get("model_call") if isinstance(payload, dict) else None
        if not isinstance(call, dict):
            return None
        tokens = call.get("completion_tokens_text")
        if not isinstance(tokens, list) or not tokens or not all(type(t) is str for t in tokens):
            return None
        joined = "".join(tokens)
        spans = self._boundary_spans(_TOKENS, joined) + self._learned_spans(joined)
        if spans:
            masked = redact_tokens(tokens, lambda text: replace_spans(text, merge_spans(spans), REDACTED))
            if masked is not None:
                streamed["payload"]["model_call"] = drop_token_ids({**call, "completion_tokens_text": masked})
        return joined

    def _remember_tokens(self, joined: str, redacted: dict[str, Any]) -> None:
        call = redacted["payload"]["model_call"]
        out = "".join(t for t in call.get("completion_tokens_text") or [] if type(t) is str)
        self._remember(_TOKENS, joined, out.endswith(REDACTED))
        if out != joined and REDACTED in out:
            self._learn(removed_values(joined, out))

    def _learned_spans(self, text: str) -> list[tuple[int, int]]:
        automaton = self._learned_automaton
        if automaton is None:
            return []
        return [(start, end) for _, start, end in find_matches(automaton, text, self._learned_longest)]

    def _learn(self, values: list[str]) -> None:
        fresh = [v for v in values if len(v) >= MIN_SECRET_VALUE_LEN and v not in self._learned]
        if not fresh:
            return
        for value in fresh:
            self._learned[value] = None
            escaped = json.dumps(value)[1:-1]
            if escaped != value:
                self._learned[escaped] = None
        while len(self._learned) > MAX_LEARNED:
            self._learned.pop(next(iter(self._learned)))
        self._learned_longest = max(map(len, self._learned))
        self._learned_automaton = ahocorasick_rs.AhoCorasick(
            list(self._learned), matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_LONGEST
        )

    def _token_ids(self, event: dict[str, Any], redacted: dict[str, Any]) -> dict[str, Any]:
        """Drop the token ids of a model call whose text, or an earlier call's, redaction changed."""
        payload = redacted.get("payload")
        if not isinstance(payload, dict):
            return redacted
        call = payload.get("model_call")
        if not isinstance(call, dict):
            return redacted
        before = event["payload"].get("model_call")
        if isinstance(before, dict) and has_token_ids(before) and not has_token_ids(call):
            self._tokens_tainted = True
        elif self._tokens_tainted and has_token_ids(call):
            redacted = {**redacted, "payload": {**payload, "model_call": drop_token_ids(call)}}
        return redacted

    def _boundary_spans(self, path: Path, text: str) -> list[tuple[int, int]]:
        state = self._fields.get(path)
        spans: list[tuple[int, int]] = []
        if state is not None:
            if state.open_block:
                spans += key_block_spans(text, open_block=True)[0]
            if state.ended_in_secret and (run := _CONTINUATION.match(text)) is not None:
                spans.append(run.span())
            head = text[: min(len(text), TAIL_CHARS)].split("\n", 1)[0]
            joined = state.tail + head
            if state.tail and head and may_join_secret(joined):
                out = redact_text(joined)
                if out != joined:
                    cut = len(state.tail)
                    for start, end in _changed_ranges(joined, out):
                        if end > cut:
                            spans.append((max(start, cut) - cut, end - cut))
        tail_window = text[-TAIL_CHARS:]
        partial = TOKEN_PREFIXES.search(tail_window) if "formats" in active_layers() else None
        if partial is not None:
            offset = len(text) - len(tail_window)
            spans.append((partial.start() + offset, len(text)))
        return spans

    def _remember(self, path: Path, text: str, ended_in_secret: bool) -> None:
        state = self._fields.get(path)
        was_open = state.open_block if state is not None else 0
        still_open = key_block_spans(text, open_block=bool(was_open))[1]
        open_block = (was_open - 1 if was_open else MAX_OPEN_EVENTS) if still_open else 0
        if path not in self._fields and len(self._fields) >= MAX_FIELDS:
            self._fields.pop(next(iter(self._fields)))
        self._fields[path] = _FieldState(text[-TAIL_CHARS:].rsplit("\n", 1)[-1], ended_in_secret, open_block)


def removed_values(raw: str, out: str) -> list[str]:
    """The substrings of ``raw`` that redaction replaced by markers to give ``out`` (empty when the two do not
    align: a JSON value re-serialized with other spacing)."""
    pieces = out.split(REDACTED)
    if len(pieces) < 2 or not raw.startswith(pieces[0]) or not raw.endswith(pieces[-1]):
        return []
    values = []
    position = len(pieces[0])
    for index, piece in enumerate(pieces[1:], start=1):
        if index == len(pieces) - 1:
            end = len(raw) - len(piece)
        elif not piece:
            continue  # two markers in a row: their values are one run, taken at the next piece
        else:
            end = raw.find(piece, position + 1)
        if end < position:
            return []
        values.append(raw[position:end])
        position = end + len(piece)
    return [v.strip() for v in values if v.strip()]


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _get(root: Any, path: Path) -> Any:
    node = root
    try:
        for key in path:
            node = node[key]
    except (KeyError, IndexError, TypeError):
        return None
    return node


def _set(root: Any, path: Path, value: str) -> None:
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def redact_session(events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The session-level pass: one session's events, in order, each redacted with the earlier ones in view.

    What every door calls for a whole session (import, OTLP, the admission stage): a secret split across
    consecutive events (``export DB_PASSWORD=`` | the value; ``Authorization: Bearer `` | the token; a JWT cut
    at a dot), token strings spelling a secret, and model calls whose token ids no longer match their text
    are handled as in :class:`SessionRedactor`. Lazy: events are redacted as they are consumed.

    Raises:
        RedactionError: an event is nested deeper than the redactor walks.
    """
    redactor = SessionRedactor()
    for event in events:
        yield redactor.redact_event(event)


class SessionRedactors:
    """One :class:`SessionRedactor` per session id, for a door that sees many sessions' events interleaved.

    At most ``max_sessions`` are kept (the least recently used is dropped: a session that comes back after
    that starts with fresh state, so only a secret split across its two events at that moment is missed).
    """

    def __init__(self, max_sessions: int = 4096) -> None:
        self._max = max_sessions
        self._redactors: OrderedDict[str, SessionRedactor] = OrderedDict()
        self._lock = threading.Lock()

    def redact_event(self, event: dict[str, Any]) -> dict[str, Any]:
        """``event`` redacted by its session's redactor (events of one session must come in order).

        Raises:
            RedactionError: the event is nested deeper than the redactor walks.
        """
        key = str(event.get("session_id"))
        with self._lock:
            redactor = self._redactors.get(key)
            if redactor is None:
                redactor = self._redactors[key] = SessionRedactor()
                if len(self._redactors) > self._max:
                    self._redactors.popitem(last=False)
            else:
                self._redactors.move_to_end(key)
        return redactor.redact_event(event)

    def end(self, session_id: str) -> None:
        """Forget a session's state (its last event has been redacted)."""
        with self._lock:
            self._redactors.pop(str(session_id), None)
