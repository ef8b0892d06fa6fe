"""Issue 43's layers: context, generic vendor tokens, the decoded view, token strings, the session-level pass.

Secrets and split points are generated (hypothesis), so the rules are held to the shapes, not to the
listed examples; the shared corpus (``../shared/data/redaction-corpus``) runs through every channel it names.
"""

from __future__ import annotations

import html
import json
import re
import string
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.carrier_corpus import (
    SHARED_CORPUS_DIR,
    CarrierCorpusUnavailable,
    case_changed,
    case_events,
    case_leaks,
    load_carrier_corpus,
)
from benchmarks.secret_corpus import SecretCase, place
from producers.redact import REDACTED, SessionRedactor, redact_session, redact_text, redact_value
from producers.sdk import EventProducer
from schemas.registry import decode_event

ALNUM = string.ascii_letters + string.digits
# A password: random letters and digits with at least two of each (the texture nothing ordinary has).
password = st.tuples(
    st.text(ALNUM, min_size=10, max_size=24), st.text(string.digits, min_size=2, max_size=3),
    st.text(string.ascii_letters, min_size=2, max_size=3),
).map(lambda t: t[2] + t[0] + t[1]).filter(lambda s: len(set(s)) >= 8)  # fmt: skip
quiet = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

COMMAND_SHAPES = [
    "mysql> CREATE USER 'app'@'%' IDENTIFIED BY '{s}';",
    "ALTER ROLE app WITH LOGIN PASSWORD '{s}';",
    "CREATE LOGIN app WITH PASSWORD = '{s}'",
    "127.0.0.1:6379> AUTH {s}",
    "htpasswd -b -c /etc/nginx/.htpasswd admin {s}",
    "htpasswd -nb admin {s}",
    "openssl enc -aes-256-cbc -pass pass:{s} -in a -out b",
    "openssl pkcs12 -export -passout pass:{s} -out a.p12",
    "docker login -u deploy -p {s} registry.example.com",
    "zip -P {s} backup.zip dump.sql",
    "7z a -p{s} backup.7z dir",
    "gpg --batch --passphrase {s} -c secrets.tar",
    "smbclient //fs/share -U admin%{s}",
    "sqlcmd -S db -U sa -P '{s}' -Q 'select 1'",
    "db.internal:5432:app:appuser:{s}",
    "ssh-keygen -t ed25519 -N '{s}' -f key",
    "aws ssm put-parameter --name /prod/db --type SecureString --value {s}",
    "keytool -genkey -storepass {s} -keystore k.jks",
    "ldapsearch -x -D cn=admin -w {s} -b dc=example",
    "echo '{s}' | docker login -u me --password-stdin ghcr.io",
    "lftp -u bob,{s} ftp.example.com",
    "newrelic profile add --apiKey {s} --region US",
    "sqlplus scott/{s}@orcl",
    "net use \\\\srv\\share /user:admin {s}",
    "cmdkey /generic:srv /user:admin /pass:{s}",
    "mount -t cifs -o username=u,password={s} //srv/s /mnt",
    "CONFIG SET requirepass {s}",
    "rabbitmqctl add_user admin {s}",
]


@quiet
@given(secret=password, shape=st.sampled_from(COMMAND_SHAPES))
def test_credential_in_a_command_s_telling_place_is_redacted(secret, shape):
    text = shape.format(s=secret)
    out = redact_value({"payload": {"output": text, "command": text}})
    assert secret not in json.dumps(out), out


