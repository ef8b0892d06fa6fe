"""Secret shapes and ordinary texts the first rules were not written for, one regression test each.

Every secret here is synthesized (random material from a seeded generator, recognisable prefixes
assembled at run time); every ordinary text is code, shell or documentation as people write it.
"""

from __future__ import annotations

import base64
import json
import random
import string

import pytest

from producers.redact import (
    SessionRedactor,
    forget_secret_values,
    redact_json_text,
    redact_text,
    redact_value,
    register_secret_values,
)

_rng = random.Random(20260301)


def _alnum(n: int) -> str:
    return "".join(_rng.choice(string.ascii_letters + string.digits) for _ in range(n - 1)) + _rng.choice("0123456789")


def _b64(n: int) -> str:
    return "".join(_rng.choice(string.ascii_letters + string.digits + "+/") for _ in range(n))


_GH = "gh" + "p_" + _alnum(36)
_PEM_HEAD, _PEM_END = "-----BEGIN RSA PRIVATE" + " KEY-----", "-----END RSA PRIVATE" + " KEY-----"
_BODY = [_b64(64) for _ in range(4)]
_PW = _alnum(6) + "/" + _alnum(7)

# (name, text, the substrings that must not survive)
LEAKS: list[tuple[str, str, tuple[str, ...]]] = [
    ("pem_body_in_later_quoted_strings",
     f'key = ("{_PEM_HEAD}\\n"\n       "{_BODY[0]}\\n"\n       "{_BODY[1]}\\n"\n       "{_PEM_END}")',
     (_BODY[0], _BODY[1])),
    ("pem_body_echoed_line_by_line",
     f'echo "{_PEM_HEAD}" > k.pem\necho "{_BODY[2]}" >> k.pem\necho "{_PEM_END}" >> k.pem', (_BODY[2],)),
    ("pem_body_without_header", "\n".join(_BODY) + "\nAbCd==\n", tuple(_BODY)),
    ("dotenv_stripe_key", f"STRIPE_KEY={(s1 := _alnum(32))}", (s1,)),
    ("dotenv_db_pw", f"DB_PW={(s2 := _alnum(14))}", (s2,)),
    ("dotenv_session_cookie", f"SESSION_COOKIE={(s3 := _alnum(40))}", (s3,)),
    ("aws_configure_set_secret", f"aws configure set aws_secret_access_key {(s4 := _b64(40))}", (s4,)),
    ("aws_configure_set_session_token", f"aws configure set aws_session_token {(s5 := _alnum(60))}", (s5,)),
    ("yaml_password_plain_words", "database:\n  user: app\n  password: correcthorsebatterystaple\n",
     ("correcthorsebatterystaple",)),
    ("yaml_password_with_ampersand", f"db:\n  password: {(s6 := _alnum(9))}&{(s6b := _alnum(6))}\n", (s6, s6b)),
    ("cookie_header", f"Cookie: sessionid={(s7 := _alnum(32))}; csrftoken={(s8 := _alnum(64))}", (s7, s8)),
    ("set_cookie_header", f"Set-Cookie: session={(s9 := _alnum(48))}; Path=/; HttpOnly", (s9,)),
    ("vault_token", f"token                hvs.{(s10 := _alnum(90))}\ntoken_duration       768h", (s10,)),
    ("telegram_bot_token",
     f"curl https://api.telegram.org/bot{(s11 := '7' + _rng.choice('123456789') + '12345678:AA' + _alnum(33))}/getMe",
     (s11,)),
    ("telegram_bot_token_bare", f"BOT={(s12 := '58' + '1234567:AA' + _alnum(33))}", (s12,)),
    ("google_refresh_token", f'{{"refresh_tok": "{(s13 := "1//0" + _alnum(60))}"}}', (s13,)),
    ("base64_of_a_token",
     f"$ echo -n $GH_TOKEN | base64\n{(s14 := base64.b64encode(_GH.encode()).decode())}\n", (s14,)),
    ("hex_of_a_token", f"$ xxd -p token.txt\n{(s15 := _GH.encode().hex())}\n", (s15,)),
    ("url_password_with_slash", f"git clone https://deploy:{_PW}@git.example.com/team/repo.git", (_PW,)),
    ("go_typed_assignment", f'var apiToken string = "{(s16 := _alnum(32))}"', (s16,)),
    ("makefile_assignment", f'DEPLOY_TOKEN ::= "{(s17 := _alnum(32))}"', (s17,)),
    ("xml_element", f"<apiToken>\n    {(s18 := _alnum(32))}\n</apiToken>", (s18,)),
    ("set_property_call", f'System.setProperty("SERVICE_TOKEN", "{(s19 := _alnum(32))}")', (s19,)),
    ("age_secret_key", f"# created\n{(s20 := 'AGE-SECRET-' + 'KEY-1' + _alnum(58).upper())}", (s20,)),
]  # fmt: skip

