"""Secret redaction applied to every string an event carries.

Runs on the sandbox host before an event leaves it, and again before export.
Patterns cover provider API keys, bearer tokens, private keys, URL credentials
and ``NAME=value`` assignments whose name says secret (``*_TOKEN``,
``*PASSWORD*``, ``*_API_KEY`` …), in commands, environment dumps and outputs.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

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

# Cheap pre-check so the common case (no secret-looking text) costs a few substring scans:
# every pattern above needs one of these (lower-cased) literals to match.
_TRIGGERS = (
    "private key", "secret", "token", "passw", "pwd", "api_key", "api-key", "apikey", "access_key", "access-key",
    "accesskey", "credential", "auth", "bearer", "basic", "sk-", "pk-", "rk-", "akia", "asia", "ghp_", "gho_",
    "ghu_", "ghs_", "ghr_", "github_pat_", "xox", "aiza", "eyj",
)  # fmt: skip


def _may_contain_secret(text: str) -> bool:
    low = text.lower()
    return any(trigger in low for trigger in _TRIGGERS) or ("://" in low and "@" in low)


def redact_text(text: str) -> str:
    """Return ``text`` with every secret-looking span replaced by ``[REDACTED]``."""
    if not text or not _may_contain_secret(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """:func:`redact_text` over an Arrow string column, vectorized.

    One Aho-Corasick pass (polars ``contains_any``) over the whole column finds the
    values that may hold a secret; only those go through the regular expressions.
    """
    import polars as pl

    series = pl.Series(values)
    low = series.str.contains_any(list(_TRIGGERS), ascii_case_insensitive=True)
    url = series.str.contains("://", literal=True) & series.str.contains("@", literal=True)
    suspects = (low | url).fill_null(False).arg_true().to_list()
    arrow = series.to_arrow()
    if not suspects:
        return arrow
    texts = series.to_list()
    for index in suspects:
        texts[index] = redact_text(texts[index])
    return pa.array(texts, type=arrow.type)


def redact_value(value: Any) -> Any:
    """Redact strings anywhere inside nested dicts, lists and tuples."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v) for v in value)
    return value
