"""Layer 3's judgement: which names say their value is a secret, and which values are not secrets.

A name is *strong* (``DB_PASS``, ``GITHUB_TOKEN``, ``client_secret``, ``X-Api-Key``): its literal value
is redacted unless it is a placeholder, a reference or code. A name is *weak* (``STRIPE_KEY``,
``SESSION_COOKIE``, ``signing_salt``): only a value with the texture of a credential is redacted, since
``SESSION_KEY = "_auth_user_id"`` and ``STORAGE_KEY = 'vue-todomvc'`` are ordinary code.

Never redacted, whatever the name: references (``$VAR``, ``${VAR}``, ``$(cmd)``, ``%VAR%``, ``{{ x }}``,
``<TOKEN>``), placeholders (``TOKEN``, ``xxx``, ``****``, ``your-api-key``, ``changeme``, ``…EXAMPLE``)
and, for unquoted values, code (``user.password``, ``cast(…)``, ``None``, ``str``).
"""

from __future__ import annotations

import functools
import re

REDACTED = "[REDACTED]"

# The last part of a name that makes it a secret (``DB_PASS``, ``GITHUB_TOKEN``, ``client_secret`` …).
_SECRET_LAST = frozenset({
    "password", "passwd", "passphrase", "pwd", "pw", "pass", "secret", "token", "auth", "authorization",
    "credential", "credentials", "creds", "apikey", "secretkey", "privatekey", "accesskey", "accountkey", "sas",
    "pat", "jwt", "bearer",
})  # fmt: skip
# One-word names ending so (``PGPASSWORD``, ``accesstoken``).
_SECRET_ENDINGS = ("password", "passwd", "passphrase", "secret", "token", "apikey")
# ``<word>_key`` names that are secrets whatever the value looks like (``api_key``, ``AWS_SECRET_ACCESS_KEY`` …).
_KEY_QUALIFIERS = frozenset({
    "api", "access", "private", "account", "secret", "signing", "master", "encryption", "decryption", "shared",
    "client", "app", "service", "consumer", "auth", "ssh", "gpg", "pgp", "license", "webhook",
    "subscription", "admin", "deploy", "root",
})  # fmt: skip
# Last parts whose value is a secret only when it looks like one (``STRIPE_KEY``, ``SESSION_COOKIE``).
_WEAK_LAST = frozenset({
    "key", "cookie", "cookies", "salt", "sid", "session", "sessionid", "hmac", "signature", "sig", "login",
})  # fmt: skip
# Qualifiers that make a name about something public or structural (``public_key``, ``primaryKey``, ``cache_key``).
_NOT_SECRET_QUALIFIERS = frozenset({
    "public", "publishable", "primary", "foreign", "schema", "bucket", "cache", "partition", "sort", "routing",
    "object", "idempotency", "unique", "composite", "row", "lookup", "dict", "map", "site", "i18n",
    "translation", "storage", "local", "field", "column", "index",
})  # fmt: skip
# A last part that names something about a secret, not the secret (``password_validators``, ``TL_SECRETS_FILE``).
_NOT_SECRET_LAST = frozenset({
    "file", "files", "path", "paths", "dir", "name", "names", "type", "types", "count", "len", "length", "size",
    "limit", "ids", "url", "uri", "endpoint", "env", "var", "validator", "validators", "list", "prefix", "suffix",
    "format", "method", "mode", "policy", "field", "fields", "column", "header", "hash", "expires", "expiry",
    "expiration", "ttl", "min", "max", "index", "kind", "enabled", "required", "label", "help", "hint", "version",
    "rotation", "source", "provider", "scope", "scopes", "budget", "usage", "tokens", "class", "regex", "pattern",
    "reset", "changed", "strength", "timeout", "at", "manager", "store", "backend", "option", "domain", "secure",
    "samesite", "age", "id", "key_id", "keys", "cookies_enabled", "error", "errors", "message", "prompt", "input",
    "placeholder", "id_token_hint", "storage", "cache", "location", "region", "startswith", "endswith",
    "contains", "icontains", "exact", "iexact", "isnull", "in", "gt", "lt", "gte", "lte", "validation",
    "validated", "confirm", "confirmation", "complexity", "similarity", "lookup", "ref", "refs", "reference",
    "arn", "uris", "urls", "mount", "engine", "selector", "annotation",
})  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NAME_PARTS = re.compile(r"[^a-z0-9]+")


