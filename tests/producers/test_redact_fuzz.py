"""Generated input at the redaction boundary, and the public corpus's tune half.

The fuzzers build secrets of many shapes (provider formats, random credentials after names that say
secret, private key bodies, base64 of a token) inside random surroundings (JSON, shell, YAML, .env, URLs,
headers, code) and assert none survives; and ordinary texts (identifiers, ``$VAR``, ``${VAR}``,
placeholders) and assert they come back unchanged.
"""

from __future__ import annotations

import base64
import json
import string

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from benchmarks.secret_corpus_public import CorpusUnavailable, gitleaks_examples
from producers.redact import redact_json_text, redact_text, redact_value

_ALNUM = string.ascii_letters + string.digits


def _random(min_size: int, max_size: int, alphabet: str = _ALNUM) -> st.SearchStrategy[str]:
    # credentials are random: at least two digits and two letters, so no strategy yields a plain word
    return st.text(alphabet, min_size=min_size, max_size=max_size).filter(
        lambda s: sum(c.isdigit() for c in s) >= 2 and sum(c.isalpha() for c in s) >= 2 and len(set(s)) > 6
    )


_FORMATS = st.one_of(
    _random(36, 36).map(lambda s: "gh" + "p_" + s),
    _random(16, 16, string.ascii_uppercase + "234567").map(lambda s: "AK" + "IA" + s),
    _random(40, 60).map(lambda s: "glpat-" + s[:24]),
    _random(40, 48).map(lambda s: "s" + "k-proj-" + s),
    _random(90, 96).map(lambda s: "hv" + "s." + s),
    _random(33, 33).map(lambda s: "57" + "1234567:AA" + s),
    _random(50, 60).map(lambda s: "1//0" + s),
)
_NAMES = st.sampled_from(["DB_PASSWORD", "API_TOKEN", "client_secret", "STRIPE_KEY", "SESSION_COOKIE", "DB_PW"])


@st.composite
def _secret_in_context(draw: st.DrawFn) -> tuple[str, list[str]]:
    kind = draw(st.sampled_from(["format", "named", "base64", "pem"]))
    if kind == "format":
        secret = draw(_FORMATS)
        shown, secrets = secret, [secret]
    elif kind == "named":
        secret = draw(_random(14, 40))
        name = draw(_NAMES)
        shown, secrets = f"{name}={secret}", [secret]
        return draw(
            st.sampled_from(
                [
                    f"export {name}={secret}\n",
                    f"{name}={secret}\nDEBUG=false\n",
                    json.dumps({name.lower(): secret}),
                    f"config:\n  {name.lower()}: {secret}\n",
                    f'{name.lower()} = "{secret}"\n',
                ]
            )
        ), secrets
    elif kind == "base64":
        token = draw(_FORMATS)
        shown = base64.b64encode(token.encode()).decode()
        secrets = [shown]
    else:
        lines = [draw(_random(64, 64, _ALNUM + "+/")) for _ in range(draw(st.integers(2, 5)))]
        shown = "\n".join(["-----BEGIN PRIVATE" + " KEY-----", *lines, "-----END PRIVATE" + " KEY-----"])
        secrets = lines
    template = draw(
        st.sampled_from(
            [
                "{}",
                "token: {}",
                "curl -H 'Authorization: Bearer {}' https://api.example.com",
                '{{"output": "{}"}}',
                "$ cat creds\n{}\n$ ls",
                "value = '{}'",
                "https://example.com/?access_token={}&x=1",
                "<pre>{}</pre>",
            ]
        )
    )
    text = template.format(json.dumps(shown)[1:-1] if template.startswith('{"') else shown)
    if template.startswith('{"'):
        secrets = [json.dumps(s)[1:-1] for s in secrets]
    return text, secrets


@pytest.mark.fuzz
@settings(deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_secret_in_context(), st.text(max_size=40), st.text(max_size=40))
def test_generated_secrets_in_random_surroundings_are_redacted(case, before, after):
    text, secrets = case
    assume(not any(s in before + after for s in secrets))  # the secret is in its context, not alone
    # the surroundings end and start with a separator, as text around a secret does
    full = f"{before}\n{text}\n{after}"
    for out in (redact_text(full), redact_value({"payload": {"output": full}})["payload"]["output"]):
        assert [s for s in secrets if s in out] == [], out


_IDENT = st.from_regex(r"[a-z][a-z_]{2,20}", fullmatch=True)
_ORDINARY = st.one_of(
    _IDENT.map(lambda n: f"${n.upper()}"),
    _IDENT.map(lambda n: f"${{{n.upper()}}}"),
    _IDENT.map(lambda n: f"<{n.upper()}>"),
    st.sampled_from(["TOKEN", "xxx", "your-api-key", "changeme", "********", "<token>", "REPLACE_ME"]),
)
_ORDINARY_TEMPLATES = st.sampled_from(
    [
        "export API_TOKEN={}",
        "password: {}",
        'token = "{}"',
        "curl -u user:{} https://example.com",
        "--token {}",
        "Authorization: Bearer {}",
        '{{"password": "{}"}}',
        "DB_PASSWORD={}",
        "https://user:{}@db.example.com/app",
        "SESSION_KEY = '{}'",
    ]
)


@pytest.mark.fuzz
@settings(deadline=None)
@given(_ORDINARY_TEMPLATES, _ORDINARY)
def test_generated_references_and_placeholders_are_unchanged(template, value):
    text = template.format(value)
    assert redact_text(text) == text
    assert redact_json_text(json.dumps({"command": text})) == json.dumps({"command": text})


@pytest.mark.fuzz
@settings(deadline=None)
@given(st.from_regex(r"[a-z_][a-z0-9_]{0,30}(\.[a-z_][a-z0-9_]{0,20}){0,3}", fullmatch=True))
def test_generated_identifiers_are_unchanged(identifier):
    for text in (identifier, f"x = {identifier}", f"{identifier}({identifier})", f"def {identifier}(self):"):
        assert redact_text(text) == text


@pytest.fixture(scope="module")
def gitleaks_tune():
    try:
        examples = gitleaks_examples()
    except CorpusUnavailable as exc:
        pytest.skip(f"the gitleaks corpus cannot be had here (Go toolchain or module proxy): {exc}")
    return [e for e in examples if not e.held_out]


@pytest.mark.slow
def test_public_corpus_tune_half_recall_and_false_positives(gitleaks_tune):
    positives = [e for e in gitleaks_tune if e.positive]
    negatives = [e for e in gitleaks_tune if not e.positive]
    assert len(positives) > 1000 and len(negatives) > 100
    missed = [e for e in positives if any(s in redact_text(e.text) for s in e.secrets)]
    changed = [e for e in negatives if redact_text(e.text) != e.text]
    # the figures measured when the rules were last changed (docs/guarantees.md): no regression past them
    assert len(missed) / len(positives) <= 0.01, [e.text[:80] for e in missed[:5]]
    # gitleaks negatives include near-miss tokens (sntrys_/sntryu_ of a wrong length, settlemint tokens too short),
    # a csrf token and an access-key value: 11 of 208 are redacted (docs/guarantees.md); a 12th is a regression
    assert len(changed) <= 11, [e.text[:80] for e in changed[:5]]
