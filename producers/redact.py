"""Secret redaction applied to every string an event carries.

Runs on the sandbox host before an event leaves it (``EventProducer.encode``), on
imported runs, and again before export (:func:`redact_record`). Three layers:

1. **Values the host injected.** The fleet registers every per-task secret it hands a
   sandbox (:func:`register_secret_values`); those exact strings are replaced wherever
   they appear, whatever surrounds them.
2. **Token formats** with a fixed shape (AWS ``AKIA…``, GitHub ``ghp_…``, Stripe
   ``sk_live_…``, PEM/PGP private key blocks, JWTs, webhooks, SAS signatures, URL
   credentials, ``curl -u``, ``mysql -p`` …), each behind a cheap literal pre-check.
3. **Names that say secret**: ``NAME=value``, ``name: value``, ``"name": "value"`` where the
   name's last part is ``password``/``secret``/``token``/``api_key``/``auth``… Values that are
   code (``password = user.password``, ``token = cast(…)``) or placeholders
   (``password='password'``, ``SECRET_KEY='test-secret-key'``) are left alone, because
   agents' patches and test files are full of them and must survive byte-identical.

Structured values are redacted as values, never as serialized text: a JSON string
(tool ``arguments``) is parsed, its string values (and the values of secret-named keys)
redacted, and re-serialized only when something changed, so it stays valid JSON with the
same structure. The rules were chosen by ``trajlake bench redaction`` (recall on a corpus
of fake secrets in every field, false positives on real recorded runs).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import itertools
import json
import re
import string
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import ahocorasick_rs
import pyarrow as pa

from producers.errors import RedactionError

REDACTED = "[REDACTED]"

# -- 1. exact values injected by the host ---------------------------------------------------------------------

# Bound on remembered values: a host registers one set per sandbox; the oldest are forgotten first.
MAX_SECRET_VALUES = 4096
# Shorter values would match ordinary text; the fleet's tokens are 32 hex digits.
MIN_SECRET_VALUE_LEN = 8

_values_lock = threading.Lock()
_secret_values: OrderedDict[str, None] = OrderedDict()
# One automaton over the registered values, rebuilt when they change (a host has a few dozen live at once).
_values_automaton: ahocorasick_rs.AhoCorasick | None = None


def register_secret_values(values: Iterable[str]) -> None:
    """Remember secret values this host injected (per-task tokens), to redact them exactly wherever they appear.

    Args:
        values: the secret strings; those shorter than ``MIN_SECRET_VALUE_LEN`` are ignored. The
            ``MAX_SECRET_VALUES`` most recent are kept.
    """
    global _values_automaton
    with _values_lock:
        for value in values:
            if isinstance(value, str) and len(value) >= MIN_SECRET_VALUE_LEN:
                _secret_values[value] = None
                _secret_values.move_to_end(value)
        while len(_secret_values) > MAX_SECRET_VALUES:
            _secret_values.popitem(last=False)
        _values_automaton = None


def forget_secret_values(values: Iterable[str]) -> None:
    """Stop redacting ``values`` specially (the session that used them has ended and its events are sent)."""
    global _values_automaton
    with _values_lock:
        for value in values:
            _secret_values.pop(value, None)
        _values_automaton = None


def _injected() -> ahocorasick_rs.AhoCorasick | None:
    global _values_automaton
    if not _secret_values:
        return None
    automaton = _values_automaton
    if automaton is None:
        with _values_lock:
            if _secret_values:
                # leftmost-longest: a value containing another is removed whole
                automaton = ahocorasick_rs.AhoCorasick(
                    list(_secret_values), matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_LONGEST
                )
            _values_automaton = automaton
    return automaton


def _replace_injected(text: str, automaton: ahocorasick_rs.AhoCorasick) -> str:
    matches = automaton.find_matches_as_indexes(text)
    if not matches:
        return text
    pieces: list[str] = []
    position = 0
    for _, start, end in matches:
        pieces += [text[position:start], REDACTED]
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


# -- 3. names that say secret ------------------------------------------------------------------------------

# The last part of a name that makes it a secret (``DB_PASS``, ``GITHUB_TOKEN``, ``client_secret`` …).
_SECRET_LAST = frozenset({
    "password", "passwd", "passphrase", "pwd", "pass", "secret", "token", "auth", "authorization", "credential",
    "credentials", "creds", "apikey", "secretkey", "privatekey", "accesskey", "accountkey", "sas",
})  # fmt: skip
# One-word names ending so (``PGPASSWORD``, ``accesstoken``).
_SECRET_ENDINGS = ("password", "passwd", "passphrase", "secret", "token", "apikey")
# ``<word>_key`` names that are secrets (``api_key``, ``AccountKey``, ``AWS_SECRET_ACCESS_KEY`` …).
_KEY_QUALIFIERS = frozenset({
    "api", "access", "private", "account", "secret", "signing", "master", "encryption", "decryption", "shared",
    "client", "app", "service", "consumer", "auth", "session", "ssh", "gpg", "pgp", "license", "webhook",
    "subscription", "admin", "deploy", "root",
})  # fmt: skip
# A last part that names something about a secret, not the secret (``password_validators``, ``TL_SECRETS_FILE``).
_NOT_SECRET_LAST = frozenset({
    "file", "files", "path", "paths", "dir", "name", "names", "type", "types", "count", "len", "length", "size",
    "limit", "ids", "url", "uri", "endpoint", "env", "var", "validator", "validators", "list", "prefix", "suffix",
    "format", "method", "mode", "policy", "field", "fields", "column", "header", "hash", "expires", "expiry",
    "expiration", "ttl", "min", "max", "index", "kind", "enabled", "required", "label", "help", "hint", "version",
    "rotation", "source", "provider", "scope", "scopes", "budget", "usage", "tokens", "class", "regex", "pattern",
    "reset", "changed", "strength", "timeout", "at", "manager", "store", "backend", "option",
})  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NAME_PARTS = re.compile(r"[^a-z0-9]+")


@functools.lru_cache(maxsize=8192)  # names repeat (event fields, env variables): decide each once
def is_secret_name(name: str) -> bool:
    """Whether a variable, option, header or JSON key name says its value is a secret.

    ``DB_PASS``, ``GITHUB_TOKEN``, ``SecretAccessKey``, ``private_key_id`` and ``X-Api-Key`` do;
    ``author_name``, ``new_tokens``, ``password_validators`` and ``TL_SECRETS_FILE`` do not.
    """
    if not isinstance(name, str) or len(name) > 64:
        return False
    parts = [p.rstrip("0123456789") for p in _NAME_PARTS.split(_CAMEL.sub("_", name).lower()) if p]
    parts = [p for p in parts if p]
    if not parts:
        return False
    last = parts[-1]
    if last == "id" and parts[-3:-1] == ["private", "key"]:
        return True  # a GCP service account's private_key_id
    if last in _NOT_SECRET_LAST or last == "id":
        return False
    if last in _SECRET_LAST or last.endswith(_SECRET_ENDINGS):
        return True
    if last == "key" and len(parts) > 1 and parts[-2] in _KEY_QUALIFIERS:
        return True
    return any(p in ("password", "passwd", "secret") for p in parts[:-1])


_PLACEHOLDER_WORDS = (
    "test", "example", "dummy", "fake", "placeholder", "changeme", "secret", "password", "your", "xxx", "sample",
    "redacted", "token", "insert", "replace", "here", "foo", "bar", "none",
)  # fmt: skip
_WORDY = re.compile(r"[A-Za-z_ .-]*")


def _is_placeholder(value: str) -> bool:
    """Values no one would leak: empty, one repeated character, templates, or wordy placeholders."""
    if len(value) < 4 or REDACTED in value or len(set(value)) <= 2:
        return True
    if value[0] in "$%<{" or value.startswith("***"):
        return True  # $VAR, %(var)s, <your-key>, {{ template }}
    low = value.lower()
    return _WORDY.fullmatch(value) is not None and any(w in low for w in _PLACEHOLDER_WORDS)


def _looks_random(value: str) -> bool:
    """A value with the texture of a credential (digits, symbols or long mixed case), not a word or identifier."""
    if len(value) < 6:
        return False
    if any(c.isdigit() for c in value) or any(c in "+/=!@#%^&*~" for c in value):
        return True
    return len(value) >= 12 and any(c.isupper() for c in value) and any(c.islower() for c in value)


_CODE_WORDS = frozenset({"none", "null", "nil", "true", "false", "undefined", "self", "cls", "os", "this"})


# -- 2. token formats ------------------------------------------------------------------------------------

Replacement = str | Callable[[re.Match[str]], str]


def _secret_group(match: re.Match[str]) -> str:
    """Replace only the group named ``s`` (the secret) inside the match."""
    start, end = match.span("s")
    base = match.start()
    text = match.group(0)
    return text[: start - base] + REDACTED + text[end - base :]


def _basic_credentials(match: re.Match[str]) -> str:
    # "Basic <b64>" outside an Authorization header is a credential only when it decodes to user:password.
    token = match.group("s")
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return match.group(0)
    return _secret_group(match) if ":" in decoded and decoded.isprintable() else match.group(0)


def _random_group(match: re.Match[str]) -> str:
    return _secret_group(match) if _looks_random(match.group("s")) else match.group(0)


def _name_says_secret_value(key: str, sep: str, quoted: bool, value: str) -> bool:
    """``NAME=value`` / ``name: value`` / ``"name": "value"``: whether ``value`` is a secret to redact."""
    if not is_secret_name(key) or _is_placeholder(value):
        return False
    if quoted:
        return True
    # unquoted: a literal only when it looks like one (DB_PASS=x is; password = other_name is not)
    if value.lower() in _CODE_WORDS:
        return False
    return (sep == "=" and key.upper() == key) or _looks_random(value)


_PEM = (
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"[^\"]*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|(?=\\*\")|\Z)"
)
_B64 = r"[A-Za-z0-9+/]"
# Token formats start at a word boundary, or right after an escaped newline or tab ("…\\nghp_…" in JSON text).
_AT = r"(?:\b|(?<=\\[nrt]))"
_TOK = r"[A-Za-z0-9_-]"

_NAME_TRIGGERS = ("pass", "pwd", "secret", "token", "key", "auth", "credential", "creds", "sas")

# (literal triggers; pattern; replacement; flags). A rule runs only when one of its triggers occurs: lower-case
# triggers are looked for in the lower-cased text, others (``SK``, ``AC``) as they are.
_RULE_SPECS: list[tuple[tuple[str, ...], str, Replacement, int]] = [
    (("private key",), _PEM, REDACTED, re.S),
    # Authorization headers: whatever follows the scheme is the credential.
    (("authorization", "proxy-authorization"),
     r"(?i)\b(?:proxy-)?authorization\\*[\"']?\s*[:=]\s*\\*[\"']?(?:(?:bearer|basic|token|digest|negotiate|"
     r"bot|apikey|key|sso-key|hmac)\s+)?(?P<s>[^\s\"'\\,;]{4,})", _secret_group, 0),
    (("bearer",), r"(?i)\bbearer\s+(?P<s>[A-Za-z0-9._~+/=-]{8,})", _random_group, 0),
    (("basic",), r"(?i)\bbasic\s+(?P<s>[A-Za-z0-9+/]{8,}={0,2})", _basic_credentials, 0),
    # URL credentials (scheme://user:pw@host, redis://:pw@host) and secret query parameters.
    (("://",), r"(?i)\b[a-z][a-z0-9+.-]*://[^\s:/@\"'<>]*:(?P<s>[^\s@/\"'<>]+)@", _secret_group, 0),
    (("sig=", "signature=", "token=", "key=", "secret=", "password=", "credential="),
     r"(?i)[?&;](?:sig|signature|x-amz-signature|x-amz-security-token|x-amz-credential|access_token|"
     r"refresh_token|id_token|token|api_key|apikey|key|client_secret|secret|password|code|auth)=(?P<s>[^&#\s\"'<>]+)",
     _random_group, 0),
    (("hooks.slack.com",), r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<s>[A-Za-z0-9_/-]{8,})",
     _secret_group, 0),
    (("/api/webhooks/",), r"(?i)discord(?:app)?\.com/api/webhooks/(?P<s>[0-9]+/[A-Za-z0-9_-]+)", _secret_group, 0),
    # Command-line credentials.
    (("curl",),
     r"\bcurl\b[^\n|;&]*?\s(?:-u|--user)(?:\s+|=)?[\"']?[^\s:\"']*:(?P<s>[^\s\"']+)", _secret_group, 0),
    (("mysql",), r"\bmysql(?:dump|admin|sh|import|check)?\b[^\n|;&]*?\s-p(?P<s>[^\s\"'-][^\s\"']*)", _secret_group, 0),
    (("sshpass",), r"\bsshpass\s+-p\s*[\"']?(?P<s>[^\s\"']+)", _secret_group, 0),
    (("redis-cli",), r"\bredis-cli\b[^\n|;&]*?\s-a\s+[\"']?(?P<s>[^\s\"']+)", _secret_group, 0),
    (("--pass", "--token", "--api-key", "--secret", "--auth"),
     r"(?i)(?<![\w-])--(?:password|passwd|pass|token|api-key|apikey|secret|api-secret|client-secret|auth-token|"
     r"access-token)"
     r"(?:=|\s+)[\"']?(?P<s>[^\s\"']+)", _secret_group, 0),
    (("password",), r"(?i)\bmachine\s+\S+\s+login\s+\S+\s+password\s+(?P<s>\S+)", _secret_group, 0),
    # Provider token formats.
    (("akia", "asia", "aroa", "aida", "agpa", "anpa", "aipa"),
     _AT + r"(?P<s>(?:AKIA|ASIA|AROA|AIDA|AGPA|ANPA|ANVA|AIPA)[0-9A-Z]{16})\b", _secret_group, 0),
    (("fwogzxivyxdz", "fqogzxivyxdz", "iqojb3jpz2lu"),
     rf"(?P<s>(?:FwoGZXIvYXdz|FQoGZXIvYXdz|IQoJb3JpZ2lu){_B64}{{40,}}={{0,2}})", _secret_group, 0),
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), _AT + r"(?P<s>gh[pousr]_[A-Za-z0-9]{30,})\b", _secret_group, 0),
    (("github_pat_",), _AT + r"(?P<s>github_pat_[A-Za-z0-9_]{30,})", _secret_group, 0),
    (("glpat-", "gldt-", "glptt-", "glrt-", "glsoat-", "glcbt-", "glft-", "glimt-", "gloas-"),
     _AT + rf"(?P<s>gl(?:pat|dt|ptt|rt|soat|cbt|ft|imt|oas)-{_TOK}{{20,}})", _secret_group, 0),
    (("xox", "xapp-"), _AT + r"(?P<s>(?:xox[abposre]|xapp)-[A-Za-z0-9-]{10,})", _secret_group, 0),
    (("sk_live_", "rk_live_", "sk_test_", "rk_test_", "whsec_"),
     _AT + r"(?P<s>(?:(?:sk|rk)_(?:live|test)|whsec)_[A-Za-z0-9]{16,})", _secret_group, 0),
    (("sk-",), _AT + rf"(?P<s>sk-(?=[A-Za-z_-]*[0-9])(?:ant-|proj-|svcacct-|admin-)?{_TOK}{{20,}})", _secret_group, 0),
    (("sg.",), _AT + rf"(?P<s>SG\.{_TOK}{{16,}}\.{_TOK}{{16,}})", _secret_group, 0),
    (("npm_",), _AT + r"(?P<s>npm_[A-Za-z0-9]{36})\b", _secret_group, 0),
    (("hf_",), _AT + r"(?P<s>hf_[A-Za-z0-9]{30,})\b", _secret_group, 0),
    (("pypi-",), _AT + rf"(?P<s>pypi-{_TOK}{{50,}})", _secret_group, 0),
    # Twilio API key and account SIDs
    (("SK",), r"(?:(?<![A-Za-z0-9])|(?<=\\[nrt]))(?P<s>SK[0-9a-f]{32})(?![A-Za-z0-9])", _secret_group, 0),
    (("AC",), r"(?:(?<![A-Za-z0-9])|(?<=\\[nrt]))(?P<s>AC[0-9a-f]{32})(?![A-Za-z0-9])", _secret_group, 0),
    (("aiza",), _AT + rf"(?P<s>AIza{_TOK}{{35}})", _secret_group, 0),
    (("ya29.",), _AT + rf"(?P<s>ya29\.{_TOK}{{20,}})", _secret_group, 0),
    (("gocspx-",), _AT + rf"(?P<s>GOCSPX-{_TOK}{{24,}})", _secret_group, 0),
    (("dapi",), _AT + r"(?P<s>dapi[0-9a-f]{32})\b", _secret_group, 0),
    (("dop_v1_", "doo_v1_", "dor_v1_"), _AT + r"(?P<s>do[por]_v1_[0-9a-f]{64})\b", _secret_group, 0),
    (("shpat_", "shpss_", "shpca_", "shppa_"), _AT + r"(?P<s>shp(?:at|ss|ca|pa)_[0-9a-fA-F]{32})\b", _secret_group, 0),
    (("eyj",), _AT + rf"(?P<s>eyJ{_TOK}{{8,}}\.{_TOK}{{8,}}\.{_TOK}{{8,}})", _secret_group, 0),
]  # fmt: skip


_RULES: list[tuple[re.Pattern[str], Replacement]] = [
    (re.compile(source, flags), replacement) for _, source, replacement, flags in _RULE_SPECS
]

# Names that say secret contain one of these; each occurrence anchors a look for ``NAME<sep>value``.
_NAME_STEMS = ("pass", "pwd", "secret", "token", "key", "auth", "cred", "sas")
# What follows a stem: the rest of the name, the closing quote of a quoted name, the separator, the value.
_NAME_TAIL = re.compile(
    r"[\w.-]{0,63}(?P<qk>\\*[\"'])?(?P<sep>(?(qk)\s*[:=]\s*|(?:[ \t]*=[ \t]*|:[ \t]+|[ \t]+:[ \t]+)))"
    r"(?P<q>\\*[\"'])?(?P<s>(?(q)(?:(?!(?P=q))[^\n])*|[^\s'\"`,;&|(){}\[\]<>\\]++(?![(\[])))(?(q)(?P=q))"
)
_KEY_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

# Every rule needs one of these literals, so most strings cost one Aho-Corasick pass. Lower-case ones are
# looked for in the lower-cased text, the others (``SK``, ``AC``) as they are.
TRIGGERS: tuple[str, ...] = tuple(sorted({t for triggers, _, _, _ in _RULE_SPECS for t in triggers} | set(_NAME_STEMS)))
_LOWER_TRIGGERS = [t for t in TRIGGERS if t == t.lower()]
_AUTOMATON = ahocorasick_rs.AhoCorasick(_LOWER_TRIGGERS)
_TRIGGER_RULES = [
    frozenset(i for i, (triggers, _, _, _) in enumerate(_RULE_SPECS) if t in triggers) for t in _LOWER_TRIGGERS
]
_TRIGGER_IS_STEM = [t in _NAME_STEMS for t in _LOWER_TRIGGERS]
_CASED_TRIGGERS = [
    (t, frozenset(i for i, (triggers, _, _, _) in enumerate(_RULE_SPECS) if t in triggers))
    for t in TRIGGERS
    if t != t.lower()
]


def _lower(text: str) -> str:
    low = text.lower()
    # a few non-ASCII characters lower-case to two; positions must stay those of ``text``
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


def _may_contain_secret(text: str) -> bool:
    if _AUTOMATON.find_matches_as_indexes(_lower(text)) or any(trigger in text for trigger, _ in _CASED_TRIGGERS):
        return True
    injected = _injected()
    return injected is not None and bool(injected.find_matches_as_indexes(text))


def _scan(text: str) -> tuple[set[int], list[int]]:
    """The rules ``text`` triggers, and where name stems start in it."""
    rules: set[int] = set()
    stems: list[int] = []
    for index, start, _ in _AUTOMATON.find_matches_as_indexes(_lower(text), overlapping=True):
        rules |= _TRIGGER_RULES[index]
        if _TRIGGER_IS_STEM[index]:
            stems.append(start)
    for trigger, indices in _CASED_TRIGGERS:
        if trigger in text:
            rules |= indices
    return rules, stems


def _redact_names(text: str, stems: list[int]) -> str:
    """Redact the value of every ``NAME=value``, ``name: value`` and ``"name": "value"`` whose name says secret."""
    spans: list[tuple[int, int]] = []
    done = -1
    for stem in sorted(stems):
        if stem < done:
            continue  # a second stem of a name already looked at (auth_token)
        match = _NAME_TAIL.match(text, stem)
        if match is None:
            continue
        start = stem
        while start > 0 and stem - start < 64 and text[start - 1] in _KEY_CHARS:
            start -= 1
        escaped_line = start > 1 and text[start - 1] == "\\" and text[start] in "nrt"
        if escaped_line:
            start += 1  # a name at the start of a JSON-escaped line: "…\nDB_PASS=…"
        opening = match.group("qk")
        if opening is not None:
            if text[max(0, start - len(opening)) : start] != opening:
                continue
        elif not escaped_line and start > 0 and (text[start - 1] == "\\" or text[start - 1] in _KEY_CHARS):
            continue  # inside a longer word or an escape
        done = match.end()
        key = text[start : match.start("qk") if opening is not None else match.start("sep")]
        value = match.group("s")
        if _name_says_secret_value(key, match.group("sep"), match.group("q") is not None, value):
            spans.append(match.span("s"))
    if not spans:
        return text
    pieces: list[str] = []
    position = 0
    for begin, end in spans:
        pieces += [text[position:begin], REDACTED]
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


def _redact_text(text: str) -> str:
    injected = _injected()
    if injected is not None:
        text = _replace_injected(text, injected)
    rules, stems = _scan(text)
    if stems:
        text = _redact_names(text, stems)
    for index in sorted(rules):
        pattern, replacement = _RULES[index]
        text = pattern.sub(replacement, text)
    return text


def redact_text(text: str) -> str:
    """Return ``text`` with every secret-looking span replaced by ``[REDACTED]``.

    Only the secret is replaced (``DB_PASS=[REDACTED]``, ``"password": "[REDACTED]"``), so the
    surrounding text, quotes and JSON escapes stay as they were. Idempotent.
    """
    return _redact_text(text) if text else text


# -- structured values ---------------------------------------------------------------------------------------

# Values nested deeper are not walked: JSON text that deep is redacted by the text rules (which keep it
# valid JSON), a Python value that deep is refused (``RedactionError``); never a RecursionError, never a leak.
MAX_DEPTH = 200


class _TooDeep(Exception):
    pass


def _redact_parsed(value: Any, depth: int, suspects: set[int] | None = None) -> Any:
    """Redact inside ``value``; with ``suspects``, only strings whose ``id`` is in it can hold a secret."""
    if type(value) is str:
        if suspects is not None and id(value) not in suspects:
            return value
        return _redact_json_text(value, depth + 1)
    if depth > MAX_DEPTH:
        raise _TooDeep
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if type(item) is str and is_secret_name(key) and not _is_placeholder(item):
                out[key] = REDACTED
            else:
                out[key] = _redact_parsed(item, depth + 1, suspects)
        return out
    if isinstance(value, list | tuple):
        return type(value)(_redact_parsed(item, depth + 1, suspects) for item in value)
    if isinstance(value, str):
        return _redact_json_text(str(value), depth + 1)
    return value


def redact_json_text(text: str) -> str:
    """Redact a string that may hold JSON: parsed values when it is JSON, text rules otherwise.

    The result of a JSON input is still valid JSON with the same structure (keys, nesting,
    types); it is re-serialized only when something was redacted, otherwise returned as is.
    """
    return _redact_json_text(text, 0)


def _redact_json_text(text: str, depth: int) -> str:
    if not text or not _may_contain_secret(text):
        return text
    stripped = text.strip()
    if depth <= MAX_DEPTH and stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        try:
            parsed = json.loads(stripped)
            redacted = _redact_parsed(parsed, depth)
            return text if redacted == parsed else json.dumps(redacted, ensure_ascii=False)
        except (ValueError, RecursionError, _TooDeep):
            pass  # not JSON, or too deep to walk: the text rules keep valid JSON valid
    return _redact_text(text)


def _collect(value: Any, strings: list[str]) -> bool:
    """Gather the strings inside ``value``; True when a secret-named key holds a string value.

    Iterative (no recursion limit) and typed by ``type(...) is`` checks: it runs on every event.
    """
    hit = False
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            strings.append(item)
        elif kind is dict:
            for key, child in item.items():
                if type(child) is str:
                    strings.append(child)
                    if not hit and is_secret_name(key) and not _is_placeholder(child):
                        hit = True
                elif type(child) in _CONTAINERS:
                    stack.append(child)
        elif kind in _CONTAINERS:
            stack.extend(child for child in item if type(child) in _CONTAINERS or type(child) is str)
        elif isinstance(item, str | dict | list | tuple):  # subclasses: the slow path
            stack.append(_plain(item))
    return hit


_CONTAINERS = (dict, list, tuple)


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return dict(value)
    return list(value)


def redact_value(value: Any) -> Any:
    """Redact strings anywhere inside nested dicts, lists and tuples (an event, an export record).

    JSON strings are redacted as parsed values (:func:`redact_json_text`); a dict entry whose key
    names a secret (``"password": "hunter2"``) has its value replaced. The common case costs one
    Aho-Corasick pass over the value's joined text, and returns ``value`` itself when nothing in it
    can be a secret.

    Raises:
        RedactionError: ``value`` is nested deeper than ``MAX_DEPTH`` (it is refused, not passed on).
    """
    strings: list[str] = []
    key_hit = _collect(value, strings)
    joined = "\x00".join(strings)  # no trigger contains NUL: a match lies within one string
    matches = _AUTOMATON.find_matches_as_indexes(_lower(joined))
    suspects: set[int] | None = None
    injected = _injected()
    if any(trigger in joined for trigger, _ in _CASED_TRIGGERS) or (
        injected is not None and injected.find_matches_as_indexes(joined)
    ):
        pass  # rare: every string is looked at
    elif not matches:
        if not key_hit:
            return value
        suspects = set()
    else:
        # the strings holding a trigger, found from match positions without scanning each string again
        starts = list(itertools.accumulate((len(text) + 1 for text in strings), initial=0))
        suspects = {id(strings[bisect.bisect_right(starts, start) - 1]) for _, start, _ in matches}
    try:
        return _redact_parsed(value, 0, suspects)
    except (_TooDeep, RecursionError) as exc:
        raise RedactionError(f"value nested deeper than {MAX_DEPTH} levels; refusing to pass it on unredacted") from exc


redact_event = redact_value
redact_record = redact_value


def redact_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """:func:`redact_json_text` over an Arrow string column, vectorized.

    One Aho-Corasick pass (polars ``contains_any``) over the whole column finds the
    values that may hold a secret; only those go through the regular expressions.
    """
    import polars as pl

    series = pl.Series(values)
    # cased triggers (SK, AC) would match almost every value case-insensitively: look for them as they are
    hits = series.str.contains_any(_LOWER_TRIGGERS, ascii_case_insensitive=True)
    with _values_lock:  # a fleet thread may register or forget values meanwhile
        exact = [trigger for trigger, _ in _CASED_TRIGGERS] + list(_secret_values)
    if exact:
        hits = hits | series.str.contains_any(exact)
    suspects = hits.fill_null(False).arg_true().to_list()
    arrow = series.to_arrow()
    if not suspects:
        return arrow
    texts = series.to_list()
    for index in suspects:
        texts[index] = redact_json_text(texts[index])
    return pa.array(texts, type=arrow.type)


__all__ = [
    "REDACTED",
    "TRIGGERS",
    "forget_secret_values",
    "is_secret_name",
    "redact_array",
    "redact_event",
    "redact_json_text",
    "redact_record",
    "redact_text",
    "redact_value",
    "register_secret_values",
]