@functools.lru_cache(maxsize=8192)  # names repeat (event fields, env variables): decide each once
def name_strength(name: str) -> int:
    """2 when ``name`` says its value is a secret, 1 when it may be (a ``…_KEY``), 0 otherwise."""
    if not isinstance(name, str) or len(name) > 64:
        return 0
    parts = [p.rstrip("0123456789") for p in _NAME_PARTS.split(_CAMEL.sub("_", name).lower()) if p]
    parts = [p for p in parts if p]
    if not parts:
        return 0
    last = parts[-1]
    if last == "id" and parts[-3:-1] == ["private", "key"]:
        return 2  # a GCP service account's private_key_id
    if last in _NOT_SECRET_LAST or any(p in _NOT_SECRET_QUALIFIERS for p in parts[:-1]):
        return 0
    if last in _SECRET_LAST or last.endswith(_SECRET_ENDINGS):
        return 2
    if last == "key" and len(parts) > 1 and parts[-2] in _KEY_QUALIFIERS:
        return 2
    if any(p in ("password", "passwd", "secret") for p in parts[:-1]):
        return 2
    if last in _WEAK_LAST and len(parts) > 1:
        return 1
    if last == "key" or (last.endswith("key") and len(parts) == 1 and last not in ("monkey", "hockey", "turkey")):
        return 1  # ``KEY = "…"``, ``signingkey``: only a random-looking value says secret
    return 0


def is_secret_name(name: str) -> bool:
    """Whether a variable, option, header or JSON key name says its value is a secret.

    ``DB_PASS``, ``GITHUB_TOKEN``, ``SecretAccessKey``, ``private_key_id`` and ``X-Api-Key`` do;
    ``author_name``, ``new_tokens``, ``password_validators``, ``STRIPE_KEY`` (only its value can tell)
    and ``TL_SECRETS_FILE`` do not.
    """
    return name_strength(name) == 2


_PLACEHOLDER_WORDS = (
    "test", "example", "dummy", "fake", "placeholder", "changeme", "secret", "password", "your", "xxx", "sample",
    "redacted", "token", "insert", "replace", "here", "foo", "bar", "none", "mock", "todo", "fixme", "default",
    "pass", "key", "value", "my", "some", "user", "admin", "null", "empty", "hidden", "masked", "demo",
)  # fmt: skip
_WORDY = re.compile(r"[A-Za-z_ .-]*")
# ALL_CAPS metavariables (``TOKEN``, ``YOUR_API_KEY``), possibly closing a usage bracket.
_METAVAR = re.compile(r"[A-Z][A-Z_-]*[\]>)}]*")
# References to a value held elsewhere: shell and Make variables, command substitution, templates, env lookups.
_REFERENCE = re.compile(r"[\"']?(?:\$[{(\w]|%[A-Za-z_]\w*%|%\(|[{<\[(`]|@\w+@|\$\$\w)")
# Format strings and templates inside a value (``password='%s'``, ``token={}``): not a literal.
_TEMPLATE = re.compile(r"%[-#0 +]*\d*[sdrfx]|\{\d*\}|\{[a-z_]+\}|\$\{|\{\{")
_MASK = re.compile(r"[*xX•.#0_-]+")


def is_placeholder(value: str, shaped: bool = False) -> bool:
    """Values no one would leak: references, templates, masks, metavariables and wordy placeholders.

    Args:
        value: the candidate secret.
        shaped: it has a token format's shape (``AKIA…``), so an all-capitals word is not a metavariable.
    """
    value = value.strip()
    if len(value) < 4 or "[REDACTED]" in value or len(set(value)) <= 2:
        return True
    if value.endswith(("...", "…")) or _TEMPLATE.search(value):
        return True  # truncated, or a format string
    bare = value.strip("<>[](){}")
    if bare != value and (_METAVAR.fullmatch(bare) or bare.lower() in ("password", "token", "secret", "pass")):
        return True  # <PASSWORD>, [TOKEN], password>
    if _REFERENCE.match(value) or value.startswith("***"):
        return True  # $VAR, ${VAR}, $(cmd), %VAR%, {{ template }}, <your-key>
    if _MASK.fullmatch(value) or (not shaped and _METAVAR.fullmatch(value)):
        return True
    low = value.lower()
    if "example" in low or "xxxx" in low or "****" in low:
        return True
    body = value.split("_")[-1].split("-")[-1]  # ghp_xxxxxxxx…, sk-proj-00000000…
    if len(body) >= 8 and len(set(body.lower())) <= 2:
        return True
    return not shaped and _WORDY.fullmatch(value) is not None and any(w in low for w in _PLACEHOLDER_WORDS)


