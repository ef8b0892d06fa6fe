"""Secret redaction applied to every string an event carries.

Runs on the sandbox host before an event leaves it, and again before export.
Patterns cover provider API keys, bearer tokens, private keys, URL credentials
and ``NAME=value`` assignments whose name says secret (``*_TOKEN``,
``*PASSWORD*``, ``*_API_KEY`` …), in commands, environment dumps and outputs.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[REDACTED]"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # PEM private keys, possibly truncated at the end of an output.
    (
        re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S),
        REDACTED,
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    # NAME=value / NAME: value where NAME looks like a secret.
    (
        re.compile(
            r"(?i)\b([A-Z0-9_.-]*(?:SECRET|TOKEN|PASSWORD|PASSWD|PWD|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY"
            r"|CREDENTIALS?|AUTH)[A-Z0-9_.-]*)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s'\";&|]+)"
        ),
        r"\1\2" + REDACTED,
    ),
    (re.compile(r"(?i)(--(?:password|token|api-key|secret)[= ])(\S+)"), r"\1" + REDACTED),
    (re.compile(r"\b(?:sk|pk|rk)-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"), REDACTED),  # OpenAI/Anthropic style
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),  # AWS access key id
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"), REDACTED),  # GitHub
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}\b"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"), REDACTED),  # Slack
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), REDACTED),  # Google API key
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"), REDACTED),  # JWT
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]+:)([^\s@/]+)(@)"), r"\1" + REDACTED + r"\3"),  # URL creds
]

# Cheap pre-check so the common case (no secret-looking text) costs one scan.
_TRIGGER = re.compile(
    r"(?i)PRIVATE KEY|SECRET|TOKEN|PASSW|PWD|API[_-]?KEY|ACCESS[_-]?KEY|CREDENTIAL|AUTH|bearer|basic\s"
    r"|sk-|pk-|rk-|AKIA|ASIA|gh[pousr]_|github_pat_|xox|AIza|eyJ|://[^\s/]*@"
)


def redact_text(text: str) -> str:
    """Return ``text`` with every secret-looking span replaced by ``[REDACTED]``."""
    if not text or not _TRIGGER.search(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_value(value: Any) -> Any:
    """Redact strings anywhere inside nested dicts, lists and tuples."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v) for v in value)
    return value


def contains_secret(text: str) -> bool:
    """True when :func:`redact_text` would change ``text``."""
    return redact_text(text) != text
