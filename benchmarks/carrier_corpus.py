"""A redaction corpus of texts with the channels they travel in (``../shared/data/redaction-corpus/``).

Each line is a secret (``must_not_appear``) or an ordinary text (``must_appear``) with its carriers
(``args``, ``thought``, ``diff``, ``path``, ``split``, ``tokens``, ``otel``; a tool output always). A case
becomes the events a session would hold (:func:`case_events`); a secret leaks when one of its substrings
is found in any string of the redacted events, also after URL, HTML or JSON decoding, or when a model
call still carries token ids that would spell it.

Shapes whose rules were written after reading this file are *seen* (``SEEN_IDS``); any other id in the
file (a held-back part dropped beside it) is counted apart as unseen.
"""

from __future__ import annotations

import html
import json
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHARED_CORPUS_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "redaction-corpus"

# The ids of ../shared/data/redaction-corpus/corpus.jsonl read while writing the context and vendor layers.
SEEN_IDS = frozenset({
    "anthropic-admin-key", "nvidia-nim-key", "tavily-key", "langsmith-key", "atlassian-api-token", "grafana-sa-token",
    "newrelic-user-key", "doppler-token", "discord-bot-token", "stripe-webhook-secret", "gitlab-runner-token",
    "square-access-token", "sentry-auth-token", "pulumi-token", "terraform-cloud-token", "azure-servicebus-conn",
    "sql-identified-by", "sql-alter-role-password", "redis-auth-command", "htpasswd-batch", "openssl-pass-arg",
    "kubectl-from-literal", "wp-config-define", "spring-properties", "docker-login-p", "pgpass-line",
    "ssh-keygen-passphrase", "zip-password", "gpg-passphrase", "libpq-keyword-dsn", "aws-ssm-put", "smbclient-U",
    "private-token-header", "x-auth-token-header", "proxy-authorization", "urlencoded-form-body",
    "urlencoded-url-creds", "json-unicode-escaped-name", "double-escaped-json", "python-dict-repr-header",
    "split-env-export", "atif-token-ids-message", "atif-token-ids-observation", "otel-tool-result",
    "hf-tokenizer-call", "max-tokens-kwargs", "pytest-k-expression", "keyerror-traceback", "html-password-input",
    "auth-log-line", "traceparent-header", "argparse-env-default", "pip-freeze", "commit-message", "eth-address",
    "gzip-base64-blob", "vocab-json", "docker-compose-secrets", "git-sha-range", "uuid-config",
})  # fmt: skip


class CarrierCorpusUnavailable(Exception):
    """The corpus directory is absent (a fresh clone without ``../shared``)."""


