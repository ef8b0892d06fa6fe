"""Token strings of a model call: redacted with the text they spell, and token ids that no longer match dropped.

A model call recorded at token level carries ``completion_tokens_text`` (the reply cut into tokens:
``"=ghp", "_H", "GY", …``), ``completion_token_ids`` and ``completion_logprobs``. No token shows a secret on
its own, so the tokens are joined, the joined text is redacted like any other, and every token that
overlaps a redacted span is replaced (the first by ``[REDACTED]``, the others by ``""``).

Token ids cannot be redacted: decoded, they spell the secret again. So when redaction changes anything a
call holds — its token strings, its messages (``blobs``), its reply — the call falls back to message level,
as for any other call whose text was rewritten: ``record_level`` becomes ``"message"`` and the completion
ids, logprobs and prompt ids are dropped (:func:`drop_token_ids`). Export then rebuilds the call from its
messages.
"""

from __future__ import annotations

import difflib
from typing import Any

from producers.redact.names import REDACTED

TOKEN_KEYS = ("completion_tokens_text", "completion_token_ids", "completion_logprobs")


def is_model_call(value: dict[Any, Any]) -> bool:
    """Whether a dict is a model call record with token-level fields."""
    return "completion_tokens_text" in value or "completion_token_ids" in value or "prompt_token_ids" in value


def redact_tokens(tokens: list[str], redact: Any) -> list[str] | None:
    """``tokens`` with every token overlapping a secret of their joined text replaced; None when none does."""
    if not tokens or not all(type(t) is str for t in tokens):
        return None
    joined = "".join(tokens)
    out = redact(joined)
    if out == joined:
        return None
    spans: list[tuple[int, int]] = []
    matcher = difflib.SequenceMatcher(None, joined, out, autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag in ("replace", "delete") and i2 > i1:
            if spans and i1 - spans[-1][1] <= 3:
                spans[-1] = (spans[-1][0], i2)  # a character of the secret equal to one of the marker's
            else:
                spans.append((i1, i2))
    result = list(tokens)
    position = 0
    span_index = 0
    marked: set[int] = set()
    for index, token in enumerate(tokens):
        start, end = position, position + len(token)
        position = end
        while span_index < len(spans) and spans[span_index][1] <= start:
            span_index += 1
        probe = span_index
        while probe < len(spans) and spans[probe][0] < end:
            if end > spans[probe][0] and start < spans[probe][1]:
                result[index] = "" if probe in marked else REDACTED
                marked.add(probe)
                break
            probe += 1
    return result


def drop_token_ids(call: dict[Any, Any]) -> dict[Any, Any]:
    """The call at message level: no completion or prompt token ids, no logprobs (their text was rewritten)."""
    out = dict(call)
    for key in ("completion_token_ids", "completion_logprobs"):
        if key in out:
            out[key] = []
    if "prompt_token_ids" in out:
        out["prompt_token_ids"] = []
    if "prompt_token_ids_shared" in out:
        out["prompt_token_ids_shared"] = None
    if "record_level" in out and out["record_level"] is not None:
        out["record_level"] = "message"
    return out


def has_token_ids(call: dict[Any, Any]) -> bool:
    """Whether the call carries token ids that decode to its text."""
    return bool(call.get("completion_token_ids") or call.get("prompt_token_ids"))