ORDINARY: list[str] = [
    'SESSION_KEY = "_auth_user_id"',
    'self.token = "IDENT"',
    'curl -u "$U:$P" https://ci.example.com/api/json',
    "npm publish --token ${NPM_TOKEN}",
    "usage: deploy [-h] [--token TOKEN] [--password PASSWORD]",
    "docker run --name mysql -p3306:3306 -d mysql:8",
    "Connect with mysql://user:password@localhost:3306/app as shown above.",
    "postgres://user:<password>@localhost/db",
    "redis://:${REDIS_PASSWORD}@redis:6379/0",
    "export GITHUB_TOKEN=$(gh auth token)",
    'curl -H "Authorization: Bearer $TOKEN" https://api.example.com',
    "Authorization: Bearer <token>",
    "API_KEY=your-api-key",
    "SECRET=xxx",
    'password = os.environ["DB_PASSWORD"]',
    "password: str",
    "token: Optional[str] = None",
    '"password": "********"',
    "GITHUB_TOKEN=ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "DB_PASS=changeme",
    "Cookie: theme=dark; lang=en",
    "password_hash = make_password(raw_password)",
    "const STORAGE_KEY = 'vue-todomvc'",
    "auth = HTTPBasicAuth(user, password)",
    "    password: ${{ secrets.DB_PASSWORD }}",
    "aws configure set region us-east-1",
    "git config --global user.name 'Dev Example'",
    "set -euo pipefail",
    "PRIMARY_KEY = 'id'",
    "cache_key = f'user:{user_id}'",
    "kubectl get secret db -o jsonpath='{.data.password}' | base64 -d",
]


@pytest.mark.parametrize("name, text, secrets", LEAKS, ids=[case[0] for case in LEAKS])
def test_shape_is_redacted(name, text, secrets):
    for out in (redact_text(text), json.loads(redact_json_text(json.dumps({"output": text})))["output"]):
        assert [s for s in secrets if s in out] == [], out


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_unchanged(text):
    assert redact_text(text) == text
    assert redact_value({"payload": {"command": text}}) == {"payload": {"command": text}}


def _stream(texts: list[str], field: str = "output") -> list[str]:
    redactor = SessionRedactor()
    return [redactor.redact_event({"payload": {field: text}})["payload"][field] for text in texts]


@pytest.mark.parametrize("cut", [4, 9, 20, 33])
def test_token_split_across_two_events_is_redacted(cut):
    chunks = [f"cloning with {_GH[:cut]}", f"{_GH[cut:]} done"]
    out = _stream(chunks)
    joined = "".join(out)
    assert _GH not in joined and _GH[:cut] not in out[0] and _GH[cut:] not in out[1], out
    assert out[1].endswith(" done")  # only the token's continuation went


def test_value_after_a_name_in_the_previous_event_is_redacted():
    token = _alnum(32)
    out = _stream(["export API_TOKEN=", f"{token}\nnext"])
    assert token not in "".join(out) and out[1].endswith("\nnext")
    out = _stream(["Authorization: Bearer ", f"{token} HTTP/1.1"])
    assert token not in "".join(out)


def test_private_key_body_in_the_following_events_is_redacted():
    out = _stream(
        [f"$ cat id_rsa\n{_PEM_HEAD}\n{_BODY[0]}\n", f"{_BODY[1]}\n{_BODY[2]}\n", f"{_BODY[3]}\n{_PEM_END}\n$ ls"]
    )
    assert not any(line in "".join(out) for line in _BODY)
    assert out[2].endswith(f"{_PEM_END}\n$ ls")
    after = _stream(
        [f"{_PEM_HEAD}\n{_BODY[0]}\n{_PEM_END}\n", "a3f9c2e1d4b5a6f7e8d9c0b1a2f3e4d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a0f1e2"]
    )
    assert after[1].startswith("a3f9c2e1")  # the block was closed: what follows is ordinary


def test_ordinary_streams_are_unchanged():
    chunks = [
        "Collecting requests\n",
        "  Downloading requests-2.32.3-py3-none-any.whl (64 kB)\n",
        "Successfully installed",
    ]
    assert _stream(chunks) == chunks


@pytest.fixture
def task_token():
    token = "".join(_rng.choice("0123456789abcdef") for _ in range(32))
    register_secret_values([token])
    yield token
    forget_secret_values([token])


