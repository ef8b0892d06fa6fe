"""Secret redaction applied to every string an event carries.

Runs on the sandbox host before an event leaves it (``SessionEmitter`` across a session's events,
``EventProducer.encode`` on each), on imported runs, and again before export (:func:`redact_record`).
The layers, one module each:

1. **Values the host injected** (:mod:`.values`): the fleet registers every per-task secret it hands a
   sandbox; those values, and their reversed, re-cased, hex, base64 and line-wrapped forms, are
   replaced wherever they appear.
2. **Token formats** (:mod:`.formats`) with a fixed shape (AWS ``AKIA…``, GitHub ``ghp_…``, Vault
   ``hvs.…``, Telegram bot tokens, JWTs, webhooks …) or a telling place (``Authorization:``, ``Cookie:``,
   URL credentials, ``curl -u``, ``mysql -p``, ``aws configure set``), each behind a literal pre-check.
3. **Names that say secret** (:mod:`.names`, :mod:`.text`): ``NAME=value``, ``name: value``,
   ``"name": "value"``, ``<nameToken>value</nameToken>`` … whose name says secret. References
   (``$VAR``, ``${VAR}``), placeholders (``TOKEN``, ``<token>``, ``xxx``, ``your-api-key``) and code
   (``password = user.password``) are never rewritten.
4. **Blocks and layers** (:mod:`.text`): private key bodies up to their END line (in later lines and,
   through :class:`SessionRedactor`, later events), and base64 or hex runs that decode to a secret.

Structured values (:mod:`.structured`) are redacted as values: JSON stays JSON with the same shape.
Coverage and measured recall/precision: ``docs/guarantees.md``, ``trajlake bench redaction``.
"""

from producers.redact.formats import REDACTED
from producers.redact.names import is_secret_name
from producers.redact.stream import SessionRedactor, SessionRedactors, redact_session
from producers.redact.structured import (
    MAX_DEPTH,
    redact_array,
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
    "redact_event",
    "redact_json_text",
    "redact_record",
    "redact_session",
    "redact_text",
    "redact_value",
    "register_secret_values",
]