ORDINARY = [
    "docker run -p 8080:80 nginx",
    "zip -r out.zip dir",
    "gpg --passphrase-file pw.txt -c f",
    "openssl enc -pass env:PW -in a",
    "ssh-keygen -N '' -f k",
    "docker login -u me --password-stdin ghcr.io",
    "request_id=6fa459ea-ee8a-3ca4-894e-db77e160355e tenant=acme secret_ref=vault://kv/app/db",
    'pytest -k "test_token_refresh or test_password_hash" -q',
    "INFO auth.service: token refreshed for user_id=42 (expires_in=3600, scope=read:repo)",
    "payload = 'H4sIAAAAAAAAA8tIzcnJVyjPL8pJAQCFEUoNCwAAAA=='",
    "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    '"django.contrib.auth.hashers.PBKDF2PasswordHasher",',
    "Downloading chardet-7.4.2-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl (883 kB)",
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 user@host",
    "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_unchanged(text):
    assert redact_value({"payload": {"output": text}})["payload"]["output"] == text


label = st.text(string.ascii_lowercase, min_size=2, max_size=6).filter(
    lambda s: s not in {"sha", "md", "id", "git", "req", "run", "job", "test", "user", "key", "app", "log"}
)


@quiet
@given(prefix=label, sep=st.sampled_from(["_", "-"]), body=password, name=st.sampled_from(["", "X=", "NAME="]))
def test_vendor_token_of_no_listed_format_is_redacted_by_its_structure(prefix, sep, body, name):
    body = body + "Zq9" + body[::-1]  # 20+ characters of mixed case and digits
    token = f"{prefix}{sep}{body}"
    out = redact_text(f"using {name}{token} now")
    assert body not in out, out


@quiet
@given(secret=password, encode=st.sampled_from(["url", "url2", "html", "json"]))
def test_encoded_names_and_values_are_read_decoded(secret, encode):
    if encode in ("url", "url2"):
        text = urllib.parse.quote(f"https://deploy:{secret}@git.example.com/r.git", safe="")
        text = "clone=" + (urllib.parse.quote(text, safe="") if encode == "url2" else text)
    elif encode == "html":
        text = html.escape(f"<password>{secret}</password>") + f" pass&#119;ord={secret}"
    else:
        text = '{"\\u0070assword": "' + secret + '", "user": "ops"}'
    out = redact_value({"payload": {"output": text}})["payload"]["output"]
    assert secret not in out and secret not in urllib.parse.unquote(out) and secret not in html.unescape(out), out


SPLITS = [
    ("$ export DATABASE_PASSWORD=", "{s}\n$ ./migrate.sh"),
    ("curl -H 'Authorization: Bearer ", "{s}' https://api.example.com"),
]


@quiet
@given(secret=password, split=st.sampled_from(SPLITS), path=st.sampled_from(["import", "sdk", "session"]))
def test_a_secret_split_across_two_events_is_caught_on_every_path(secret, split, path):
    first, second = split[0], split[1].format(s=secret)
    events = [
        {"session_id": "s", "event_id": f"e{i}", "event_type": "tool_output", "payload": {"output": text}, "extra": {}}
        for i, text in enumerate((first, second))
    ]
    if path == "import":
        out = list(redact_session(events))
    elif path == "sdk":
        producer = EventProducer.__new__(EventProducer)  # encode() needs no Kafka connection
        out = [_sdk_redact(producer, e) for e in events]
    else:
        redactor = SessionRedactor()
        out = [redactor.redact_event(e) for e in events]
    assert secret not in json.dumps(out)


def _sdk_redact(producer: EventProducer, event: dict) -> dict:
    """What ``EventProducer.encode`` redacts an event to (the encoding itself is left out)."""
    from producers.redact import SessionRedactors

    redactors = producer.__dict__.setdefault("_session_redactors", SessionRedactors())
    return redactors.redact_event(event)


@quiet
@given(secret=password, cut=st.integers(1, 2))
def test_a_jwt_cut_at_a_dot_is_caught_across_events(secret, cut):
    header, claims = "eyJhbGciOiJIUzI1NiJ9", "eyJzdWIiOiJ" + secret[:10]
    parts = [header, claims, secret + "abcXYZ0123456789"]
    first, second = ".".join(parts[:cut]) + ".", ".".join(parts[cut:])
    events = [{"payload": {"output": f"token: {first}"}}, {"payload": {"output": second}}]
    out = list(redact_session(events))
    assert parts[-1] not in json.dumps(out)


@quiet
@given(secret=password, width=st.integers(1, 5))
def test_token_strings_are_redacted_with_the_text_they_spell_and_ids_dropped(secret, width):
    text = f"Setting DB_PASSWORD={secret} in service.env"
    pieces = [text[i : i + width] for i in range(0, len(text), width)]
    call = {
        "completion_tokens_text": pieces,
        "completion_token_ids": list(range(len(pieces))),
        "completion_logprobs": [-0.5] * len(pieces),
        "prompt_token_ids": [1, 2, 3],
        "prompt_token_ids_shared": 0,
        "record_level": "token",
    }
    out = redact_value({"payload": {"model_call": call}})["payload"]["model_call"]
    assert secret not in "".join(out["completion_tokens_text"])
    assert REDACTED in out["completion_tokens_text"]
    assert out["completion_token_ids"] == [] and out["prompt_token_ids"] == [] and out["record_level"] == "message"


def test_a_clean_model_call_keeps_its_token_ids():
    call = {"completion_tokens_text": ["hello", " world"], "completion_token_ids": [1, 2], "record_level": "token"}
    out = redact_value({"payload": {"model_call": call}})["payload"]["model_call"]
    assert out == call


def test_later_calls_of_a_session_lose_prompt_ids_once_a_call_was_rewritten():
    secret = "Qm7xT2pLk9Wv3R"
    calls = [
        {"completion_tokens_text": ["DB_PASSWORD", "=", secret], "completion_token_ids": [1, 2, 3],
         "prompt_token_ids": [9], "prompt_token_ids_shared": 0, "record_level": "token"},
        {"completion_tokens_text": ["ok"], "completion_token_ids": [4], "prompt_token_ids": [5],
         "prompt_token_ids_shared": 4, "record_level": "token"},
    ]  # fmt: skip
    out = list(redact_session({"payload": {"model_call": c}} for c in calls))
    assert out[1]["payload"]["model_call"]["prompt_token_ids"] == []
    assert out[1]["payload"]["model_call"]["record_level"] == "message"


def _shared_cases():
    try:
        return load_carrier_corpus(SHARED_CORPUS_DIR)
    except CarrierCorpusUnavailable as exc:
        pytest.skip(f"the shared redaction corpus is absent ({exc}): ../shared is beside the repo in CI only")


def test_shared_corpus_leaks_nothing_and_changes_nothing_through_its_channels():
    cases = _shared_cases()
    leaked, changed = [], []
    for case in cases:
        for path in ("session", "sdk"):
            events = case_events(case)
            if path == "session":
                out = list(redact_session(events))
            else:
                producer = EventProducer.__new__(EventProducer)
                out = [_sdk_redact(producer, e) for e in events]
            out = [redact_value(e) for e in out]  # the export-time pass on top changes nothing more
            if case.kind == "secret" and case_leaks(case, out):
                leaked.append((path, case.id))
            if case.kind == "ordinary" and case_changed(case, out):
                changed.append((path, case.id))
    assert not leaked and not changed, (leaked, changed)
    assert sum(c.kind == "secret" for c in cases) >= 44


@pytest.mark.parametrize("field", ["output", "command", "thought", "arguments"])
def test_shared_corpus_through_the_sdk_encoded_and_decoded(field):
    """Real schema events through ``EventProducer.emit`` (its redaction and Avro encoding), decoded again."""
    cases = [c for c in _shared_cases() if c.kind == "secret" and len(c.parts) == 1]
    sent: list[bytes] = []
    producer = EventProducer.__new__(EventProducer)
    producer.redact, producer.schema_version, producer.host_id = True, None, "test-host"
    producer.send = lambda session_id, event_id, value: sent.append(value)
    leaked = []
    for case in cases:
        sent.clear()
        for event in place(SecretCase(case.id, case.text, case.must_not_appear), field):
            producer.emit(event)
        decoded = [decode_event(value) for value in sent]
        text = json.dumps(decoded, default=str, ensure_ascii=False)
        forms = (text, urllib.parse.unquote(text), html.unescape(text), _unescape(text))
        if any(m in form for m in case.must_not_appear for form in forms):
            leaked.append(case.id)
    assert leaked == []


def _atif_run(first: str, second: str, reply: str) -> dict:
    """An ATIF run: two tool outputs in a row (``first`` | ``second``), and a reply recorded with token ids."""

    def step(step_id: int, call: str, output: str, message: str, metrics: dict | None = None) -> dict:
        return {
            "step_id": step_id, "source": "agent", "message": message,
            "tool_calls": [{"tool_call_id": call, "function_name": "bash", "arguments": {"command": "./run.sh"}}],
            "observation": {"results": [{"source_call_id": call, "content": output}]},
            **({"metrics": metrics} if metrics else {}),
        }  # fmt: skip

    metrics = {"prompt_tokens": 3, "completion_tokens": 2, "prompt_token_ids": [1, 2, 3],
               "completion_token_ids": [7, 8], "logprobs": [-0.5, -0.25]}  # fmt: skip
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": "atif-redact",
        "agent": {"name": "harbor-agent", "version": "0.3", "model_name": "m-1"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "Migrate the database."},
            step(2, "c1", first, "Looking."),
            step(3, "c2", second, reply, metrics),
            {"step_id": 4, "source": "agent", "message": "Done."},
        ],
    }


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=password, split=st.sampled_from(SPLITS))
def test_an_imported_run_is_redacted_as_a_whole_session(tmp_path_factory, secret, split):
    """``trajlake import``'s path: a secret split across two tool outputs, and a reply whose token ids would spell
    a secret (the call falls back to message level)."""
    from producers.importers import import_trajectory

    path = tmp_path_factory.mktemp("atif") / "run.json"
    reply = f"Setting DB_PASSWORD={secret[::-1]} in service.env and restarting."
    path.write_text(json.dumps(_atif_run(split[0], split[1].format(s=secret), reply)))
    events = import_trajectory(path)
    text = json.dumps(events, default=str)
    assert secret not in text and secret[::-1] not in text
    calls = [e["payload"]["model_call"] for e in events if (e.get("payload") or {}).get("model_call")]
    redacted_calls = [c for c in calls if c.get("response_message_sha256") and c["record_level"] == "message"]
    assert redacted_calls and all(not c["completion_token_ids"] for c in redacted_calls)


def test_the_detector_layer_alone_finds_a_provider_token():
    """Kingfisher's catalog on its own (the other layers off): a GitHub token is found and replaced."""
    from producers.redact.text import only_layers

    token = "ghp_R7a9bX2kLm4nP8qT1vW5yZ3cD6fG0hJ2kL4m"
    with only_layers({"detector"}):
        out = redact_text(f"GITHUB_TOKEN={token}")
    assert token not in out and REDACTED in out


def test_text_with_undecodable_escapes_is_left_alone():
    text = "C:\\users\\xavier\\dir %zz &x; \\user"
    assert redact_text(text) == text and redact_value({"s": text}) == {"s": text}


def _unescape(text: str) -> str:
    """``text`` with JSON string escapes decoded (what a reader of the JSON would see)."""
    simple = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}

    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        return chr(int(code[1:], 16)) if code[0] == "u" else simple.get(code, code)

    return re.sub(r'\\(u[0-9a-fA-F]{4}|["\\/bfnrt])', one, text)