def looks_random(value: str) -> bool:
    """A value with the texture of a credential (digits, symbols or long mixed case), not a word or identifier."""
    if len(value) < 6:
        return False
    if any(c.isdigit() for c in value) and any(c.isalpha() for c in value):
        return True
    if any(c in "+/=!@#%^&*~" for c in value) and len(value) >= 8:
        return True
    if value.isdigit():
        return len(value) >= 8
    return len(value) >= 12 and any(c.isupper() for c in value) and any(c.islower() for c in value)


# An identifier or a dotted path of them, with no digits: names of things, not credentials.
_IDENTIFIER = re.compile(r"_*[A-Za-z]+(?:[_-][A-Za-z]+)*_*")
_CODE_WORDS = frozenset({
    "none", "null", "nil", "true", "false", "undefined", "self", "cls", "os", "this", "str", "string", "int", "bool",
    "bytes", "any", "number", "object", "text", "varchar", "char", "optional", "secretstr", "boolean", "required",
    "password", "secret", "token", "yes", "no", "on", "off", "env", "nullable", "sensitive", "await", "async",
    "lambda", "not", "yield", "new", "typeof", "function", "return", "static", "final", "const",
})  # fmt: skip
# Code: a dotted path of digit-free names (``user.password``, ``settings.SECRET_KEY``), a call, a collection.
_CODE = re.compile(r"[A-Za-z_]+(?:(?:\.|::|->)[A-Za-z_]+)+(?:\(.*|\[.*)?|[A-Za-z_][\w.]*[(\[].*|[\[{(].*")
_LOCATION = re.compile(r"[a-z][a-z0-9+.-]{1,20}://[^\s@]*|\.{0,2}/[\w./-]*|~/[\w./-]*")


def is_code(value: str) -> bool:
    """An unquoted value that reads as code: a name, a call, an attribute path, a collection, a type."""
    return value.lower() in _CODE_WORDS or _CODE.fullmatch(value) is not None


def _weak_value_is_secret(value: str) -> bool:
    """For a name that only may be a secret (``…_KEY``): random material, not a word, path or identifier."""
    digits = sum(c.isdigit() for c in value)
    letters = sum(c.isalpha() for c in value)
    if len(value) < 10 or not letters or _IDENTIFIER.fullmatch(value):
        return False
    mixed = any(c.isupper() for c in value) and any(c.islower() for c in value)
    return digits >= 2 or (len(value) >= 20 and mixed and digits >= 1)


def literal_is_secret(strength: int, value: str, *, quoted: bool, line_value: bool, env_style: bool) -> bool:
    """Whether the literal ``value`` of a name of ``strength`` is a secret to redact.

    Args:
        strength: :func:`name_strength` of the name.
        value: the value as written (without its quotes).
        quoted: it was quoted (a string literal, not a reference to something else).
        line_value: it is the rest of a ``key: value`` line (YAML, HTTP headers, properties).
        env_style: an ``UPPER_NAME=value`` assignment (shell, .env, Makefile).
    """
    value = value.strip()
    if strength == 0 or is_placeholder(value) or value.lower() in _CODE_WORDS:
        return False
    if _LOCATION.fullmatch(value) or re.fullmatch(r"[A-Za-z_]+(?:\.[A-Za-z_]+)+", value):
        return False  # a URL or path (credentials in URLs have their own rule), a module or settings path
    if not line_value and any(c.isspace() for c in value):
        return False  # prose or a message, not a credential (passphrases with spaces are not covered)
    if not quoted and is_code(value):
        return False
    if strength == 1:
        return _weak_value_is_secret(value)
    if quoted:
        return len(value) >= 5
    if " " in value and is_placeholder(value.split()[-1]):
        return False  # Bearer <token>, Basic $CREDENTIALS
    if env_style or line_value:
        return True
    return looks_random(value)