def _fold(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


@pytest.mark.parametrize(
    "transform",
    [
        lambda t: t[::-1],
        lambda t: t.upper(),
        lambda t: base64.b64encode(t.encode()).decode(),
        lambda t: base64.b64encode(t.encode()).decode().rstrip("="),
        lambda t: base64.b64encode(b"TL_TASK_TOKEN=" + t.encode() + b"\n").decode(),
        lambda t: base64.b64encode(b"X=" + t.encode()).decode(),
        lambda t: base64.b64encode(b"Y" + t.encode()).decode(),
        lambda t: base64.urlsafe_b64encode(b"\xfb" + t.encode()).decode(),
        lambda t: t.encode().hex(),
        lambda t: _fold(t, 5),
        lambda t: _fold(base64.b64encode(t.encode()).decode(), 8),
        lambda t: " ".join(t),
        lambda t: "\r\n".join(t[i : i + 16] for i in range(0, len(t), 16)),
    ],
    ids=["rev", "upper", "b64", "b64-nopad", "b64-env-file", "b64-shift2", "b64-shift1", "b64-urlsafe", "hex",
         "fold5", "b64-fold8", "spaced", "crlf-split"],
)  # fmt: skip
def test_task_token_transforms_are_redacted(task_token, transform):
    shown = transform(task_token)
    out = redact_text(f"$ some command\n{shown}\nexit 0")
    compact = "".join(out.split())
    probe = "".join(shown.split())
    assert probe[4:-4] not in compact, out  # no long piece of the transformed token is left
    assert out.startswith("$ some command\n") and out.endswith("\nexit 0")


def test_transforms_of_a_forgotten_token_are_left_alone(task_token):
    encoded = base64.b64encode(task_token.encode()).decode()
    forget_secret_values([task_token])
    assert redact_text(encoded) == encoded


# -- held-out probes: where a token sits, and tokens of letters only ---------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_LETTERS = st.text(st.sampled_from(string.ascii_letters), min_size=34, max_size=34).filter(
    lambda s: sum(c.isupper() for c in s) >= 8 and sum(c.islower() for c in s) >= 8
)


@given(body=_LETTERS, before=st.sampled_from(["", "token: ", "HF=", "using "]))
@hypothesis_settings(max_examples=60, deadline=None)
def test_a_letters_only_token_behind_a_label_is_redacted(body: str, before: str) -> None:
    """Hugging Face tokens are ``hf_`` and 34 letters, no digit (held: the detector layer knows them)."""
    token = "h" + "f_" + body
    assert body[6:20] not in redact_text(f"{before}{token} ok"), token


@given(
    token=st.sampled_from([_GH, "sb" + "p_" + "4f9a2c7e1b8d3f6a0c5e9b2d7f1a4c8e3b6d0f9a", "glpat-" + _alnum(20)]),
    extension=st.sampled_from(["json", "txt", "env", "pem", "log"]),
    where=st.sampled_from(["/tmp/creds/{}", "cat {} | head", "{}"]),
)
@hypothesis_settings(max_examples=40, deadline=None)
def test_a_token_in_a_file_name_is_redacted(token: str, extension: str, where: str) -> None:
    """A token followed by ``.json`` read as a file name (``name.ext``) and was left whole."""
    text = where.format(f"{token}.{extension}")
    out = redact_text(text)
    assert token[len(token) // 3 :] not in out and out.endswith(f".{extension}" + text.split(extension)[-1]), out


@pytest.mark.parametrize(
    "text",
    ["setup.py", "README.md", "src/trajlake_events.parquet", "model-00001-of-00004.safetensors", "report_final.json"],
)
def test_ordinary_file_names_are_unchanged(text: str) -> None:
    assert redact_text(text) == text


@given(
    token=st.sampled_from([_GH, "sk-" + "proj-" + _alnum(40), "xox" + "b-" + "123456789012-" + _alnum(24)]),
    where=st.sampled_from(["extra", "payload", "json"]),
    around=st.sampled_from(["{}", "key_{}", "{}=1"]),
)
@hypothesis_settings(max_examples=40, deadline=None)
def test_a_secret_in_a_dict_key_is_redacted(token: str, where: str, around: str) -> None:
    """Keys were never looked at: an attribute named after a token (an OTLP attribute key, a JSON key) kept it."""
    key = around.format(token)
    event: dict = {"event_type": "env_feedback", "session_id": "s", "payload": {"output": "ok"}, "extra": {}}
    if where == "extra":
        event["extra"] = {key: "1", "kept": "yes"}
    elif where == "payload":
        event["payload"] = {"output": "ok", "meta": {key: 1}}
    else:
        event["payload"] = {"output": json.dumps({key: "v", "other": 2})}
    out = redact_value(event)
    assert token[8:] not in json.dumps(out), out
    if where == "extra":
        assert out["extra"]["kept"] == "yes" and len(out["extra"]) == 2
    if where == "json":
        assert json.loads(out["payload"]["output"])["other"] == 2


def test_ordinary_keys_are_unchanged() -> None:
    event = {"payload": {"output": "ok", "meta": {"sha256_" + "ab" * 32: 1, "requestId": 2, "x-trace": 3}}}
    assert redact_value(event) == event
