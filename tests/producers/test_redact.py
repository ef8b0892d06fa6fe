"""Secret redaction before events leave the host."""

from __future__ import annotations

import pyarrow as pa
import pytest

from producers.redact import REDACTED, redact_array, redact_text, redact_value
from producers.sdk import EventProducer
from schemas.registry import decode_event
from tests.helpers import sample_events

SECRETS = [
    ("export OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz012345", "sk-proj-abcdef"),
    ("curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlX3Rlc3Q'", "eyJhbGci"),
    ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtn"),
    ("aws configure set aws_access_key_id AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("git clone https://bob:hunter2@example.com/repo.git", "hunter2"),
    ("psql --password=s3cr3t -h db", "s3cr3t"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
    ("DB_PASSWORD='correct horse battery'", "correct horse"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdef"),
]


@pytest.mark.parametrize("text, secret", SECRETS)
def test_secrets_are_redacted(text: str, secret: str) -> None:
    redacted = redact_text(text)
    assert secret not in redacted
    assert REDACTED in redacted


@pytest.mark.parametrize("text", ["ls -la", "python -m pytest -q tests", "the tokenizer counts tokens", "cat key.py"])
def test_ordinary_text_is_untouched(text: str) -> None:
    assert redact_text(text) == text


def test_nested_values_and_producer_encoding_redact() -> None:
    assert redact_value({"a": ["x", {"b": "API_KEY=abc123"}]}) == {"a": ["x", {"b": f"API_KEY={REDACTED}"}]}
    event = sample_events(1)[2]
    event["payload"] = {**event["payload"], "command": "echo $X; export GITHUB_TOKEN=abcd1234efgh"}
    producer = EventProducer.__new__(EventProducer)
    producer.redact, producer.schema_version = True, None
    decoded = decode_event(producer.encode(event))
    assert "abcd1234efgh" not in decoded["payload"]["command"]


def test_column_redaction_matches_text_redaction() -> None:
    texts = [text for text, _ in SECRETS] + ["ls -la", None, "", "x" * 5000 + " Bearer abcdefghijkl", "https://a@b"]
    texts += [text.upper() for text, _ in SECRETS] + [text.lower() for text, _ in SECRETS]
    redacted = redact_array(pa.array(texts)).to_pylist()
    assert redacted == [redact_text(t) if t is not None else None for t in texts]
    assert sum(REDACTED in (t or "") for t in redacted) >= len(SECRETS)