@dataclass(frozen=True)
class CarrierCase:
    """One line of the corpus."""

    id: str
    kind: str  # "secret" or "ordinary"
    parts: tuple[str, ...]  # one part, or the consecutive outputs of a split
    carriers: tuple[str, ...]
    must_not_appear: tuple[str, ...] = ()
    must_appear: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The whole text (the parts joined)."""
        return "".join(self.parts)


def load_carrier_corpus(directory: Path = SHARED_CORPUS_DIR) -> list[CarrierCase]:
    """Every ``*.jsonl`` file of ``directory`` as cases.

    Raises:
        CarrierCorpusUnavailable: the directory holds no corpus file.
    """
    files = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    if not files:
        raise CarrierCorpusUnavailable(f"no redaction corpus in {directory}")
    cases = []
    for path in files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            parts = tuple(row["parts"]) if "parts" in row else (row["text"],)
            cases.append(
                CarrierCase(
                    row["id"],
                    row["kind"],
                    parts,
                    tuple(row.get("carriers") or ()),
                    tuple(row.get("must_not_appear") or ()),
                    tuple(row.get("must_appear") or ()),
                )
            )
    return cases


def _event(session: str, seq: int, event_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "session_id": session,
        "event_id": f"{session}-{seq}",
        "seq": seq,
        "event_type": event_type,
        "payload": payload,
        "extra": {},
    }


def _tokens(text: str) -> list[str]:
    """``text`` cut as a tokenizer would: short pieces, a secret never whole in one."""
    return [text[i : i + 3] for i in range(0, len(text), 3)]


def case_events(case: CarrierCase) -> list[dict[str, Any]]:
    """The events of one session carrying ``case`` in every channel it names (a tool output always)."""
    session = f"corpus-{case.id}"
    events = [_event(session, i, "tool_output", {"output": part}) for i, part in enumerate(case.parts)]
    text = case.text
    seq = len(events)
    for carrier in case.carriers:
        if carrier == "args":
            events.append(
                _event(session, seq, "agent_action", {"tool": "bash", "arguments": json.dumps({"cmd": text})})
            )
        elif carrier == "thought":
            events.append(_event(session, seq, "agent_action", {"thought": text, "reasoning": text}))
        elif carrier == "diff":
            events.append(_event(session, seq, "submission", {"patch": f"+++ b/app.sql\n@@ -0,0 +1 @@\n+{text}\n"}))
        elif carrier == "path":
            events.append(_event(session, seq, "file_write", {"path": text, "content": ""}))
        elif carrier == "tokens":
            pieces = _tokens(text)
            call = {
                "completion_tokens_text": pieces,
                "completion_token_ids": list(range(1000, 1000 + len(pieces))),
                "completion_logprobs": [-0.1] * len(pieces),
                "prompt_token_ids": [1, 2, 3],
                "prompt_token_ids_shared": 0,
                "record_level": "token",
                "blobs": [{"sha256": "0" * 64, "content": json.dumps({"role": "assistant", "content": text})}],
            }
            events.append(_event(session, seq, "agent_input", {"model_call": call, "content": text}))
        elif carrier == "otel":
            attributes = {"tool.arguments": json.dumps({"command": text}), "tool.result": text}
            events.append(_event(session, seq, "tool_output", {"output": text, "otel": attributes}))
        seq += 1
    return events


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _decoded(text: str) -> set[str]:
    forms = {text, urllib.parse.unquote(text), html.unescape(text)}
    try:
        forms.add(json.loads(f'"{text}"'))
    except ValueError:
        pass
    return forms


def case_leaks(case: CarrierCase, events: list[dict[str, Any]]) -> list[str]:
    """The substrings of a secret case still found in ``events`` (decoded forms and token ids included)."""
    strings = list(_strings(events))
    joined_tokens = [
        "".join(e["payload"]["model_call"]["completion_tokens_text"])
        for e in events
        if isinstance(e.get("payload", {}).get("model_call"), dict)
    ]
    left = [m for m in case.must_not_appear if any(m in form for s in strings + joined_tokens for form in _decoded(s))]
    for event in events:
        call = event.get("payload", {}).get("model_call")
        if isinstance(call, dict) and call.get("completion_token_ids") and "token-ids" not in left:
            if "".join(call.get("completion_tokens_text") or []) != case.text:
                left.append("token-ids")  # ids kept for a reply whose text was rewritten: they spell the secret
    return left


def case_changed(case: CarrierCase, events: list[dict[str, Any]]) -> list[str]:
    """The substrings of an ordinary case no longer found in the tool output."""
    outputs = "".join(e["payload"].get("output", "") for e in events if e["event_type"] == "tool_output")
    return [m for m in case.must_appear if m not in outputs]


@dataclass
class CarrierFigures:
    """Recall and precision of one redactor on the corpus, split into seen and unseen shapes."""

    name: str
    secrets: dict[str, int] = field(default_factory=lambda: {"seen": 0, "unseen": 0})
    caught: dict[str, int] = field(default_factory=lambda: {"seen": 0, "unseen": 0})
    ordinary: dict[str, int] = field(default_factory=lambda: {"seen": 0, "unseen": 0})
    changed: dict[str, int] = field(default_factory=lambda: {"seen": 0, "unseen": 0})
    leaked: list[str] = field(default_factory=list)
    changed_ids: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line: caught/secrets and changed/ordinary, seen and unseen apart."""
        parts = []
        for split in ("seen", "unseen"):
            if self.secrets[split] or self.ordinary[split]:
                parts.append(
                    f"{split} caught {self.caught[split]}/{self.secrets[split]}, "
                    f"ordinary changed {self.changed[split]}/{self.ordinary[split]}"
                )
        return f"{self.name:16s} " + "; ".join(parts)


SessionRedactorFn = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def measure_carriers(name: str, cases: list[CarrierCase], redact: SessionRedactorFn) -> CarrierFigures:
    """Run ``redact`` (a whole session's events → redacted events) on every case."""
    figures = CarrierFigures(name)
    for case in cases:
        split = "seen" if case.id in SEEN_IDS else "unseen"
        events = redact(case_events(case))
        if case.kind == "secret":
            figures.secrets[split] += 1
            left = case_leaks(case, events)
            if left:
                figures.leaked.append(case.id)
            else:
                figures.caught[split] += 1
        else:
            figures.ordinary[split] += 1
            if case_changed(case, events):
                figures.changed[split] += 1
                figures.changed_ids.append(case.id)
    return figures
