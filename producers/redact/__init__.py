"""Secret redaction applied to every string an event carries, in layers (docs/guarantees.md, "Secrets").

The session-level pass is the entry point of every door: :func:`redact_session` (one session's events in
order), :class:`SessionRedactor` (the same, event by event) and :class:`SessionRedactors` (many sessions'
events interleaved, one redactor per session id). :func:`redact_value` / :func:`redact_record` redact one
value on its own (export's second pass).

1. **Exact values** (:mod:`.values`): per-task secrets the fleet injects, in every reversible form;
   secrets found earlier in a session (the session-level pass).
2. **Formats** (:mod:`.formats`, :mod:`.vendor`): named token formats and vendor tokens by structure
   (label + random body, dotted parts), key blocks, encoded runs that decode to a secret.
3. **Detector** (:mod:`.detector`): Kingfisher's maintained catalog, on candidate strings only.
4. **Context** (:mod:`.context`, :mod:`.names`, :mod:`.text`): credential flags and positions of command
   lines, SQL, redis, stdin-fed secrets, ``.pgpass``, ``NAME=value`` and keys that say secret; every layer
   also reads a decoded view of URL escapes, HTML entities and ``\\u`` escapes (:mod:`.decode`).
5. **Across events and token strings** (:mod:`.stream`, :mod:`.tokens`): secrets split between events,
   token strings redacted with the text they spell, token ids dropped where the text was rewritten.

Structured values (:mod:`.structured`) are redacted as values: JSON stays JSON with the same shape.
"""

from producers.redact.formats import REDACTED
from producers.redact.names import is_secret_name
from producers.redact.stream import SessionRedactor, SessionRedactors, redact_session
from producers.redact.structured import (
    MAX_DEPTH,
    redact_array,
    redact_bytes,
    redact_event,
    redact_json_text,
    redact_record,
    redact_value,
)
from producers.redact.text import TRIGGERS, redact_text
from producers.redact.values import (
    MAX_SECRET_VALUES,
    MIN_SECRET_VALUE_LEN,
    _secret_values,
    forget_secret_values,
    register_secret_values,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_SECRET_VALUES",
    "MIN_SECRET_VALUE_LEN",
    "REDACTED",
    "TRIGGERS",
    "SessionRedactor",
    "SessionRedactors",
    "_secret_values",
    "forget_secret_values",
    "is_secret_name",
    "redact_array",
    "redact_bytes",
    "redact_event",
    "redact_json_text",
    "redact_record",
    "redact_session",
    "redact_text",
    "redact_value",
    "register_secret_values",
]
